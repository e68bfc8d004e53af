"""Per-layer statistics M_i and M_a (profiling/statistics.py), recovered from synthetic measurements."""

from __future__ import annotations

import numpy as np

from hybridplan.profiling.statistics import STATISTIC_QUANTITIES, build_statistics
from hybridplan.profiling.store import Measurement

Q = len(STATISTIC_QUANTITIES)


def additive(L, seed=0):
    """A synthetic model: per-layer contributions, and per-stage-boundary costs on the first layer."""
    rng = np.random.default_rng(seed)
    per_layer = rng.integers(1, 1000, size=(L, Q)).astype(float)
    boundary = rng.integers(1, 100, size=(L, Q)).astype(float)
    return lambda a, b: boundary[a] + per_layer[a:b].sum(axis=0)


def measurements(fn, spans, batch=8, micro=2):
    out = []
    for i, (a, b) in enumerate(spans):
        v = fn(a, b)
        out.append(Measurement(i, 0, 0, a, b, "none", 1, batch, micro, int(v[-1]), v[:-1]))
    return out


def test_additive_model_is_recovered_exactly():
    L = 6
    fn = additive(L)
    spans = [(l, l + 1) for l in range(L)] + [(l - 1, l + 1) for l in range(1, L)]
    stats = build_statistics(measurements(fn, spans), num_layers=L)
    for a in range(L):
        for b in range(a + 1, L + 1):
            np.testing.assert_allclose(stats.span(a, b), fn(a, b))
    table = stats.all_spans()
    for a in range(L):
        for b in range(a + 1, L + 1):
            np.testing.assert_allclose(table[a, b], fn(a, b))
    assert np.isnan(table[3, 2]).all()


def test_preferred_anchor_is_used():
    L = 5
    fn = additive(L, 1)
    # M_a(3) can come from [2..3]-[2..2] or from [0..3]-[0..2]; anchor(3) = 0 picks the latter
    spans = [(l, l + 1) for l in range(L)] + [(0, 2), (0, 3), (0, 4), (2, 4)]
    stats = build_statistics(measurements(fn, spans), num_layers=L, anchor=lambda l: 0)
    np.testing.assert_allclose(stats.ma[3], fn(0, 4) - fn(0, 3))


def test_missing_layer_only_hides_spans_that_need_it():
    L = 6
    fn = additive(L, 2)
    spans = [(l, l + 1) for l in range(L)] + [(l - 1, l + 1) for l in range(1, L) if l != 2]
    stats = build_statistics(measurements(fn, spans), num_layers=L)
    assert stats.span(1, 4) is None  # needs M_a(2)
    np.testing.assert_allclose(stats.span(3, 6), fn(3, 6))  # does not
    np.testing.assert_allclose(stats.span(2, 4), fn(2, 4))  # M_i(2) + M_a(3)
    table = stats.all_spans()
    assert np.isnan(table[0, 3]).all() and np.isfinite(table[3, 6]).all()


def test_measured_span_wins_and_rows_exported():
    L = 3
    fn = additive(L, 3)
    direct = fn(0, 3) + 5.0
    ms = measurements(fn, [(0, 1), (1, 2), (2, 3), (0, 2)])
    ms.append(Measurement(9, 0, 0, 0, 3, "none", 1, 8, 2, int(direct[-1]), direct[:-1]))
    stats = build_statistics(ms, num_layers=L)
    np.testing.assert_allclose(stats.span(0, 3), direct)
    rows = stats.rows()
    assert (0, "M_i", "static", float(fn(0, 1)[0])) in rows
    assert not any(r[0] == 0 and r[1] == "M_a" for r in rows)


def _vector(activation: float, forward: float, first: float, later: float) -> np.ndarray:
    v = np.zeros(Q)
    for name, value in (("static", 1000), ("activation", activation), ("gradient", 40), ("forward_transient", forward),
                        ("first_backward_transient", first), ("backward_transient", later), ("peak", 2000)):
        v[STATISTIC_QUANTITIES.index(name)] = value
    return v


def test_a_zero3_scenarios_composed_span_holds_at_least_its_measured_parts():
    """[Note: a composed span holds at least its measured parts]: a ZeRO-3 pair of layers measures the previous
    layer prefetched in its later backward (180, not the layers' 100), and a head after them adds less than it holds
    alone (the pair (1, 3) at 60): summed, the three layers' later backward would be 140, below what the pair (0, 2)
    holds once the head's 10 bytes of activations are freed."""
    spans = {(0, 1): _vector(10, 50, 100, 100), (1, 2): _vector(10, 50, 100, 100), (2, 3): _vector(10, 20, 30, 30),
             (0, 2): _vector(20, 70, 230, 180), (1, 3): _vector(20, 75, 120, 60)}
    ms = [Measurement(i, 0, 0, a, b, "none", 1, 8, 2, int(v[-1]), v[:-1]) for i, ((a, b), v) in enumerate(spans.items())]
    plain, sharded = (build_statistics(ms, num_layers=3, sharded=s) for s in (False, True))
    later, forward = STATISTIC_QUANTITIES.index("backward_transient"), STATISTIC_QUANTITIES.index("forward_transient")
    first = STATISTIC_QUANTITIES.index("first_backward_transient")
    summed = plain.span(0, 3)
    assert summed is not None and summed[later] == 100 + (180 - 100) + (60 - 100)
    held = sharded.span(0, 3)
    assert held is not None
    assert held[later] == 180 - 10  # the pair (0, 2), the head's activations freed
    assert held[forward] == max(summed[forward], 70, 10 + 75)  # the pair (1, 3) after layer 0's activations
    assert held[first] == summed[first]  # position-dependent: left as composed
    np.testing.assert_array_equal(sharded.all_spans()[0, 3], held)
    for a, b in spans:  # measured spans stay as measured
        np.testing.assert_array_equal(sharded.span(a, b), spans[a, b])


def test_a_zero3_scenario_composes_its_backwards_after_a_backward_and_floors_with_those_after_a_forward():
    """[Note: a ZeRO-3 stage's steady backward] (profiling/execution.py): a ZeRO-3 span run with a forward before a
    later backward holds the prefetched layer there (the pair (0, 2): 180) and not in the later backward after a
    backward (120). Sums of M_a of the first kind would count a prefetched layer per layer, so M_i/M_a are formed
    from the second, and a composed span is floored by its measured parts' first kind; measured spans keep it. The
    table after a backward (what ZeRO-2's backwards that find the layers resharded hold) has the second kind."""
    spans = {(0, 1): (_vector(10, 50, 100, 100), 100), (1, 2): (_vector(10, 50, 100, 100), 100),
             (2, 3): (_vector(10, 20, 30, 30), None), (0, 2): (_vector(20, 70, 230, 180), 120),
             (1, 3): (_vector(20, 75, 120, 120), 60)}
    ms = [Measurement(i, 0, 0, a, b, "none", 1, 8, 2, int(v[-1]), v[:-1], None, after)
          for i, ((a, b), (v, after)) in enumerate(spans.items())]
    later = STATISTIC_QUANTITIES.index("backward_transient")
    sharded, plain = build_statistics(ms, num_layers=3, sharded=True), build_statistics(ms, num_layers=3)
    assert sharded.mi[0, later] == 100 and sharded.ma[1, later] == 120 - 100 and sharded.ma[2, later] == 60 - 100
    composed = sharded.span(0, 3)
    assert composed is not None and composed[later] == max(100 + 20 - 40, 180 - 10, 120)  # the pair (0, 2) sets it
    resharded = sharded.all_spans(after_backward=True)
    assert resharded[0, 3, later] == max(100 + 20 - 40, 120 - 10, 60)
    assert resharded[0, 2, later] == 120 and sharded.all_spans()[0, 2, later] == 180
    summed = plain.span(0, 3)  # other scenarios: as measured, the later backward is the largest
    assert summed is not None and summed[later] == 100 + (180 - 100) + (120 - 100)
    np.testing.assert_array_equal(plain.all_spans(after_backward=True), plain.all_spans())
