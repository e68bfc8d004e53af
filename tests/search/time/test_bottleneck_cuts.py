"""The fast stage cut (search/time/bottleneck_cuts.py) against AMP's dynamic program (the reference it replaced,
search/time/stage_cuts.py) and, with the gradient sync or within memory windows, against brute force over every
cut."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.plan import StagePlan
from hybridplan.predict.communication import sync_seconds
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from hybridplan.search.time import bottleneck_cuts, cut_problem, window_minima
from hybridplan.search.time.bottleneck_cuts import bottleneck_assignment, fitting_starts
from hybridplan.search.time.sync_costs import SyncCosts, range_sums
from hybridplan.search.time.stage_cuts import Assignment, amp_layer_assignment, assignment_objective
from tests.search.time.util import TOY_CLUSTER, all_cuts


def _costs(data: st.DataObject, num_layers: int, integers: bool) -> np.ndarray:
    # integers make many cuts tie exactly (the hard case for a search that prunes); floats make them distinct
    element = st.integers(0, 9).map(float) if integers else st.floats(0.0, 10.0, allow_nan=False, width=32)
    return np.array(data.draw(st.lists(element, min_size=num_layers, max_size=num_layers)), dtype=float)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 12), gas=st.integers(1, 9), stage_dependent=st.booleans(),
       floors=st.sampled_from([None, 0.5, 3.0]), integers=st.booleans(), sweep=st.booleans())
def test_same_optimum_as_amps_program(data: st.DataObject, num_layers: int, gas: int, stage_dependent: bool,
                                      floors: float | None, integers: bool, sweep: bool) -> None:
    # sweep: the batched sweep of every candidate from the start (module note), instead of the boxes
    k = data.draw(st.integers(1, num_layers))
    base = _costs(data, num_layers, integers)
    stage_costs = [_costs(data, num_layers, integers) if stage_dependent else base for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) / 4 for _ in range(k - 1)]
    cut_floors = None if floors is None else [c * floors for c in cut_costs]
    reference = amp_layer_assignment(stage_costs, cut_costs, gas, cut_floors)
    with pytest.MonkeyPatch.context() as patch:
        if sweep:
            patch.setattr(bottleneck_cuts, "SWEEP_AFTER", 0)
        found = bottleneck_assignment(stage_costs, cut_costs, gas, cut_floors)
    assert found.objective == pytest.approx(reference.objective, rel=1e-9, abs=1e-12)
    assert found.objective == pytest.approx(assignment_objective(found.boundaries, stage_costs, cut_costs, gas, cut_floors))
    assert found.boundaries[0] == 0 and found.boundaries[-1] == num_layers and len(found.boundaries) == k + 1
    assert all(a < b for a, b in zip(found.boundaries, found.boundaries[1:]))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 10), gas=st.integers(1, 9), integers=st.booleans(),
       floors=st.booleans(), latency=st.booleans())
def test_with_the_sync_the_least_total_of_every_cut(data: st.DataObject, num_layers: int, gas: int, integers: bool,
                                                    floors: bool, latency: bool) -> None:
    # latency: each stage's sync also pays seconds per parameter tensor (its ring steps' latency)
    k = data.draw(st.integers(1, num_layers))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) / 4 for _ in range(k - 1)]
    cut_floors = [c * 2 for c in cut_costs] if floors else None
    nbytes = _costs(data, num_layers, integers)
    tensors = np.array(data.draw(st.lists(st.integers(0, 50), min_size=num_layers, max_size=num_layers)), dtype=float)
    factors = tuple(data.draw(st.sampled_from([0.0, 0.25, 1.0, 3.0])) for _ in range(k))
    latencies = tuple(data.draw(st.sampled_from([0.0, 0.1, 0.5])) for _ in range(k))
    sync = (SyncCosts(range_sums(nbytes), factors, range_sums(tensors), latencies) if latency
            else SyncCosts(range_sums(nbytes), factors))
    found = bottleneck_assignment(stage_costs, cut_costs, gas, cut_floors, sync)

    def total(b: tuple[int, ...]) -> float:  # the objective written out again: eq. 5, floors, plus the slowest sync
        t = [float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)]
        u = t + ([cut_floors[j - 1][b[j] - 1] for j in range(1, k)] if cut_floors else [])
        w = [factors[j] * float(nbytes[b[j]:b[j + 1]].sum())
             + (latencies[j] * float(tensors[b[j]:b[j + 1]].sum()) if latency else 0.0) for j in range(k)]
        return (gas - 1 or 1e-9) * max(u) + sum(t) + sum(cut_costs[j - 1][b[j] - 1] for j in range(1, k)) + max(w)

    best = min(total(b) for b in all_cuts(num_layers, k))
    assert total(found.boundaries) == pytest.approx(best, rel=1e-9, abs=1e-12)
    # the objective reported is eq. 5's (no tie-break weight with one micro-batch) plus the sync
    eq5 = assignment_objective(found.boundaries, stage_costs, cut_costs, gas, cut_floors)
    assert found.objective == pytest.approx(eq5 + sync.seconds(found.boundaries), rel=1e-12)


def test_the_round_trip_of_1f1b_decides_the_cut() -> None:
    """Three layers of 9.3, 7.5 and 5.1 ms on two stages, boundaries of 15 and 6.2 ms (both ways), gas 16; 1F1B
    holds 2 micro-batches in flight. Cut (0, 1, 3): stages 9.3 and 12.6, round trip 21.9 + 15 = 36.9, period
    max(12.6, 7.5, 36.9 / 2) = 18.45: 15 x 18.45 + 36.9 = 313.65. Cut (0, 2, 3): stages 16.8 and 5.1, round trip
    28.1, period max(16.8, 3.1, 14.05) = 16.8: 15 x 16.8 + 28.1 = 280.1. Without the round trip (eq. 5, GPipe) the
    first costs 15 x 12.6 + 36.9 = 225.9 and wins; the cut once left the round trip out and took it under 1F1B too."""
    stage_costs = [np.array([9.3, 7.5, 5.1])] * 2
    cut_costs = [np.array([15.0, 6.2])]
    floors = [cut_costs[0] / 2]
    with_trip = bottleneck_assignment(stage_costs, cut_costs, 16, floors, in_flight=2)
    assert with_trip.boundaries == (0, 2, 3) and with_trip.objective == pytest.approx(280.1, rel=1e-12)
    without = bottleneck_assignment(stage_costs, cut_costs, 16, floors)
    assert without.boundaries == (0, 1, 3) and without.objective == pytest.approx(225.9, rel=1e-12)


# ------------------------------------------------------------------------------------- within memory windows
def _memory(data: st.DataObject, num_layers: int, k: int, monotone: bool) -> list[np.ndarray]:
    """Per stage, whether each range ``[a, i)`` fits (``L x (L + 1)``): a synthetic stage memory, a fixed part
    plus the range's layer bytes (monotone in the range: a superset needs more), or (not ``monotone``) random
    coin flips, against a capacity drawn per stage."""
    out = []
    for _ in range(k):
        if monotone:
            size = np.concatenate(([0.0], np.cumsum(_costs(data, num_layers, True))))
            need = data.draw(st.floats(0.0, 5.0)) + size[None, :] - size[:, None]
            out.append(need[:num_layers] <= data.draw(st.floats(0.0, 40.0)))
        else:
            flips = data.draw(st.lists(st.booleans(), min_size=num_layers * (num_layers + 1),
                                       max_size=num_layers * (num_layers + 1)))
            out.append(np.array(flips).reshape(num_layers, num_layers + 1))
    return out


def _period_and_fill(b: tuple[int, ...], stage_costs: list[np.ndarray], cut_costs: list[np.ndarray], gas: int,
                     in_flight: int) -> tuple[float, float]:
    """A cut's period with the round trip of 1F1B (time_model's [Note: the round trip of 1F1B]), written out again:
    at least ``(sum t + sum e) / in_flight``; and that sum."""
    k = len(stage_costs)
    t = [float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)]
    e = [float(cut_costs[j - 1][b[j] - 1]) for j in range(1, k)]
    return max(t + [x / 2 for x in e] + ([(sum(t) + sum(e)) / in_flight] if in_flight < gas else [])), sum(t) + sum(e)


def _window_allows(fits: np.ndarray, a: int, i: int) -> bool:
    """The window of [Note: cutting within memory] written out again: ``[a, i)`` and every shorter range ending
    at ``i`` fit."""
    return all(fits[b, i] for b in range(a, i))


def _assert_least_of_fitting(found: Assignment | None, fits: list[np.ndarray],
                             objective: Callable[[tuple[int, ...]], float], monotone: bool) -> None:
    """``found`` is the least ``objective`` of every cut whose every stage fits (not ``monotone``: whose every
    stage's range lies in its window), None where there is none."""
    k, num_layers = len(fits), fits[0].shape[0]
    allowed = [b for b in all_cuts(num_layers, k) if all(fits[j][b[j], b[j + 1]] for j in range(k))]
    if not monotone:
        allowed = [b for b in allowed if all(_window_allows(fits[j], b[j], b[j + 1]) for j in range(k))]
    if not allowed:
        assert found is None
        return
    assert found is not None and found.boundaries in allowed
    assert objective(found.boundaries) == pytest.approx(min(map(objective, allowed)), rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 9), gas=st.integers(1, 9), integers=st.booleans(),
       with_sync=st.booleans(), sweep=st.booleans(), memory=st.sampled_from([None, "monotone", "any"]))
def test_with_the_round_trip_the_least_time_of_every_cut(data: st.DataObject, num_layers: int, gas: int,
                                                         integers: bool, with_sync: bool, sweep: bool,
                                                         memory: str | None) -> None:
    """Against every cut, timed by the pipeline term written out again with the round trip of 1F1B
    (time_model's [Note: the round trip of 1F1B]): a period of at least (sum t + sum e) / in_flight. With
    ``memory``, within memory windows ([Note: cutting within memory]) against every cut whose every stage fits
    (memory "monotone" in the range: the fastest that fits, exactly; "any": among the cuts in the windows), None
    where none does."""
    k = data.draw(st.integers(1, num_layers))
    in_flight = data.draw(st.integers(1, k + 1))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) * data.draw(st.sampled_from([0.25, 1.0, 4.0])) for _ in range(k - 1)]
    cut_floors = [c / 2 for c in cut_costs]
    sync = SyncCosts(range_sums(_costs(data, num_layers, integers)),
                     tuple(data.draw(st.sampled_from([0.0, 0.25, 1.0])) for _ in range(k))) if with_sync else None
    with pytest.MonkeyPatch.context() as patch:
        if sweep:
            patch.setattr(bottleneck_cuts, "SWEEP_AFTER", 0)
        fits = _memory(data, num_layers, k, memory == "monotone") if memory else None
        starts = None if fits is None else [fitting_starts(f) for f in fits]
        found = bottleneck_assignment(stage_costs, cut_costs, gas, cut_floors, sync, in_flight, starts=starts)

    def total(b: tuple[int, ...], tie: float = 1e-9) -> float:
        period, fill = _period_and_fill(b, stage_costs, cut_costs, gas, in_flight)
        w = [sync.factors[j] * float(sync.range_bytes[b[j], b[j + 1]]) for j in range(k)] if sync else [0.0]
        return (gas - 1 or tie) * period + fill + max(w)

    if fits is None:
        assert found is not None
        assert total(found.boundaries) == pytest.approx(min(map(total, all_cuts(num_layers, k))), rel=1e-9, abs=1e-12)
    else:
        _assert_least_of_fitting(found, fits, total, memory == "monotone")
    if found is not None:
        assert found.objective == pytest.approx(total(found.boundaries, 0.0), rel=1e-12, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 9), gas=st.integers(1, 9), integers=st.booleans(),
       latency=st.booleans(), memory=st.sampled_from([None, "monotone"]), scale=st.sampled_from([0.01, 0.3, 1.0, 5.0]),
       flush=st.booleans())
def test_with_the_optimizer_step_the_least_time_of_every_cut(data: st.DataObject, num_layers: int, gas: int,
                                                             integers: bool, latency: bool, memory: str | None,
                                                             scale: float, flush: bool) -> None:
    """[Note: the optimizer step's maximum]: the pipeline term with the round trip, the slowest sync and the slowest
    optimizer step (a third maximum, seconds per parameter byte per stage: ``scale`` from negligible to dominant),
    written out again: the least over every cut (within memory windows: over every cut whose stages all fit).
    Without a ``flush`` (PipeDream-2BW: [Note: 2BW's cut with the sync and the step]) the pipeline term is ``gas``
    periods, no fill."""
    from hybridplan.search.time.step_costs import StepCosts

    k = data.draw(st.integers(1, num_layers))
    in_flight = data.draw(st.integers(1, k + 1))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) for _ in range(k - 1)]
    cut_floors = [c / 2 for c in cut_costs]
    nbytes, tensors = _costs(data, num_layers, integers), _costs(data, num_layers, True)
    factors = tuple(data.draw(st.sampled_from([0.0, 0.25, 1.0])) for _ in range(k))
    latencies = tuple(data.draw(st.sampled_from([0.0, 0.1, 0.5])) for _ in range(k)) if latency else None
    sync = SyncCosts(range_sums(nbytes), factors, range_sums(tensors) if latency else None, latencies)
    rates = tuple(scale * data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(k))
    step = StepCosts(range_sums(nbytes), rates)
    fits = _memory(data, num_layers, k, True) if memory else None
    starts = None if fits is None else [fitting_starts(f) for f in fits]
    found = bottleneck_assignment(stage_costs, cut_costs, gas, cut_floors, sync, in_flight, starts=starts, step=step,
                                  flush=flush)

    def total(b: tuple[int, ...], tie: float = 1e-9) -> float:
        period, fill = _period_and_fill(b, stage_costs, cut_costs, gas, in_flight)
        w = [factors[j] * float(nbytes[b[j]:b[j + 1]].sum())
             + (latencies[j] * float(tensors[b[j]:b[j + 1]].sum()) if latencies else 0.0) for j in range(k)]
        r = [rates[j] * float(nbytes[b[j]:b[j + 1]].sum()) for j in range(k)]
        pipe = (gas - 1 or tie) * period + fill if flush else gas * period
        return pipe + max(w) + max(r)

    if fits is None:
        assert found is not None
        assert total(found.boundaries) == pytest.approx(min(map(total, all_cuts(num_layers, k))), rel=1e-9, abs=1e-9)
    else:
        _assert_least_of_fitting(found, fits, total, True)
    if found is not None:
        assert found.objective == pytest.approx(total(found.boundaries, 0.0), rel=1e-9, abs=1e-9)


def test_the_optimizer_step_moves_the_cut_by_hand() -> None:
    """Two stages, layers of 1 s each, parameter bytes 0, 8, 0, 0, gas 2 (GPipe): without the step the balanced
    cut (0, 2, 4) takes 1 x 2 + 4 = 6 s. Stage 0 steps 1 s per byte, stage 1 nothing (rates 1 and 0): the
    balanced cut then steps layer 1's 8 bytes in 8 s, 14 s in all, and so does (0, 3, 4) (1 x 3 + 4 + 8 = 15 s);
    (0, 1, 4) moves layer 1 to stage 1: 1 x 3 + 4 + 0 = 7 s, the least."""
    from hybridplan.search.time.step_costs import StepCosts

    ones, no_links = [np.ones(4)] * 2, [np.zeros(4)]
    assert bottleneck_assignment(ones, no_links, 2).boundaries == (0, 2, 4)
    found = bottleneck_assignment(ones, no_links, 2, step=StepCosts(range_sums([0.0, 8.0, 0.0, 0.0]), (1.0, 0.0)))
    assert found.boundaries == (0, 1, 4) and found.objective == pytest.approx(7.0)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 9), gas=st.integers(1, 9), integers=st.booleans())
def test_min_max_with_the_round_trip_the_least_period_of_every_cut(data: st.DataObject, num_layers: int, gas: int,
                                                                   integers: bool) -> None:
    """PipeDream-2BW's period with the round trip (time_model's [Note: the round trip of 1F1B]): max(max t, max e / 2,
    (sum t + sum e) / in_flight) written out again; the least over every cut, the fill breaking ties."""
    from hybridplan.search.time.period_cut import bottleneck_min_max

    k = data.draw(st.integers(1, num_layers))
    in_flight = data.draw(st.integers(1, k + 1))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) * data.draw(st.sampled_from([0.25, 1.0, 4.0])) for _ in range(k - 1)]
    found = bottleneck_min_max(stage_costs, [c / 2 for c in cut_costs], cut_costs, gas, in_flight)

    def period_and_fill(b: tuple[int, ...]) -> tuple[float, float]:
        t = [float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)]
        e = [float(cut_costs[j - 1][b[j] - 1]) for j in range(1, k)]
        return max(t + [x / 2 for x in e] + ([(sum(t) + sum(e)) / in_flight] if in_flight < gas else [])), sum(t) + sum(e)

    period, fill = period_and_fill(found.boundaries)
    best = min(period_and_fill(b)[0] for b in all_cuts(num_layers, k))
    assert period == pytest.approx(best, rel=1e-9, abs=1e-12) and found.objective == pytest.approx(period, rel=1e-12)
    # the fill breaks ties (a weight of 1e-9 of it: a period within that of the best may win by a smaller fill)
    assert fill <= min(f for p, f in map(period_and_fill, all_cuts(num_layers, k)) if p <= period * (1 + 1e-9) + 1e-12) + 1e-9


def test_a_long_chain_matches_the_reference() -> None:
    # 40 layers of a transformer-like chain (heavy first and last layers, 5% jitter) on 2 to 8 stages: the
    # pruned search must still reach AMP's optimum where its incumbents and bounds are far from it
    rng = np.random.default_rng(3)
    layers = np.concatenate(([4.0], 2.0 * (1 + 0.05 * rng.standard_normal(38)), [6.0]))
    for k in (2, 3, 5, 8):
        for gas in (1, 2, 16):
            stage_costs = [layers * (1 + 0.3 * (j % 2)) for j in range(k)]  # every other stage slower
            cut_costs = [np.full(40, 0.05 * (1 + j % 3)) for j in range(k - 1)]
            floors = [c * 10 for c in cut_costs]
            reference = amp_layer_assignment(stage_costs, cut_costs, gas, floors)
            found = bottleneck_assignment(stage_costs, cut_costs, gas, floors)
            assert found.objective == pytest.approx(reference.objective, rel=1e-9), (k, gas)


def test_range_sums_count_shared_parameters_once_per_stage_as_the_time_model_does() -> None:
    # a tied embedding (layers 0 and 4 share "emb"), on a 2-replica data-parallel stage of every range
    sizes = [3e6, 1e6, 2e6, 1e6, 3e6]
    groups = ["emb", None, None, None, "emb"]
    profile = TimeProfile(
        model="toy",
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1.0, parameter_bytes=b, shared_parameters=s)
                     for i, (b, s) in enumerate(zip(sizes, groups))),
        timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=(1e-3,) * 5,
                             backward_s=(2e-3,) * 5),),
    )
    r = range_sums(sizes, groups)
    # by hand: 3 + 1 + 2 + 1 (+ 3 of the tied layer, already counted) = 7 MB; without layer 0 the tie is gone
    assert r[0, 5] == 7e6 and r[0, 4] == 7e6 and r[1, 5] == 7e6 and r[1, 4] == 4e6 and r[2, 2] == 0.0
    factor = 2 * (2 - 1) / (2 * TOY_CLUSTER.intra_node_bandwidth)  # ring all-reduce on 2 devices of node 0
    for a in range(5):
        for b in range(a + 1, 6):
            stage = StagePlan.of(a, b, (0, 1), data_degree=2, tensor_degree=1)
            assert factor * r[a, b] == pytest.approx(sync_seconds(profile, TOY_CLUSTER, stage))


def test_the_sync_costs_with_latency_are_the_time_models_sync_of_every_range() -> None:
    # the tied embedding again, its layers holding 2, 4, 3, 4 and 2 parameter tensors (layer 1's not recorded: the
    # time model counts 1), on a 2-replica data-parallel stage whose links take 20 us per message
    from hybridplan.predict.communication import sync_latency_per_tensor
    from hybridplan.search.time.strategy_cut import parameter_range_bytes, parameter_range_tensors

    sizes, tensors = [3e6, 1e6, 2e6, 1e6, 3e6], [2, None, 3, 4, 2]
    groups = ["emb", None, None, None, "emb"]
    profile = TimeProfile(
        model="toy",
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1.0, parameter_bytes=b, shared_parameters=s,
                               parameter_tensors=c) for i, (b, s, c) in enumerate(zip(sizes, groups, tensors))),
        timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=(1e-3,) * 5,
                             backward_s=(2e-3,) * 5),),
    )
    cluster = TOY_CLUSTER.with_latencies(2e-5, 1e-3)
    r = parameter_range_tensors(profile)
    # by hand: 2 + 1 + 3 + 4 (+ 2 of the tied layer, already counted) = 10; without layer 0 the tie is gone
    assert r[0, 5] == 10 and r[1, 5] == 10 and r[1, 4] == 8 and r[4, 5] == 2 and r[2, 2] == 0
    factor = 2 * (2 - 1) / (2 * TOY_CLUSTER.intra_node_bandwidth)  # ring all-reduce on 2 devices of node 0
    latency = 2 * (2 - 1) * 2e-5  # a ring of 2 steps of 20 us per tensor
    assert sync_latency_per_tensor(profile, cluster, StagePlan.of(0, 0, (0, 1), data_degree=2)) == pytest.approx(latency)
    costs = SyncCosts(parameter_range_bytes(profile), (factor,), r, (latency,))
    for a in range(5):
        for b in range(a + 1, 6):
            stage = StagePlan.of(a, b, (0, 1), data_degree=2, tensor_degree=1)
            assert costs.seconds((a, b)) == pytest.approx(sync_seconds(profile, cluster, stage), rel=1e-12)
    with pytest.raises(PlanError, match="together"):
        SyncCosts(r, (factor,), r)


def test_rejects_negative_layer_times_and_too_many_stages() -> None:
    with pytest.raises(PlanError, match="non-negative"):
        bottleneck_assignment([np.array([1.0, -1.0])] * 2, [np.zeros(2)], 4)
    with pytest.raises(PlanError, match="cannot cut 2 layers into 3"):
        bottleneck_assignment([np.ones(2)] * 3, [np.zeros(2)] * 2, 4)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 10), integers=st.booleans(), own_costs=st.booleans())
def test_min_max_same_period_and_fill_as_the_reference(data: st.DataObject, num_layers: int, integers: bool,
                                                       own_costs: bool) -> None:
    from hybridplan.search.time.period_cut import bottleneck_min_max
    from hybridplan.search.time.stage_cuts import min_max_assignment

    k = data.draw(st.integers(1, num_layers))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    floors = [_costs(data, num_layers, integers) / 2 for _ in range(k - 1)]
    costs = [_costs(data, num_layers, integers) for _ in range(k - 1)] if own_costs else None
    reference = min_max_assignment(stage_costs, floors, costs)
    found = bottleneck_min_max(stage_costs, floors, costs)
    assert found.objective == pytest.approx(reference.objective, rel=1e-9, abs=1e-12)

    def fill(b: tuple[int, ...]) -> float:
        e = costs if costs is not None else floors
        return sum(float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)) + sum(e[j - 1][b[j] - 1] for j in range(1, k))

    def period(b: tuple[int, ...]) -> float:
        return max([float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)]
                   + [float(floors[j - 1][b[j] - 1]) for j in range(1, k)])

    if period(found.boundaries) < period(reference.boundaries):
        # the reference's cap keeps a relative slack of 1e-12 for rounding, which can admit a cut that slower
        # with a smaller fill (e.g. stage times 1 and 1 + 1e-12); the found cut is then the faster one
        assert period(found.boundaries) >= period(reference.boundaries) * (1 - 1e-11)
    elif period(found.boundaries) > period(reference.boundaries) * (1 + 1e-12) + 1e-300:
        # periods within 1e-9 in ratio tie in the found cut (the reference's slack is 1e-12), and the least fill
        # wins: a slower cut by rounding only, chosen for a smaller fill (found by Hypothesis: stage times
        # 2 + 1.3e-9 with fill 2 + 1.3e-9 against 2 with fill 3)
        assert period(found.boundaries) <= period(reference.boundaries) * (1 + 1e-9) + 1e-12
        assert fill(found.boundaries) < fill(reference.boundaries)
    else:
        assert fill(found.boundaries) == pytest.approx(fill(reference.boundaries), rel=1e-9, abs=1e-12)


def _tied_corners(num_layers: int, k: int, gas: int, noise: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The adversarial family of the module note: stage 1 is the slowest, and the costs of boundaries 1 and 2
    pay back exactly what its time costs, ``e_0(m) + e_1(m') = g (p(L) - (p(m') - p(m)))``, so that every cut
    with a slowest middle stage ties up to ``noise``: ``Theta(L^2)`` corners of ``S(P)`` to tell apart."""
    t = np.ones(num_layers) + noise[:num_layers] * 1e-3
    p = np.concatenate(([0.0], np.cumsum(t)))
    g = gas - 1
    e0 = g * p[1:] + noise[num_layers : 2 * num_layers] * 1e-6
    e1 = g * (p[-1] - p[1:]) + noise[2 * num_layers :] * 1e-6
    return [t] * k, [e0, e1] + [np.zeros(num_layers)] * (k - 3)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), num_layers=st.integers(3, 12), gas=st.integers(2, 9), sweep_after=st.sampled_from([0, 4, 64]))
def test_tied_corners_same_optimum_as_amps_program(data: st.DataObject, num_layers: int, gas: int,
                                                   sweep_after: int) -> None:
    k = data.draw(st.integers(3, num_layers))
    noise = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=3 * num_layers, max_size=3 * num_layers)))
    stage_costs, cut_costs = _tied_corners(num_layers, k, gas, noise)
    reference = amp_layer_assignment(stage_costs, cut_costs, gas)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bottleneck_cuts, "SWEEP_AFTER", sweep_after)  # the sweep from the start, midway, or never
        found = bottleneck_assignment(stage_costs, cut_costs, gas)
    assert found.objective == pytest.approx(reference.objective, rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 9), floors=st.booleans(), sync=st.booleans())
def test_sums_of_a_batch_of_caps_are_the_least_sums_of_every_cut(data: st.DataObject, num_layers: int, floors: bool,
                                                                 sync: bool) -> None:
    # S(P, Q) by brute force: the least sum (t + e) over the cuts whose every u <= P and sync <= Q (inf if none)
    k = data.draw(st.integers(1, num_layers))
    stage_costs = [_costs(data, num_layers, True) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, True) / 4 for _ in range(k - 1)]
    cut_floors = [_costs(data, num_layers, True) for _ in range(k - 1)] if floors else None
    costs = SyncCosts(range_sums(_costs(data, num_layers, True)), tuple([1.0] * k)) if sync else None
    problem = cut_problem._Problem(stage_costs, cut_costs, cut_floors, costs)
    caps = np.sort(np.array(data.draw(st.lists(st.integers(0, 9 * num_layers).map(float), min_size=1, max_size=6))))
    cap_q = float(data.draw(st.integers(0, 9 * num_layers))) if sync else 0.0

    def least(cap: float) -> float:
        fitting = [sum(float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k))
                   + sum(float(cut_costs[j - 1][b[j] - 1]) for j in range(1, k))
                   for b in all_cuts(num_layers, k)
                   if all(float(stage_costs[j][b[j]:b[j + 1]].sum()) <= cap for j in range(k))
                   and (not floors or all(cut_floors[j - 1][b[j] - 1] <= cap for j in range(1, k)))
                   and (not sync or costs.seconds(b) <= cap_q)]
        return min(fitting, default=np.inf)

    expected = [least(c) for c in caps]
    assert problem.sums(caps, cap_q) == pytest.approx(expected)
    assert [problem.evaluate(float(c), cap_q)[0] for c in caps] == pytest.approx(expected)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_layers=st.integers(2, 9), gas=st.sampled_from([1, 2, 1000]), kinds=st.integers(1, 3),
       floors=st.booleans())
def test_adversarial_families_least_total_of_every_cut(data: st.DataObject, num_layers: int, gas: int, kinds: int,
                                                       floors: bool) -> None:
    # several device types (stage cost vectors), floors near the stage times, a sync as large as the pipeline
    # term, tiny and huge g: against brute force; and the evaluations within the module note's bound
    k = data.draw(st.integers(2, num_layers))
    types = [_costs(data, num_layers, True) + 1 for _ in range(kinds)]
    stage_costs = [types[j % kinds] for j in range(k)]
    cut_costs = [_costs(data, num_layers, True) / 4 for _ in range(k - 1)]
    cut_floors = [_costs(data, num_layers, True) * num_layers / k for _ in range(k - 1)] if floors else None
    sync = SyncCosts(range_sums(_costs(data, num_layers, True)), tuple(float(gas) * (1 + j % 2) for j in range(k)))
    calls = []
    original = cut_problem._Problem.evaluate
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cut_problem._Problem, "evaluate",
                      lambda self, p, q: calls.append((p, q)) or original(self, p, q))
        found = bottleneck_assignment(stage_costs, cut_costs, gas, cut_floors, sync)

    def parts(b: tuple[int, ...]) -> tuple[list[float], list[float], float]:  # every u, every sync, the sum
        t = [float(stage_costs[j][b[j]:b[j + 1]].sum()) for j in range(k)]
        u = t + ([float(cut_floors[j - 1][b[j] - 1]) for j in range(1, k)] if cut_floors else [])
        w = [sync.factors[j] * float(sync.range_bytes[b[j], b[j + 1]]) for j in range(k)]
        return u, w, sum(t) + sum(float(cut_costs[j - 1][b[j] - 1]) for j in range(1, k))

    def total(b: tuple[int, ...]) -> float:
        u, w, s = parts(b)
        return (gas - 1 or 1e-9) * max(u) + max(w) + s

    cuts = all_cuts(num_layers, k)
    assert total(found.boundaries) == pytest.approx(min(total(b) for b in cuts), rel=1e-9, abs=1e-12)
    # the bound: one evaluation without caps, then each at a distinct pair of candidates (stage 0 holds a prefix,
    # a later stage any range [a, b) with a >= 1; any stage any sync)
    ranges = [(a, b) for a in range(num_layers) for b in range(a + 1, num_layers + 1)]
    us = {float(stage_costs[0][:b].sum()) for b in range(1, num_layers + 1)} | {
        max(float(stage_costs[j][a:b].sum()), float(cut_floors[j - 1][a - 1]) if cut_floors else 0.0)
        for j in range(1, k) for a, b in ranges if a >= 1}
    ws = {0.0} | {sync.factors[j] * float(sync.range_bytes[a, b]) for j in range(k) for a, b in ranges}
    assert len(set(calls)) == len(calls) <= 1 + len(us) * len(ws)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 70), rows=st.integers(1, 3), factor=st.sampled_from([0.0, float("inf")]))
def test_window_minima_both_ways_are_the_minimum_of_each_window(data: st.DataObject, n: int, rows: int,
                                                                factor: float) -> None:
    # factor 0: the sparse table always; inf: reduceat always. Rows are caps: no window may read another row
    h = np.array(data.draw(st.lists(st.floats(-5, 5), min_size=rows * (n + 2), max_size=rows * (n + 2))))
    h = h.reshape(rows, n + 2)
    h[:, 0] = h[:, n] = h[:, n + 1] = np.inf
    # non-decreasing starts at least 1 (the search's windows), some windows empty
    draws = data.draw(st.lists(st.integers(1, n + 1), min_size=rows * (n + 1), max_size=rows * (n + 1)))
    lo = np.minimum(np.maximum.accumulate(np.array(draws).reshape(rows, n + 1), axis=1), n)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(window_minima, "SPARSE_TABLE_FACTOR", factor)
        minima = window_minima._WindowMinima(lo)(h)
    for r in range(rows):
        for i in range(n + 1):
            if lo[r, i] < i:
                assert minima[r, i] == min(h[r, lo[r, i]:i])


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 8), gas=st.integers(1, 9), integers=st.booleans())
def test_min_max_within_memory_windows_the_least_period_of_every_fitting_cut(
        data: st.DataObject, num_layers: int, gas: int, integers: bool) -> None:
    from hybridplan.search.time.period_cut import bottleneck_min_max

    k = data.draw(st.integers(1, num_layers))
    in_flight = data.draw(st.integers(1, k + 1))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) for _ in range(k - 1)]
    fits = _memory(data, num_layers, k, monotone=True)
    found = bottleneck_min_max(stage_costs, [c / 2 for c in cut_costs], cut_costs, gas, in_flight,
                               starts=[fitting_starts(f) for f in fits])

    def period(b: tuple[int, ...]) -> float:
        return _period_and_fill(b, stage_costs, cut_costs, gas, in_flight)[0]

    _assert_least_of_fitting(found, fits, period, monotone=True)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 10), gas=st.integers(1, 9), integers=st.booleans(),
       with_sync=st.booleans())
def test_windows_that_hold_every_range_change_nothing(data: st.DataObject, num_layers: int, gas: int,
                                                      integers: bool, with_sync: bool) -> None:
    """Windows starting at 0 everywhere: the same boundaries and the same float objective as without."""
    from hybridplan.search.time.period_cut import bottleneck_min_max

    k = data.draw(st.integers(1, num_layers))
    stage_costs = [_costs(data, num_layers, integers) for _ in range(k)]
    cut_costs = [_costs(data, num_layers, integers) for _ in range(k - 1)]
    floors = [c / 2 for c in cut_costs]
    sync = SyncCosts(range_sums(_costs(data, num_layers, integers)), (1.0,) * k) if with_sync else None
    everywhere = [np.zeros(num_layers + 1, dtype=int)] * k
    plain = bottleneck_assignment(stage_costs, cut_costs, gas, floors, sync, k)
    assert bottleneck_assignment(stage_costs, cut_costs, gas, floors, sync, k, starts=everywhere) == plain
    period = bottleneck_min_max(stage_costs, floors, cut_costs, gas, 1)
    assert bottleneck_min_max(stage_costs, floors, cut_costs, gas, 1, starts=everywhere) == period


def test_fitting_starts_by_hand() -> None:
    """Three layers; ``[0, 2)`` and ``[0, 3)`` do not fit, every other range does: end 2 from 1, end 3 from 1;
    then ``[1, 3)`` not fitting moves end 3 to 2, and ``[2, 3)`` not fitting leaves it no start (3)."""
    fits = np.ones((3, 4), dtype=bool)
    fits[0, 2] = fits[0, 3] = False
    assert fitting_starts(fits).tolist() == [0, 0, 1, 1]
    fits[1, 3] = False
    assert fitting_starts(fits).tolist() == [0, 0, 1, 2]
    fits[2, 3] = False
    assert fitting_starts(fits).tolist() == [0, 0, 1, 3]


def test_min_max_periods_within_rounding_tie_and_the_least_fill_wins() -> None:
    """Hypothesis' case: cutting after layer 3 runs stage 1 in 2 + 1.3e-9 with nothing in stage 0 (fill
    2 + 1.3e-9); after layer 4, in 2 with 1 in stage 0 (fill 3). The periods differ by 6.4e-10 in ratio, within
    the found cut's tie band (1e-9) but not the reference's (1e-12): the found cut takes the smaller fill."""
    from hybridplan.search.time.period_cut import bottleneck_min_max
    from hybridplan.search.time.stage_cuts import min_max_assignment

    stage_costs = [np.array([0.0, 0.0, 0.0, 1.0, 0.0]), np.array([0.0, 0.0, 0.0, 1.2836861573717329e-09, 2.0])]
    floors = [np.zeros(5)]
    assert min_max_assignment(stage_costs, floors).boundaries == (0, 4, 5)
    assert bottleneck_min_max(stage_costs, floors).boundaries[1] <= 3
