"""The cuBLAS workspaces in the per-layer statistics (profiling/statistics.py [Note: workspaces are per device]).

Measurements are built by hand from the workspace rules of runtime/gpu_memory.py ([Note: cuBLAS workspaces]): a
bias ``Linear`` holds, from its first iteration on, the forward thread's 32 MiB cuBLAS and 1 MiB cuBLASLt
workspaces and the backward thread's 32 MiB cuBLAS one; a ``ReLU`` runs no matmul and needs none; a span holds
each workspace once, whichever of its layers needed it. Expected values are sums of the hand-made per-layer bytes
plus that union, never read back from the code under test.
"""

from __future__ import annotations

import numpy as np

from hybridplan.profiling.quantities import QUANTITIES
from hybridplan.profiling.statistics import STATISTIC_QUANTITIES, build_statistics
from hybridplan.profiling.store import Measurement

MIB = 2**20
LINEAR = {"cublas/forward": 32 * MIB, "cublaslt/forward": 1 * MIB, "cublas/backward": 32 * MIB}
LAYERS = [LINEAR, {}, LINEAR, {}, {}, LINEAR]  # Linear, ReLU, Linear, ReLU, ReLU, Linear
ANCHOR = {1: 0, 2: 1, 3: 2, 4: 2, 5: 2}.__getitem__
"""The neighbour each layer's M_a is measured against (any anchor the campaign may have chosen)."""
STATIC = [1000 + 100 * layer for layer in range(len(LAYERS))]
"""Each layer's own parameter bytes (made up): additive, as static is."""
ACTIVATION = [10 * (layer + 1) for layer in range(len(LAYERS))]


def _spans() -> list[tuple[int, int]]:
    """What the campaign measures for this anchor: every layer alone, and each chain with and without its layer."""
    spans = {(layer, layer + 1) for layer in range(len(LAYERS))}
    for layer in range(1, len(LAYERS)):
        spans |= {(ANCHOR(layer), layer), (ANCHOR(layer), layer + 1)}
    return sorted(spans)


def _held(start: int, stop: int) -> dict[str, int]:
    union: dict[str, int] = {}
    for layer in LAYERS[start:stop]:
        union.update(layer)
    return union


def _measurement(start: int, stop: int, *, recorded: bool) -> Measurement:
    q = np.zeros(len(QUANTITIES))
    held = sum(_held(start, stop).values())
    q[QUANTITIES.index("static")] = sum(STATIC[start:stop]) + held
    q[QUANTITIES.index("activation")] = sum(ACTIVATION[start:stop])
    peak = int(q.sum())
    return Measurement(0, start, 0, start, stop, "none", 1, 8, 4, peak, q,
                       _held(start, stop) if recorded else None)


def _expected(start: int, stop: int) -> tuple[float, float, float]:
    """(static, activation, peak) of the stage by hand: its layers' bytes plus each workspace once."""
    held = 65 * MIB if any(LAYERS[start:stop]) else 0
    static = sum(STATIC[start:stop]) + held
    activation = sum(ACTIVATION[start:stop])
    return static, activation, static + activation


def _columns(v: np.ndarray) -> tuple[float, float, float]:
    return tuple(float(v[STATISTIC_QUANTITIES.index(q)]) for q in ("static", "activation", "peak"))  # type: ignore[return-value]


def test_a_composed_stage_holds_its_layers_workspaces_once():
    """[3, 6) (ReLU, ReLU, Linear: its Linear's M_a comes from the chain at 2, which had already run a Linear) lost
    them, and [0, 3) (Linear, ReLU, Linear: layer 2's M_a comes from the chain at 1, which had not) counted them
    twice; both now hold 65 MiB once, as does every other stage, composed or measured."""
    stats = build_statistics([_measurement(a, b, recorded=True) for a, b in _spans()], num_layers=6, anchor=ANCHOR)
    assert (0, 3) not in stats.spans and (3, 6) not in stats.spans  # composed, not measured
    assert _columns(stats.span(3, 6)) == _expected(3, 6) and _expected(3, 6)[0] == 65 * MIB + 1300 + 1400 + 1500
    assert _columns(stats.span(0, 3)) == _expected(0, 3) and _expected(0, 3)[0] == 65 * MIB + 1000 + 1100 + 1200
    table = stats.all_spans()
    for start in range(6):
        for stop in range(start + 1, 7):
            assert _columns(stats.span(start, stop)) == _expected(start, stop), (start, stop)
            assert _columns(table[start, stop]) == _expected(start, stop), (start, stop)
    assert _columns(stats.mi[3]) == (1300, 40, 1340)  # the per-layer rows hold no workspace
    assert _columns(stats.ma[5]) == (1500, 60, 1560)


def test_without_recorded_workspaces_the_composition_is_unchanged():
    """A CPU, a real CUDA device or a database written before the table: nothing is taken out, so the stages
    compose as they did (here, by hand: [3, 6) = M_i(3) + M_a(4) + M_a(5) with both M_a differences of spans
    that hold the same 65 MiB, so without them; [0, 3) with them twice). One measurement without its record is
    enough to take nothing out."""
    old = build_statistics([_measurement(a, b, recorded=False) for a, b in _spans()], num_layers=6, anchor=ANCHOR)
    assert old.workspaces is None
    assert _columns(old.span(3, 6)) == (1300 + 1400 + 1500, 40 + 50 + 60, 1300 + 1400 + 1500 + 40 + 50 + 60)
    assert _columns(old.span(0, 3))[0] == 1000 + 1100 + 1200 + 2 * 65 * MIB
    mixed = [_measurement(a, b, recorded=(a, b) != (2, 4)) for a, b in _spans()]
    stats = build_statistics(mixed, num_layers=6, anchor=ANCHOR)
    assert stats.workspaces is None and np.array_equal(stats.all_spans(), old.all_spans(), equal_nan=True)


def test_a_layer_whose_own_span_was_not_measured_takes_its_chains_workspaces():
    """Layer 4 (a ReLU) measured only inside its chain [2, 5), which holds layer 2's Linear: it is given that
    chain's workspaces (a superset), so a stage starting at 3 counts them even without a Linear of its own."""
    ms = [_measurement(a, b, recorded=True) for a, b in _spans() if (a, b) != (4, 5)]
    stats = build_statistics(ms, num_layers=6, anchor=ANCHOR)
    assert stats.workspaces is not None and stats.workspaces[4] == LINEAR and stats.workspaces[3] == {}
    assert _columns(stats.span(3, 5))[0] == 1300 + 1400 + 65 * MIB


def test_a_gpt_stage_is_unchanged():
    """GPT's layers: an embedding (no matmul: ``embedding`` forward, ``embedding_dense_backward``), eight blocks of
    bias Linears (65 MiB) and a head without bias (``mm`` on both threads: 64 MiB, no cuBLASLt), chains of five as
    the campaign measures them. The first chain's ``M_a(1)`` adds the 65 MiB, every later layer's chain already
    holds them (the head's 64 MiB are a subset), every stage holds one 65 MiB (the head alone 64 MiB): the old
    composition was already right, and the new one gives the same bytes for every span."""
    from hybridplan.profiling.statistics import anchor_of

    head = {"cublas/forward": 32 * MIB, "cublas/backward": 32 * MIB}
    layers = [{}] + [LINEAR] * 8 + [head]
    anchor = anchor_of(5)
    spans = {(layer, layer + 1) for layer in range(10)}
    for layer in range(1, 10):
        spans |= {(anchor(layer), layer), (anchor(layer), layer + 1)}

    def measured(start: int, stop: int, recorded: bool) -> Measurement:
        union: dict[str, int] = {}
        for layer in layers[start:stop]:
            union.update(layer)
        q = np.zeros(len(QUANTITIES))
        q[0] = 4096 * (stop - start) + sum(union.values())
        return Measurement(0, start, 0, start, stop, "none", 1, 8, 4, int(q[0]), q, union if recorded else None)

    new = build_statistics([measured(a, b, True) for a, b in sorted(spans)], num_layers=10, anchor=anchor)
    old = build_statistics([measured(a, b, False) for a, b in sorted(spans)], num_layers=10, anchor=anchor)
    assert new.workspaces is not None and old.workspaces is None
    assert np.array_equal(new.all_spans(), old.all_spans(), equal_nan=True)
    for start in range(10):
        for stop in range(start + 1, 11):
            held = 0 if stop == 1 else 64 * MIB if start == 9 else 65 * MIB
            assert new.span(start, stop)[0] == 4096 * (stop - start) + held, (start, stop)


def test_the_database_keeps_each_devices_workspaces(tmp_path):
    """Recorded per measured device (one row ``("", 0)`` for a device that holds none); a measurement without them
    (a CPU) and a database written before the table read back as None."""
    import sqlite3

    from hybridplan.profiling.store import ProfileStore

    def row(device: int, workspaces: dict[str, int] | None) -> dict:
        return {"device": device, "stage": device, "start": device, "stop": device + 1, "kind": "none", "degree": 1,
                "batch_size": 8, "microbatch_size": 4, "peak": 1, "quantities": np.zeros(len(QUANTITIES)),
                "timeline": [], "workspaces": workspaces}

    db = tmp_path / "p.sqlite"
    with ProfileStore(db) as store:
        store.record_run(key="a", scenario="pipeline", batch_size=8, plan={}, status="ok", reason=None, wall_seconds=1.0,
                         measurements=[row(0, LINEAR), row(1, {}), row(2, None)])
        assert [m.workspaces for m in store.measurements()] == [LINEAR, {}, None]
    with sqlite3.connect(db) as old:
        old.execute("DROP TABLE workspaces")
    with ProfileStore(db, create=False) as store:
        assert [m.workspaces for m in store.measurements()] == [None, None, None]
