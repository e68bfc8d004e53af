"""AMP's throughput search: the search against exhaustive evaluation, memory filtering, the Pareto frontier,
annealed placement (the layer-assignment DP: test_stage_cuts.py; the PipeDream-2BW planner: test_pipedream_2bw.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import UsageError
from hybridplan.plan import Plan
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from hybridplan.search.time.throughput import divisors, enumerate_degrees, pareto_frontier, search_throughput
from tests.paths import SHARED
from tests.search.time.util import TOY_CLUSTER as _CLUSTER, all_cuts as _all_cuts, toy_profile as _toy

AMP = SHARED / "data" / "amp"


# ---------------------------------------------------------------------------------------------- the search
def test_enumeration_helpers() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    degrees = enumerate_degrees(8, 30, (1, 2, 4))
    assert all(pp * dp * tp == 8 and not (dp > 1 and tp > 1) for pp, dp, tp in degrees)
    assert (1, 8, 1) in degrees and (2, 1, 4) in degrees and (8, 1, 1) in degrees
    assert (2, 2, 2) in enumerate_degrees(8, 30, (1, 2, 4), plan_expressible=False)
    assert all(pp <= 3 for pp, _, _ in enumerate_degrees(8, 3, (1,)))


# ---------------------------------------------------------------------------------------------- the search


def test_search_finds_the_exhaustive_optimum() -> None:
    """Without gradients to sync, the DP's cut is the best cut: the search's best equals the best of every
    (pp, dp, tp, mbs) and every set of boundaries evaluated by the cost model."""
    profile, gbs = _toy(), 8
    result = search_throughput(profile, _CLUSTER, gbs)
    best = float("inf")
    for pp, dp, tp in enumerate_degrees(4, 4, (1, 2)):
        for mbs in divisors(gbs // dp):
            for b in _all_cuts(4, pp):
                layout = Plan.uniform(boundaries=b, data_degree=dp, tensor_degree=tp, micro_batch_size=mbs, global_batch_size=gbs)
                best = min(best, predict_iteration_time(layout, profile, _CLUSTER).total_s)
    assert result.best.iteration_s == pytest.approx(best, rel=1e-9)
    assert [c.iteration_s for c in result.candidates] == sorted(c.iteration_s for c in result.candidates)
    assert result.evaluated == len(result.candidates) == sum(len(divisors(gbs // dp)) for _, dp, _ in enumerate_degrees(4, 4, (1, 2)))
    for c in result.candidates:
        c.plan.validate(num_layers=4)
        assert c.plan.global_batch_size == gbs and c.plan.microbatch_size == c.data_degree * c.micro_batch_size
        assert c.predicted == predict_iteration_time(c.plan, profile, _CLUSTER)
    assert "strategies evaluated" in result.table()


def test_memory_filter_and_node_local_stages() -> None:
    profile = _toy(params=1e6)
    deep = search_throughput(profile, _CLUSTER, 8, memory_ok=lambda plan: plan.num_stages >= 2)
    assert deep.rejected_by_memory > 0 and deep.candidates
    assert all(c.plan.num_stages >= 2 for c in deep.candidates)
    local = search_throughput(profile, _CLUSTER, 8, node_local_stages=True)
    for c in local.candidates:
        c.plan.validate(num_layers=4, cluster=_CLUSTER)  # CAPTURE's rule: a stage never spans nodes
    none = search_throughput(profile, _CLUSTER, 8, memory_ok=lambda plan: False)
    with pytest.raises(UsageError, match="no feasible plan"):
        none.best


def test_composite_strategies_are_searched_on_request() -> None:
    """AMP's dp x tp strategies: with ``composite`` the search evaluates them too (as data x tensor stages), and
    its best is at least as fast; every such plan keeps its tensor groups inside a node."""
    profile, gbs = _toy(), 8
    plain = search_throughput(profile, _CLUSTER, gbs)
    both = search_throughput(profile, _CLUSTER, gbs, composite=True, node_local_stages=True)
    assert not any(c.data_degree > 1 and c.tensor_degree > 1 for c in plain.candidates)
    mixed = [c for c in both.candidates if c.data_degree > 1 and c.tensor_degree > 1]
    assert mixed and all(s.parallelism == "data+tensor" for c in mixed for s in c.plan.stages)
    for c in mixed:
        c.plan.validate(num_layers=4, cluster=_CLUSTER)  # tensor groups in one node, replicas on two
        assert c.predicted == predict_iteration_time(c.plan, profile, _CLUSTER)
    # (pp, dp, tp) = (1, 2, 2) on 2 nodes of 2: the only mixed strategy; its micro-batch sizes divide 8 / 2
    assert {(c.pipeline_degree, c.data_degree, c.tensor_degree) for c in mixed} == {(1, 2, 2)}
    assert len(mixed) == len(divisors(gbs // 2))
    assert both.evaluated == plain.evaluated + len(mixed)


def _peak(plan: Plan) -> float:
    """A stand-in memory model: weights per device plus in-flight activations, per stage."""
    return max(
        1e6 * s.num_layers / (s.degree if s.parallelism == "tensor" else 1)
        + 1e5 * plan.microbatch_size * (plan.num_stages - i) / (s.degree if s.parallelism == "data" else 1)
        for i, s in enumerate(plan.stages)
    )


def test_pareto_frontier_is_non_dominated() -> None:
    profile = _toy(params=1e6)
    everything = search_throughput(profile, _CLUSTER, 8).candidates
    frontier = search_throughput(profile, _CLUSTER, 8, objective="pareto", peak_memory=_peak).candidates
    points = [(_peak(c.plan), c.iteration_s) for c in everything]
    assert frontier and all(c.peak_memory_bytes is not None for c in frontier)
    for c in frontier:
        assert not any(m <= c.peak_memory_bytes and t <= c.iteration_s and (m, t) != (c.peak_memory_bytes, c.iteration_s)
                       for m, t in points)
    for m, t in points:  # every candidate is matched or beaten by the frontier
        assert any(f.peak_memory_bytes <= m and f.iteration_s <= t for f in frontier)
    assert [f.peak_memory_bytes for f in frontier] == sorted(f.peak_memory_bytes for f in frontier)
    with pytest.raises(UsageError, match="needs a peak_memory callback"):
        search_throughput(profile, _CLUSTER, 8, objective="pareto")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30))
def test_pareto_frontier_property(points: list[tuple[int, int]]) -> None:
    keep = pareto_frontier(points)
    kept = [points[i] for i in keep]
    for m, t in kept:
        assert not any(a <= m and b <= t and (a, b) != (m, t) for a, b in points)
    for p in points:
        assert any(a <= p[0] and b <= p[1] for a, b in kept)
    assert len(set(kept)) == len(kept)


def test_search_argument_errors() -> None:
    with pytest.raises(UsageError, match="unknown objective"):
        search_throughput(_toy(), _CLUSTER, 8, objective="speed")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="unknown placement"):
        search_throughput(_toy(), _CLUSTER, 8, placement="random")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="positive integer"):
        search_throughput(_toy(), _CLUSTER, 0)


# ---------------------------------------------------------------------------------------------- AMP's data
@pytest.mark.skipif(not AMP.is_dir(), reason="../shared/data/amp is absent")
def test_amp_homogeneous_search_ranks_the_measured_best_high() -> None:
    """16 T4 (4 x 4, 50 Gbit/s), GPT-2, batch 32: the measured-best strategy (mbs 1, dp 4, pp 4, boundaries
    [0, 9, 15, 21, 30], 1.20 s) is found with exactly AMP's boundaries and ranked in our top 5."""
    from hybridplan.profiling.importers import load_amp_gpt2

    link = 50e9 / 8
    cluster = Cluster.uniform(4, 4, device_type="T4", intra_node_bandwidth=link, inter_node_bandwidth=link)
    result = search_throughput(load_amp_gpt2(AMP / "known_cost", "G4"), cluster, 32)
    top = [(c.pipeline_degree, c.data_degree, c.tensor_degree, c.micro_batch_size, c.plan.boundaries) for c in result.candidates[:5]]
    assert (4, 4, 1, 1, (0, 9, 15, 21, 30)) in top
    assert result.seconds < 5.0


# ---------------------------------------------------------------------------------------------- the cut
@pytest.mark.parametrize("gas", [1, 2, 8])
def test_the_cut_is_the_fastest_under_the_whole_time_model_sync_included(gas: int) -> None:
    # 2 stages of 2 data replicas over the toy mesh's two nodes, 8 layers with 30 MB of gradients each (their
    # all-reduce weighs as much as a stage's compute): the cut must minimise the predicted iteration time,
    # pipeline AND gradient all-reduce, over every cut
    from hybridplan.search.time.strategy_cut import assign_layers

    profile = _toy(params=3e7, num_layers=8)
    mbs = 1
    gbs = 2 * mbs * gas
    plan = assign_layers(profile, _CLUSTER, range(4), pipeline_degree=2, data_degree=2, tensor_degree=1,
                         micro_batch_size=mbs, global_batch_size=gbs)
    times = {b: predict_iteration_time(Plan.uniform(boundaries=b, data_degree=2, tensor_degree=1, micro_batch_size=mbs,
                                                     global_batch_size=gbs), profile, _CLUSTER).total_s
             for b in _all_cuts(8, 2)}
    assert predict_iteration_time(plan, profile, _CLUSTER).total_s == pytest.approx(min(times.values()), rel=1e-9)
    # AMP's program, the reference for the pipeline term, is blind to the sync: here it is slower
    old = assign_layers(profile, _CLUSTER, range(4), pipeline_degree=2, data_degree=2, tensor_degree=1,
                        micro_batch_size=mbs, global_batch_size=gbs, cuts="amp")
    assert times[tuple(old.boundaries)] > min(times.values()) * 1.005


def _chain(forward_s: list[float], activation_bytes: list[float]) -> TimeProfile:
    """Layers of these forward times (backward twice as long) and activation bytes per sample, no parameters."""
    return TimeProfile(
        model="chain",
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=a, parameter_bytes=0.0)
                     for i, a in enumerate(activation_bytes)),
        timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=tuple(forward_s),
                             backward_s=tuple(2 * f for f in forward_s)),))


def _cut_and_best(profile: TimeProfile, cluster: Cluster, pp: int, dp: int, gbs: int,
                  schedule: str) -> tuple[float, float]:
    """The predicted time of the search's cut, and the least over every cut (each timed whole by the time model)."""
    from hybridplan.search.time.strategy_cut import assign_layers

    plan = assign_layers(profile, cluster, range(pp * dp), pipeline_degree=pp, data_degree=dp, tensor_degree=1,
                         micro_batch_size=1, global_batch_size=gbs, schedule=schedule)
    best = min(predict_iteration_time(Plan.uniform(boundaries=b, data_degree=dp, tensor_degree=1, micro_batch_size=1,
                                                   global_batch_size=gbs, schedule=schedule), profile, cluster).total_s
               for b in _all_cuts(profile.num_layers, pp))
    return predict_iteration_time(plan, profile, cluster).total_s, best


@pytest.mark.parametrize(("schedule", "boundaries", "seconds"), [("1f1b", (0, 2, 3), 0.2801), ("gpipe", (0, 1, 3), 0.2259)])
def test_the_cut_minds_the_round_trip_of_1f1b(schedule: str, boundaries: tuple[int, ...], seconds: float) -> None:
    """Layers of 9.3, 7.5 and 5.1 ms (forward and backward) and 0.75, 0.31 and 0.75 MB of activations on two
    devices linked at 100 MB/s: boundaries of 2 x 0.75 / 100 = 15 ms and 6.2 ms; 16 micro-batches. Cut (0, 1, 3):
    stages 9.3 and 12.6 ms, round trip 36.9 ms; cut (0, 2, 3): 16.8 and 5.1 ms, round trip 28.1 ms. GPipe: 15 x 12.6
    + 36.9 = 225.9 ms against 15 x 16.8 + 28.1 = 280.1 ms. 1F1B (2 micro-batches in flight) paces the first at
    36.9 / 2: 15 x 18.45 + 36.9 = 313.65 ms; the second stays at 280.1 ms. The cut once ignored the round trip and
    took (0, 1, 3), 12% slower, under 1F1B too (test_bottleneck_cuts.py has the same case on bare costs)."""
    from hybridplan.search.time.strategy_cut import assign_layers

    profile = _chain([3.1e-3, 2.5e-3, 1.7e-3], [7.5e5, 3.1e5, 7.5e5])
    cluster = Cluster.uniform(1, 2, device_type="A", intra_node_bandwidth=1e8)
    plan = assign_layers(profile, cluster, range(2), pipeline_degree=2, data_degree=1, tensor_degree=1,
                         micro_batch_size=1, global_batch_size=16, schedule=schedule)
    assert tuple(plan.boundaries) == boundaries
    assert predict_iteration_time(plan, profile, cluster).total_s == pytest.approx(seconds, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), schedule=st.sampled_from(["1f1b", "gpipe", "2bw"]))
@example(seed=18, schedule="1f1b")  # cases the cut once missed, leaving out the round trip (14 of seeds 0-599 under
@example(seed=451, schedule="2bw")  # 1F1B, 13 under PipeDream-2BW, whose min-max cut left it out too)
def test_the_cut_is_the_best_of_every_cut_under_the_time_model(seed: int, schedule: str) -> None:
    """3 to 7 random layers on 2 to 4 devices (pp x dp, no parameters: the sync's latency is the next tests'), links
    from 100 MB/s to 100 GB/s, so that compute, transfers or the round trip bind."""
    rng = np.random.default_rng(seed)
    layers, devices = int(rng.integers(3, 8)), int(rng.choice([2, 3, 4]))
    pp = int(rng.choice([p for p in (2, 3, 4) if devices % p == 0 and p <= layers]))
    profile = _chain(list(rng.uniform(1e-3, 5e-3, layers)), list(rng.uniform(1e4, 1e6, layers)))
    cluster = Cluster.uniform(1, devices, device_type="A", intra_node_bandwidth=float(10 ** rng.uniform(8, 11)))
    found, best = _cut_and_best(profile, cluster, pp, devices // pp, int(rng.choice([4, 8, 16])), schedule)
    assert found == pytest.approx(best, rel=1e-9)


# ------------------------------------------------------------------------------- the sync's per-message latency
def _tensor_chain(forward_s: list[float], tensors: list[int | None], parameter_bytes: list[float],
                  activation_bytes: list[float], tied: tuple[int, ...] = ()) -> TimeProfile:
    """A chain of these forward times (backward twice as long), parameter tensors, gradient and activation bytes;
    the layers ``tied`` share their parameters (as tied embeddings)."""
    return TimeProfile(
        model="tensor-chain",
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=a, parameter_bytes=p, parameter_tensors=c,
                               shared_parameters="embedding" if i in tied else None)
                     for i, (c, p, a) in enumerate(zip(tensors, parameter_bytes, activation_bytes))),
        timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=tuple(forward_s),
                             backward_s=tuple(2 * f for f in forward_s)),))


def test_the_cut_minds_the_syncs_per_message_latency() -> None:
    """Three layers of 1, 1 and 4 ms forward (3, 3 and 12 ms with the backward), of 300, 300 and 1 parameter
    tensors and no bytes to move, on 2 stages of 2 data replicas in one node whose links take 10 us per message;
    2 micro-batches (1F1B holds both: no round trip). A tensor's all-reduce is a ring of 2 (2 - 1) = 2 steps:
    20 us; a boundary costs 2 x 10 us = 0.02 ms per micro-batch. Cut (0, 2, 3): stages 6 and 12 ms, sync 600 x
    20 us = 12 ms: 1 x 12 + 18 + 0.02 + 12 = 42.02 ms. Cut (0, 1, 3): stages 3 and 15 ms, sync 301 x 20 us =
    6.02 ms: 1 x 15 + 18 + 0.02 + 6.02 = 39.04 ms. Without the latency the sync is 0 and the first (30.02 ms
    against 33.02 ms) wins: the cut once left the latency out and took it, 7.6% slower."""
    from hybridplan.search.time.strategy_cut import assign_layers

    profile = _tensor_chain([1e-3, 1e-3, 4e-3], [300, 300, 1], [0.0] * 3, [0.0] * 3)
    cluster = Cluster.uniform(1, 4, device_type="A").with_latencies(1e-5, None)
    plan = assign_layers(profile, cluster, range(4), pipeline_degree=2, data_degree=2, tensor_degree=1,
                         micro_batch_size=1, global_batch_size=4)
    assert tuple(plan.boundaries) == (0, 1, 3)
    assert predict_iteration_time(plan, profile, cluster).total_s == pytest.approx(39.04e-3, rel=1e-9)
    slower = Plan.uniform(boundaries=(0, 2, 3), data_degree=2, tensor_degree=1, micro_batch_size=1, global_batch_size=4)
    assert predict_iteration_time(slower, profile, cluster).total_s == pytest.approx(42.02e-3, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), schedule=st.sampled_from(["1f1b", "gpipe", "2bw"]), step=st.booleans())
@example(seed=1167, schedule="1f1b", step=True)  # tied layers' ranges a last bit apart: the caps once ran without end
def test_the_cut_is_the_best_of_every_cut_with_the_syncs_latency(seed: int, schedule: str, step: bool) -> None:
    """3 to 7 random layers with 0 to 400 parameter tensors (or none recorded) and up to 10 MB of gradients, on 2
    or 4 devices over 1 or 2 nodes (pp x dp, dp > 1), links of 100 MB/s to 100 GB/s and 1 us to 1 ms per
    message, two layers sometimes tied, each stage at a random ZeRO level: the cut is the best of
    every cut by the time model, its sync's per-message latency included. (The ZeRO-2/3 stages' per-micro-batch
    collectives are cut per layer's bytes, the time model counts a tied pair once: no tied layers with them.)
    With ``step`` the profile also measured an optimizer step (0.01 to 10 ns per parameter byte: up to 0.1 s for
    a stage's 10 MB, under ZeRO over the replicas' shares), whose slowest stage's the time model adds ([Note: the
    optimizer step's maximum] in search/time/bottleneck_cuts.py). PipeDream-2BW (no ZeRO: its two weight versions
    are whole) is cut for its period, sync and step together ([Note: 2BW's cut with the sync and the step])."""
    from hybridplan.search.time.stage_options import with_options
    from hybridplan.search.time.strategy_cut import assign_layers

    rng = np.random.default_rng(seed)
    layers, devices = int(rng.integers(3, 8)), int(rng.choice([2, 4]))
    pp = int(rng.choice([p for p in (1, 2) if p <= layers])) if devices == 2 else int(rng.choice([1, 2]))
    dp = devices // pp
    zeros = [int(rng.integers(0, 4)) for _ in range(pp)]
    if schedule == "2bw":
        zeros = [0] * pp
    tied = tuple(sorted(rng.choice(layers, 2, replace=False).tolist())) if rng.random() < 0.5 and max(zeros) < 2 else ()
    tensors: list[int | None] = [None if rng.random() < 0.2 else int(rng.integers(0, 400)) for _ in range(layers)]
    nbytes = [float(rng.choice([0.0, rng.uniform(1e4, 1e7)])) for _ in range(layers)]
    if tied:  # the tied copies hold the same parameters
        tensors[tied[1]], nbytes[tied[1]] = tensors[tied[0]], nbytes[tied[0]]
    profile = _tensor_chain(list(rng.uniform(1e-3, 5e-3, layers)), tensors, nbytes, list(rng.uniform(1e4, 1e6, layers)),
                            tied)
    nodes = int(rng.choice([1, 2]))
    bandwidths = {"intra_node_bandwidth": float(10 ** rng.uniform(8, 11)),
                  "inter_node_bandwidth": float(10 ** rng.uniform(8, 10))}
    cluster = Cluster.uniform(nodes, devices // nodes, device_type="A", **bandwidths).with_latencies(
        float(10 ** rng.uniform(-6, -3)), float(10 ** rng.uniform(-6, -3)))
    gbs = dp * int(rng.choice([1, 2, 4, 8]))
    if step:
        rate = float(10 ** rng.uniform(-11, -8))
        profile = replace(profile, timings=tuple(replace(t, optimizer_s_per_byte=rate) for t in profile.timings))
    options = [(z, False) for z in zeros]
    plan = with_options(assign_layers(profile, cluster, range(devices), pipeline_degree=pp, data_degree=dp,
                                      tensor_degree=1, micro_batch_size=1, global_batch_size=gbs, schedule=schedule,
                                      options=options), options)
    times = [predict_iteration_time(with_options(Plan.uniform(boundaries=b, data_degree=dp, tensor_degree=1,
                                                              micro_batch_size=1, global_batch_size=gbs,
                                                              schedule=schedule), options), profile, cluster).total_s
             for b in _all_cuts(layers, pp)]
    assert predict_iteration_time(plan, profile, cluster).total_s == pytest.approx(min(times), rel=1e-9)
