"""The AMP cost model against hand-computed values, monotonicity properties, and AMP's own predictions.

Expected numbers are worked out here from the formulas of the module note, not by calling the model.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.plan.cluster import Cluster, DeviceSpec
from hybridplan.errors import PlanError, ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.communication import allreduce_seconds, p2p_messages, sync_messages
from hybridplan.predict.time_model import pipeline_seconds, predict_iteration_time
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from tests.paths import SHARED

AMP = SHARED / "data" / "amp"


def _profile(comm_in_times: bool = False) -> TimeProfile:
    """Three layers; tensor degree 1 and 2 on type "A"; layer 1 is a Megatron block; layers 0 and 2 share weights."""
    return TimeProfile(
        model="toy",
        tensor_comm_in_times=comm_in_times,
        layers=(
            LayerInfo(name="embed", activation_bytes_per_sample=10.0, parameter_bytes=100.0, shared_parameters="emb"),
            LayerInfo(name="block", activation_bytes_per_sample=5.0, parameter_bytes=200.0, tensor_parallel_allreduces=(2, 2)),
            LayerInfo(name="head", activation_bytes_per_sample=1.0, parameter_bytes=100.0, shared_parameters="emb"),
        ),
        timings=(
            TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=(1.0, 2.0, 0.5), backward_s=(2.0, 4.0, 1.0)),
            TimingTable(device_type="A", tensor_degree=2, micro_batch_size=1, forward_s=(0.6, 1.2, 0.3), backward_s=(1.2, 2.4, 0.6)),
        ),
    )


def _cluster(nodes: int, per_node: int, intra: float, inter: float, devices: tuple[DeviceSpec, ...] | None = None) -> Cluster:
    specs = devices or (DeviceSpec(type="A"),) * (nodes * per_node)
    return Cluster(num_nodes=nodes, devices_per_node=per_node, devices=specs, intra_node_bandwidth=intra, inter_node_bandwidth=inter)


def _plan(stages: list[tuple[int, int, str, list[int]]], gbs: int = 8, microbatches: int = 4, tensor_degree: int = 0) -> Plan:
    return Plan("1f1b", gbs, microbatches, tuple(StagePlan(a, b, k, len(d), tuple(d), {}, tensor_degree if k == "data+tensor" else 0)
                                                for a, b, k, d in stages))


def test_two_plain_stages_by_hand() -> None:
    # micro-batch M = 8 / 4 = 2 samples. Stage 0 = layers [0, 2): (1+2 + 2+4) * 2 = 18 s; stage 1 = layer 2: (0.5+1) * 2 = 3 s.
    # p2p after layer 1 across nodes at 10 B/s: 2 directions * M * 5 B / 10 = 2 s.
    # T = (4 - 1) * max(18, 3, 2/2) + (18 + 3) + 2 = 77; no data parallelism, no sync.
    plan = _plan([(0, 2, "none", [0]), (2, 3, "none", [1])])
    t = predict_iteration_time(plan, _profile(), _cluster(2, 1, 1000.0, 10.0))
    assert [s.compute_s for s in t.stages] == pytest.approx([18.0, 3.0])
    assert t.stages[0].p2p_s == pytest.approx(2.0) and t.stages[1].p2p_s == 0.0
    assert t.total_s == pytest.approx(77.0) and t.sync_s == 0.0
    # blocking sends: steady-state stage times 18 + 2/2 and 3 + 2/2 -> 3 * 19 + 21 + 2 = 80
    assert predict_iteration_time(plan, _profile(), _cluster(2, 1, 1000.0, 10.0), overlap_p2p=False).total_s == pytest.approx(80.0)


def test_slow_link_paces_the_steady_state() -> None:
    # same plan, 0.01 B/s: e = 2 * 2 * 5 / 0.01 = 2000 s, one way 1000 s > 18 s. The round trip of 1F1B (2 micro-
    # batches in flight on stage 0) is slower still: (18 + 3 + 2000) / 2 = 1010.5 s per micro-batch.
    # T = 3 * 1010.5 + 21 + 2000 = 5052.5; GPipe has no round-trip bound: 3 * 1000 + 21 + 2000 = 5021.
    plan = _plan([(0, 2, "none", [0]), (2, 3, "none", [1])])
    assert predict_iteration_time(plan, _profile(), _cluster(2, 1, 1000.0, 0.01)).total_s == pytest.approx(5052.5)
    assert predict_iteration_time(plan, _profile(), _cluster(2, 1, 1000.0, 0.01), schedule="gpipe").total_s == pytest.approx(5021.0)


def test_balanced_stages_pay_the_round_trip() -> None:
    # 4 micro-batches, two stages of 1 s each, e = 0.5 s: eq. 5 gives 3 * 1 + 2 + 0.5 = 5.5; 1F1B holds 2
    # micro-batches in flight on stage 0, so a period is at least (1 + 1 + 0.5) / 2 = 1.25: 3 * 1.25 + 2.5 = 6.25.
    assert pipeline_seconds([1.0, 1.0], [0.5], 4) == pytest.approx(5.5)
    assert pipeline_seconds([1.0, 1.0], [0.5], 4, in_flight=2) == pytest.approx(6.25)
    assert pipeline_seconds([1.0, 1.0], [0.5], 4, in_flight=4) == pytest.approx(5.5)  # GPipe: all 4 in flight


def test_mixed_data_then_tensor_stage_by_hand() -> None:
    # one node of 4 devices, 100 B/s. M = 2, gas = 4.
    # stage 0: data x2 on [0, 1], layer 0, one sample per replica: t0 = 1 + 2 = 3 s.
    #   sync: ring over 2 devices of the stage's 100 B of gradients: 2 * 1 / 2 * 100 / 100 = 1 s.
    # stage 1: tensor x2 on [2, 3], layers [1, 3), two samples at degree 2: (1.2 + 2.4 + 0.3 + 0.6) * 2 = 9 s,
    #   plus the block's 2 + 2 all-reduces of 2 samples * 5 B: 4 * (2 * 1 / 2) * 10 / 100 = 0.4 s -> t1 = 9.4 s.
    # p2p after layer 0: a tensor group needs the whole micro-batch: 2 * 2 * 10 / 100 = 0.4 s.
    # T = 3 * 9.4 + (3 + 9.4) + 0.4 + 1 = 42.0
    plan = _plan([(0, 1, "data", [0, 1]), (1, 3, "tensor", [2, 3])])
    t = predict_iteration_time(plan, _profile(), _cluster(1, 4, 100.0, 100.0))
    assert t.stages[0].compute_s == pytest.approx(3.0) and t.stages[0].sync_s == pytest.approx(1.0)
    assert t.stages[1].tensor_comm_s == pytest.approx(0.4) and t.stages[1].compute_s == pytest.approx(9.4)
    assert t.stages[0].p2p_s == pytest.approx(0.4)
    assert t.total_s == pytest.approx(42.0)
    assert t.bottleneck_stage == 1
    # with the all-reduces inside the measured times nothing is added: t1 = 9, T = 3 * 9 + 12 + 0.4 + 1 = 40.4
    assert predict_iteration_time(plan, _profile(comm_in_times=True), _cluster(1, 4, 100.0, 100.0)).total_s == pytest.approx(40.4)


def test_tied_parameters_count_once_per_stage() -> None:
    # one data stage x2 over all layers: 100 (emb) + 200 + emb again (shared) = 300 B; 2*1/2*300/100 = 3 s
    plan = _plan([(0, 3, "data", [0, 1])])
    t = predict_iteration_time(plan, _profile(), _cluster(1, 2, 100.0, 100.0))
    assert t.sync_s == pytest.approx(3.0)


def test_unprofiled_device_type_runs_reference_times_over_speed() -> None:
    # device 1 is type "Z" (not profiled) at speed 0.5: reference times doubled. A data stage waits for it.
    devices = (DeviceSpec(type="A"), DeviceSpec(type="Z", speed=0.5))
    plan = _plan([(0, 3, "data", [0, 1])])
    t = predict_iteration_time(plan, _profile(), _cluster(1, 2, 1e12, 1e12, devices))
    # one sample per replica: (1 + 2 + 2 + 4 + 0.5 + 1) / 0.5 = 21 s per micro-batch
    assert t.stages[0].compute_s == pytest.approx(21.0)
    # a profiled type ignores speed (it is relative to the profiled device)
    fast = (DeviceSpec(type="A", speed=4.0),) * 2
    assert predict_iteration_time(plan, _profile(), _cluster(1, 2, 1e12, 1e12, fast)).stages[0].compute_s == pytest.approx(10.5)


def test_amp_uniform_stage_with_data_and_tensor() -> None:
    # AMP (pp=1, dp=2, tp=2), mbs 1, gbs 8 on 2 nodes x 2: tensor groups (0,1), (2,3) in a node at 100 B/s,
    # data groups (0,2), (1,3) across nodes at 10 B/s. gas = 8 / (2 * 1) = 4, one sample per replica.
    # t = per layer at degree 2: (0.6+1.2) + (1.2+2.4) + (0.3+0.6) = 6.3 s,
    #   + block all-reduces 4 * 1 * (1 sample * 5 B) / 100 = 0.2 s -> 6.5 s.
    # sync: each tensor rank all-reduces (100 + 200) / 2 = 150 B over 2 devices at 10 B/s: 15 s.
    # T = 3 * 6.5 + 6.5 + 15 = 41
    plan = Plan.uniform(boundaries=[0, 3], data_degree=2, tensor_degree=2, micro_batch_size=1, global_batch_size=8)
    assert (plan.microbatch_size, plan.num_microbatches) == (2, 4)
    t = predict_iteration_time(plan, _profile(), _cluster(2, 2, 100.0, 10.0))
    assert t.stages[0].kind == "data+tensor"
    assert t.stages[0].compute_s == pytest.approx(6.5) and t.sync_s == pytest.approx(15.0)
    assert t.total_s == pytest.approx(41.0)
    # the same stage written in a plan file
    written = _plan([(0, 3, "data+tensor", [0, 1, 2, 3])], tensor_degree=2)
    assert predict_iteration_time(written, _profile(), _cluster(2, 2, 100.0, 10.0)).total_s == pytest.approx(41.0)


def test_plan_errors() -> None:
    cluster = _cluster(1, 4, 100.0, 100.0)
    with pytest.raises(PlanError, match="but the model has 3 layers"):
        predict_iteration_time(_plan([(0, 2, "none", [0])]), _profile(), cluster)
    with pytest.raises(PlanError, match="do not exist on cluster 1x4"):
        predict_iteration_time(_plan([(0, 3, "none", [7])]), _profile(), cluster)
    with pytest.raises(ProfileError, match="tensor-parallel degree 4"):
        predict_iteration_time(_plan([(0, 3, "tensor", [0, 1, 2, 3])]), _profile(), cluster)
    with pytest.raises(PlanError, match="does not split into micro-batches"):
        Plan.uniform(boundaries=[0, 3], data_degree=3, tensor_degree=1, micro_batch_size=1, global_batch_size=8)


def test_formulas() -> None:
    assert allreduce_seconds(300.0, 4, 10.0) == pytest.approx(2 * 3 * 300 / (4 * 10))
    assert allreduce_seconds(300.0, 1, 10.0) == 0.0
    assert pipeline_seconds([1.0, 3.0, 2.0], [0.5, 0.5], 5) == pytest.approx(4 * 3 + 6 + 1)


def test_breakdown_report() -> None:
    t = predict_iteration_time(_plan([(0, 1, "data", [0, 1]), (1, 3, "tensor", [2, 3])]), _profile(), _cluster(1, 4, 100.0, 100.0))
    d = t.to_dict()
    assert d["total_s"] == pytest.approx(42.0) and [s["kind"] for s in d["stages"]] == ["data", "tensor"]
    table = t.table()
    assert "42000.0 ms per iteration" in table and "tensor" in table and "1*" in table


def _with_costs(rate: float, overhead: float, host_cores: int | None = None) -> TimeProfile:
    """_profile() with a measured optimizer step (seconds per parameter byte) and overhead at degrees 1 and 2."""
    p = _profile()
    tables = tuple(TimingTable(device_type=t.device_type, tensor_degree=t.tensor_degree, micro_batch_size=1,
                               forward_s=t.forward_s, backward_s=t.backward_s, optimizer_s_per_byte=rate,
                               overhead_s=overhead * t.tensor_degree) for t in p.timings)
    return TimeProfile(model="toy", layers=p.layers, timings=tables, host_cores=host_cores)


def test_optimizer_step_and_overhead_by_hand() -> None:
    # The plan of test_two_plain_stages_by_hand (T = 77 s without the new terms), 0.01 s per parameter byte and
    # 0.5 s of overhead per iteration (at micro-batch 1; 2 samples -> 0.5 * 2 / 1 = 1 s, proportional above the
    # single profiled size). Stage 0 holds layers 0, 1: 100 + 200 B -> step 3 s; stage 1 holds layer 2: 100 B -> 1 s.
    # T = 77 + max(3, 1) + max(1, 1) = 81
    plan = _plan([(0, 2, "none", [0]), (2, 3, "none", [1])])
    t = predict_iteration_time(plan, _with_costs(0.01, 0.5), _cluster(2, 1, 1000.0, 10.0))
    assert [s.optimizer_s for s in t.stages] == pytest.approx([3.0, 1.0])
    assert [s.overhead_s for s in t.stages] == pytest.approx([1.0, 1.0])
    assert (t.optimizer_s, t.overhead_s, t.total_s) == pytest.approx((3.0, 1.0, 81.0))
    assert t.to_dict()["optimizer_s"] == pytest.approx(3.0) and "optimizer step 3000.0 ms" in t.table()


def test_optimizer_step_shards_with_tensor_degree_and_zero() -> None:
    # one data x2 stage over all layers (300 B once the tied embedding counts once), 0.01 s/B:
    # plain data parallelism: every replica steps all 300 B -> 3 s; ZeRO-1: each steps half -> 1.5 s.
    data = _plan([(0, 3, "data", [0, 1])])
    zero = Plan("1f1b", 8, 4, (StagePlan(0, 3, "data", 2, (0, 1), {}, 0, 1),))
    profile, cluster = _with_costs(0.01, 0.0), _cluster(1, 2, 1e12, 1e12)
    assert predict_iteration_time(data, profile, cluster).optimizer_s == pytest.approx(3.0)
    assert predict_iteration_time(zero, profile, cluster).optimizer_s == pytest.approx(1.5)
    # a tensor x2 stage: each device holds half of every layer -> 1.5 s
    tensor = _plan([(0, 3, "tensor", [0, 1])])
    assert predict_iteration_time(tensor, profile, cluster).optimizer_s == pytest.approx(1.5)


def test_processes_sharing_cpu_cores_slow_down_by_hand() -> None:
    # two stages on one node of 2 devices whose profile says the devices shared 1 core: each stage computes
    # 2 / 1 = 2 times slower. t0 = 18 * 2 = 36, t1 = 3 * 2 = 6, e = 0 (fast links): T = 3 * 36 + 42 = 150,
    # + step max(3, 1) * 2 + overhead 1 * 2 = 158.
    plan = _plan([(0, 2, "none", [0]), (2, 3, "none", [1])])
    t = predict_iteration_time(plan, _with_costs(0.01, 0.5, host_cores=1), _cluster(1, 2, 1e15, 1e15))
    assert [s.compute_s for s in t.stages] == pytest.approx([36.0, 6.0])
    assert t.total_s == pytest.approx(158.0)
    assert "stage seconds up to x2.00" in t.table() and t.to_dict()["stages"][0]["core_sharing"] == 2.0
    # the same plan across two nodes: one process per node, nothing shared: 3 * 18 + 21 + 3 + 1 = 79
    assert predict_iteration_time(plan, _with_costs(0.01, 0.5, host_cores=1), _cluster(2, 1, 1e15, 1e15)).total_s == pytest.approx(79.0)
    # a tensor x2 stage was timed with 2 processes on the 1 core already: no further slowdown on 2 devices
    tensor = _plan([(0, 3, "tensor", [0, 1])])
    shared = predict_iteration_time(tensor, _with_costs(0.0, 0.0, host_cores=1), _cluster(1, 2, 1e15, 1e15))
    alone = predict_iteration_time(tensor, _with_costs(0.0, 0.0), _cluster(1, 2, 1e15, 1e15))
    assert shared.total_s == pytest.approx(alone.total_s)


# ---------------------------------------------------------------------------------------------- properties
_layouts = st.sampled_from(
    [
        ([(0, 3, "none", [0])], None),
        ([(0, 1, "none", [0]), (1, 3, "none", [2])], None),
        ([(0, 2, "data", [0, 1]), (2, 3, "tensor", [2, 3])], None),
        ([(0, 1, "tensor", [1, 3]), (1, 3, "data", [0, 2])], None),
        (None, (2, 2, 1)),  # AMP uniform (pp, dp, tp)
        (None, (1, 2, 2)),
        (None, (3, 1, 1)),
    ]
)


def _layout(choice: tuple[object, tuple[int, int, int] | None]) -> Plan:
    stages, degrees = choice
    if degrees is None:
        return _plan(stages)  # type: ignore[arg-type]
    pp, dp, tp = degrees
    bounds = {1: [0, 3], 2: [0, 1, 3], 3: [0, 1, 2, 3]}[pp]
    return Plan.uniform(boundaries=bounds, data_degree=dp, tensor_degree=tp, micro_batch_size=2, global_batch_size=8)


@settings(max_examples=60, deadline=None)
@given(choice=_layouts, intra=st.floats(1.0, 1e6), inter=st.floats(1.0, 1e6), factor=st.floats(1.0, 100.0),
       which=st.sampled_from(["intra", "inter", "both"]), comm=st.booleans())
def test_more_bandwidth_is_never_slower(choice, intra: float, inter: float, factor: float, which: str, comm: bool) -> None:  # type: ignore[no-untyped-def]
    layout = _layout(choice)
    base = predict_iteration_time(layout, _profile(comm), _cluster(2, 2, intra, inter)).total_s
    faster = _cluster(2, 2, intra * (factor if which != "inter" else 1.0), inter * (factor if which != "intra" else 1.0))
    assert predict_iteration_time(layout, _profile(comm), faster).total_s <= base * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(choice=_layouts, speeds=st.lists(st.floats(0.1, 10.0), min_size=4, max_size=4),
       factor=st.floats(1.0, 10.0), device=st.integers(0, 3), bandwidth=st.floats(1.0, 1e4))
def test_faster_device_is_never_slower(choice, speeds: list[float], factor: float, device: int, bandwidth: float) -> None:  # type: ignore[no-untyped-def]
    layout = _layout(choice)
    specs = [DeviceSpec(type="Z", speed=s) for s in speeds]
    base = predict_iteration_time(layout, _profile(), _cluster(2, 2, bandwidth, bandwidth, tuple(specs))).total_s
    specs[device] = DeviceSpec(type="Z", speed=speeds[device] * factor)
    assert predict_iteration_time(layout, _profile(), _cluster(2, 2, bandwidth, bandwidth, tuple(specs))).total_s <= base * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------- AMP's data
@pytest.mark.skipif(not AMP.is_dir(), reason="../shared/data/amp is absent")
def test_reproduces_amps_own_predictions_on_its_trials() -> None:
    """Our model on AMP's 52 homogeneous trials agrees with AMP's predicted seconds to 0.2% (the gap: we count
    13h bias/layernorm parameters per block and the position embedding, AMP 12h^2 and the word embedding)."""
    from hybridplan.profiling.importers import load_amp_gpt2

    profile = load_amp_gpt2(AMP / "known_cost", "G4")
    link = 50e9 / 8  # 50 Gbit/s intra- and inter-node (seed 002 section 4.3)
    cluster = Cluster.uniform(4, 4, device_type="T4", intra_node_bandwidth=link, inter_node_bandwidth=link)
    rows = list(csv.DictReader((AMP / "homogeneous_trials.csv").open()))
    assert len(rows) == 52
    for r in rows:
        layout = Plan.uniform(
            boundaries=[int(b) for b in r["stage_boundaries"].split()], data_degree=int(r["dp"]),
            tensor_degree=int(r["tp"]), micro_batch_size=int(r["mbs"]), global_batch_size=int(r["gbs"]),
        )
        predicted = predict_iteration_time(layout, profile, cluster).total_s
        assert predicted == pytest.approx(float(r["amp_predicted_s"]), rel=2e-3), r
    ours = np.array([predict_iteration_time(Plan.uniform(
        boundaries=[int(b) for b in r["stage_boundaries"].split()], data_degree=int(r["dp"]), tensor_degree=int(r["tp"]),
        micro_batch_size=int(r["mbs"]), global_batch_size=int(r["gbs"])), profile, cluster).total_s
        for r in rows if r["failed"] == "False"])
    measured = np.array([float(r["measured_s"]) for r in rows if r["failed"] == "False"])
    stats = pytest.importorskip("scipy.stats")
    assert stats.spearmanr(ours, measured).statistic >= 0.93


# ---------------------------------------------------------------------------------------------- schedules
def test_flush_is_1f1b_and_2bw_has_no_flush_by_hand() -> None:
    # The plan of test_two_plain_stages_by_hand (t = 18, 3 s; e = 2 s; 4 micro-batches).
    # "flush" (PipeDream-Flush) = 1F1B: 77 s. "2bw" never flushes (seed 003): 4 * max(18, 3, 2/2) = 72 s;
    # with blocking sends each period also holds the stage's own transfers: 4 * (18 + 2/2) = 76 s.
    cluster = _cluster(2, 1, 1000.0, 10.0)
    stages = [(0, 2, "none", [0]), (2, 3, "none", [1])]
    flush = Plan("flush", 8, 4, _plan(stages).stages)
    two = Plan("2bw", 8, 4, _plan(stages).stages)
    assert predict_iteration_time(flush, _profile(), cluster).total_s == pytest.approx(77.0)
    t = predict_iteration_time(two, _profile(), cluster)
    assert t.total_s == pytest.approx(72.0) and t.schedule == "2bw" and t.to_dict()["schedule"] == "2bw"
    assert "no flush" in t.table()
    assert predict_iteration_time(two, _profile(), cluster, overlap_p2p=False).total_s == pytest.approx(76.0)
    # the schedule can be overridden
    assert predict_iteration_time(two, _profile(), cluster, schedule="1f1b").total_s == pytest.approx(77.0)
    assert predict_iteration_time(flush, _profile(), cluster, schedule="2bw").total_s == pytest.approx(72.0)
    assert pipeline_seconds([18.0, 3.0], [2.0], 4, flush=False) == pytest.approx(72.0)


def test_2bw_cost_model_agrees_with_the_2bw_planner() -> None:
    """The planner's closed form (search/time/pipedream_2bw.py) and the cost model's "2bw" pipeline are one model."""
    from hybridplan.search.time.pipedream_2bw import plan_pipedream_2bw

    cluster = _cluster(1, 2, 1e3, 1e3)
    candidates = plan_pipedream_2bw(_profile(), cluster, 8)
    assert candidates
    for c in candidates:
        assert c.plan.schedule == "2bw"
        if not c.recompute:
            assert predict_iteration_time(c.plan, _profile(), cluster).total_s == pytest.approx(c.iteration_s)


def test_zero_and_recompute_terms_by_hand() -> None:
    """[Note: ZeRO and recompute in time], worked by hand. One data x2 stage over the three layers, 8 samples in 4
    micro-batches: a replica computes 1 sample per micro-batch, (1 + 2 + 0.5) forward + 7 backward = 10.5 s; the
    gradients are 300 B (the tied embedding once). Over two nodes of one device (10 B/s between them) the ring
    all-reduce A = 2 (2-1)/2 * 300 / 10 = 30 s; on one node of two (1000 B/s) 0.3 s.
    - plain: T = (4-1) 10.5 + 10.5 + A = 42 + 30 = 72; on one node 42.3 (the crossing stage syncs at 10 B/s);
    - ZeRO-1: the all-reduce and the broadcast of the updated halves, 1.5 A: 42 + 45 = 87;
    - ZeRO-2: A per micro-batch inside t: t = 40.5, T = 4 * 40.5 = 162, nothing at the end;
    - ZeRO-3: 1.5 A per micro-batch: t = 55.5, T = 222;
    - recompute: the forward again per micro-batch: t = 14, T = 56 + 30 = 86."""
    def stage(zero: int = 0, recompute: str = "none", devices: tuple[int, ...] = (0, 1)) -> Plan:
        return Plan("1f1b", 8, 4, (StagePlan(0, 3, "data", 2, devices, {}, 0, zero, recompute),))  # type: ignore[arg-type]

    across, inside = _cluster(2, 1, 1000.0, 10.0), _cluster(1, 2, 1000.0, 10.0)
    profile = _profile()
    t = {z: predict_iteration_time(stage(z), profile, across) for z in range(4)}
    assert [t[z].total_s for z in range(4)] == pytest.approx([72.0, 87.0, 162.0, 222.0])
    assert [t[z].sync_s for z in range(4)] == pytest.approx([30.0, 45.0, 0.0, 0.0])
    assert [t[z].stages[0].shard_comm_s for z in range(4)] == pytest.approx([0.0, 0.0, 30.0, 45.0])
    assert predict_iteration_time(stage(), profile, inside).total_s == pytest.approx(42.3)
    recomputed = predict_iteration_time(stage(recompute="full"), profile, across)
    assert recomputed.stages[0].recompute_s == pytest.approx(3.5) and recomputed.total_s == pytest.approx(86.0)
    assert "+ recompute 3500.00 ms" in recomputed.table() and recomputed.to_dict()["stages"][0]["recompute_s"] == 3.5


# ------------------------------------------------------------------ per-message latency ([Note: per-message latency])
def _latency_profile(links: LinkCosts | None, tensors: bool = True) -> TimeProfile:
    """_profile() with parameter tensor counts (embed 2, block 12, head 3, shared with embed) and measured links."""
    counts = (2, 12, 3) if tensors else (None, None, None)
    base = _profile()
    return dataclasses.replace(base, links=links, layers=tuple(
        dataclasses.replace(layer, parameter_tensors=n) for layer, n in zip(base.layers, counts)))


_DATA_THEN_ONE = [(0, 2, "data", [0, 1]), (2, 3, "none", [2])]
"""stage 0: data x2 on devices 0, 1 (layers 0, 1); stage 1: device 2 (layer 2); 4 micro-batches of 2 samples."""


def test_message_counts_of_a_small_plan_by_hand() -> None:
    plan = _plan(_DATA_THEN_ONE)
    t = predict_iteration_time(plan, _latency_profile(None), _cluster(1, 3, 1000.0, 1000.0))
    # p2p: forward, each replica sends its half of a micro-batch to device 2 (2 messages); backward, device 2 sends
    # each replica its half of the gradient (2 messages): 4 per micro-batch, x 4 micro-batches = 16 per iteration.
    # sync: stage 0 holds embed (2 tensors) and block (12): 14 all-reduces, each a ring of 2 (2 - 1) = 2 steps: 28.
    assert [s.p2p_messages for s in t.stages] == [16, 0]
    assert [s.sync_messages for s in t.stages] == [28, 0]
    # a plain pipeline: one message per direction per micro-batch; no sync
    pipe = predict_iteration_time(_plan([(0, 2, "none", [0]), (2, 3, "none", [1])]), _latency_profile(None),
                                  _cluster(1, 2, 1000.0, 1000.0))
    assert [s.p2p_messages for s in pipe.stages] == [8, 0] and [s.sync_messages for s in pipe.stages] == [0, 0]


def test_latency_terms_by_hand() -> None:
    # One node of 3 devices at 1000 B/s; M = 2 samples, 4 micro-batches.
    # stage 0 (data x2, 1 sample per replica): t0 = (1 + 2) + (2 + 4) = 9 s; stage 1 (2 samples): (0.5 + 1) * 2 = 3 s.
    # measured: all-reduce alpha 0.01 s per ring step, send/recv alpha 0.1 s, bandwidths not measured.
    # e = 2 directions * M * 5 B / 1000 B/s (the single device receives the whole micro-batch) = 0.02 s,
    #     + one alpha per direction = 0.2 s -> 0.22 s.
    # sync = ring of 300 B over 2 = 2 * 1 / 2 * 300 / 1000 = 0.3 s, + 28 steps * 0.01 s = 0.28 s -> 0.58 s.
    # pipeline: 1F1B holds 2 micro-batches on stage 0; period max(9, 0.11, (12 + 0.22) / 2) = 9:
    #     3 * 9 + 12 + 0.22 = 39.22; T = 39.22 + 0.58 = 39.80.
    links = LinkCosts(backend="gloo", allreduce_latency_s=0.01, allreduce_bandwidth=None, p2p_latency_s=0.1, p2p_bandwidth=None)
    plan = _plan(_DATA_THEN_ONE)
    t = predict_iteration_time(plan, _latency_profile(links), _cluster(1, 3, 1000.0, 1000.0))
    assert t.stages[0].p2p_s == pytest.approx(0.22) and t.stages[0].p2p_latency_s == pytest.approx(0.2)
    assert t.stages[0].sync_s == pytest.approx(0.58) and t.stages[0].sync_latency_s == pytest.approx(0.28)
    assert t.total_s == pytest.approx(39.80)
    # the cluster file's latency wins over the measured one, for both kinds: 0.05 s per message.
    # e = 0.02 + 2 * 0.05 = 0.12; sync = 0.3 + 28 * 0.05 = 1.7; T = 27 + 12 + 0.12 + 1.7 = 40.82
    given = _cluster(1, 3, 1000.0, 1000.0).with_latencies(0.05, None)
    assert predict_iteration_time(plan, _latency_profile(links), given).total_s == pytest.approx(40.82)
    # a measured bandwidth caps the cluster's: send/recv at 100 B/s: e = 2 * 2 * 5 / 100 + 0.2 = 0.4;
    # T = 27 + 12 + 0.4 + 0.58 = 39.98
    capped = dataclasses.replace(links, p2p_bandwidth=100.0)
    assert predict_iteration_time(plan, _latency_profile(capped), _cluster(1, 3, 1000.0, 1000.0)).total_s == pytest.approx(39.98)


def test_a_profile_without_links_charges_no_latency() -> None:
    # AMP's model: e = 0.02, sync = 0.3: T = 27 + 12 + 0.02 + 0.3 = 39.32, as before latencies existed
    plan = _plan(_DATA_THEN_ONE)
    t = predict_iteration_time(plan, _latency_profile(None, tensors=False), _cluster(1, 3, 1000.0, 1000.0))
    assert t.total_s == pytest.approx(39.32) and t.stages[0].sync_latency_s == 0.0 and t.stages[0].p2p_latency_s == 0.0
    assert "per-message latency" not in t.table()
    # with a cluster latency and no tensor counts, each layer with parameters counts one tensor: 2 all-reduces
    # x 2 steps x 0.05 = 0.2 s of sync latency
    t = predict_iteration_time(plan, _latency_profile(None, tensors=False), _cluster(1, 3, 1000.0, 1000.0).with_latencies(0.05, None))
    assert t.stages[0].sync_latency_s == pytest.approx(0.2) and "per-message latency" in t.table()


@pytest.mark.parametrize("d1, t1, d2, t2", [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 4, 1), (2, 2, 3, 1), (4, 1, 6, 2), (3, 2, 2, 2)])
def test_message_count_is_what_the_runtime_routes(d1: int, t1: int, d2: int, t2: int) -> None:
    # the closed form of p2p_messages against runtime/routing.py's route, the transfers the executor posts
    from hybridplan.runtime.routing import layout_of, route

    def stage(start: int, d: int, t: int, first: int) -> StagePlan:
        kind = "data+tensor" if d > 1 and t > 1 else "data" if d > 1 else "tensor" if t > 1 else "none"
        return StagePlan(start, start + 1, kind, d * t, tuple(range(first, first + d * t)), {}, t if kind == "data+tensor" else 0)

    a, b = stage(0, d1, t1, 0), stage(1, d2, t2, d1 * t1)
    rows = d1 * d2 * 2
    routed = len(route(layout_of(a), layout_of(b), rows)) + len(route(layout_of(b), layout_of(a), rows))
    assert p2p_messages(a, b, 3) == 3 * routed


def test_sync_count_is_what_the_runtime_all_reduces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data-parallel sync's collectives counted by the model against the executor's calls of
    collectives.all_reduce in a simulated run (runtime/sim.py runs the executor's own code on fake tensors)."""
    from hybridplan import collectives
    from hybridplan.models.zoo import resolve_model
    from hybridplan.profiling.timing import layer_infos
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    mlp = "tests.cli.user_models:mlp"  # Linear, ReLU, Linear, ReLU, Linear: a weight and a bias each, 6 tensors
    calls: list[tuple[int, ...]] = []
    real = collectives.all_reduce
    monkeypatch.setattr(collectives, "all_reduce", lambda t, group=None: calls.append(tuple(t.shape)) or real(t, group=group))
    stage = StagePlan(0, 5, "data", 2, (0, 1))
    result = launch(RunConfig(model=mlp, plan=Plan("1f1b", 8, 2, (stage,)), cluster=Cluster.parse("1x2"), iterations=3,
                              backend="sim", track_memory=False))
    assert result.ok
    per_iteration = len(calls) / 3  # one device simulated (both replicas run the same code)
    profile = dataclasses.replace(_profile(), layers=layer_infos(resolve_model(mlp)), timings=(TimingTable(
        device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=(1.0,) * 5, backward_s=(1.0,) * 5),))
    assert per_iteration == 6 == sync_messages(profile, stage) / (2 * (2 - 1))


def test_one_microbatch_pipeline_term_is_the_round_trip_even_with_an_infinite_bottleneck() -> None:
    """With one micro-batch there is no steady state (eq. 5's (m - 1) U term is 0): an infinite bottleneck (a stage
    option that does not fit, in the option tables of search/time/stage_options.py) gave 0 x inf = nan, which
    compares false with everything; the term is the round trip."""
    import numpy as np

    from hybridplan.predict.time_model import pipeline_seconds_from

    out = pipeline_seconds_from(np.array([2.0, np.inf]), np.array([5.0, 7.0]), 1)
    assert out.tolist() == [5.0, 7.0]
    assert pipeline_seconds_from(np.inf, 3.0, 2).tolist() == np.inf  # more micro-batches: the bottleneck counts
    assert float(pipeline_seconds_from(2.0, 5.0, 3)) == 2 * 2.0 + 5.0


def test_a_selectively_recomputed_stage_is_refused_with_bounds_to_use() -> None:
    plan = _plan([(0, 2, "none", [0]), (2, 3, "none", [1])])
    selective = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], recompute="selective"),
                                                  plan.stages[1]))
    predict_iteration_time(plan, _profile(), _cluster(1, 2, 10.0, 10.0))  # the same plan without it is predicted
    with pytest.raises(ProfileError, match=r"stage 0 .* recomputes selectively .* not modelled"):
        predict_iteration_time(selective, _profile(), _cluster(1, 2, 10.0, 10.0))
