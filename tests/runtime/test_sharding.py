"""ZeRO-sharded data and data x tensor stages (runtime/sharding.py) train the same math as one device (real processes,
gloo), hold what ZeRO says they hold (1/d of the optimizer state, then of the gradients and parameters,
counted by the exact CPU tracker), and the simulated devices count them byte for byte as the real runtime."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from hybridplan.errors import UsageError
from hybridplan.models import get_model
from hybridplan.models.base import build_layers
from hybridplan.plan import Cluster, Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from tests.runtime.util import assert_same_training, single_device

pytestmark = pytest.mark.distributed


def plan_of(schedule: str, batch: int, micro: int, stages: list[tuple[int, int, str, list[int], dict[str, Any]]]) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch, "num_microbatches": micro, "stages": [
        {"layers": [a, b], "parallelism": kind, "degree": len(devs), "devices": devs, **more}
        for a, b, kind, devs, more in stages]})


def zero_plan(zero: int, schedule: str = "1f1b") -> Plan:
    """gpt-tiny: layers 0-2 (the embedding and two blocks) as 2 replicas (sharded at ``zero``), layers 3-9 on one
    device. The sharded stage is short: FSDP's cost on simulated devices grows with its layers."""
    return plan_of(schedule, 16, 4, [(0, 3, "data", [0, 1], {"zero": zero} if zero else {}), (3, 10, "none", [2], {})])


@functools.cache
def _trained(plan: Plan, cluster: str) -> Any:
    """The real run of ``plan`` on gpt-tiny (3 iterations), asserted to train as one device does, once per module:
    a plan checked here and measured by a test below (``runs``, the ZeRO-1 data x tensor statics) is run once."""
    return assert_same_training("gpt-tiny", plan, cluster)


@pytest.mark.parametrize("zero, schedule", [(1, "1f1b"), (2, "gpipe"), (3, "1f1b")])
def test_gpt_zero_stage_then_pipeline_trains_the_same(zero, schedule):
    _trained(zero_plan(zero, schedule), "1x3")


def test_conv_zero3_replicas_across_nodes_then_data_gpipe():
    """Wide-ResNet (convolutions, GroupNorm): a ZeRO-3 stage whose 2 replicas are on different nodes, then an
    unsharded data stage across the same nodes."""
    plan = plan_of("gpipe", 16, 4, [(0, 3, "data", [0, 2], {"zero": 3}), (3, 7, "data", [1, 3], {})])
    assert_same_training("wresnet-tiny", plan, "2x2")


def test_gpt_tensor_stage_then_zero1_replicas_1f1b():
    plan = plan_of("1f1b", 16, 4, [(0, 4, "tensor", [0, 1], {}), (4, 10, "data", [2, 3], {"zero": 1})])
    assert_same_training("gpt-tiny", plan, "1x4")


def test_zero2_with_recompute_trains_the_same():
    plan = plan_of("1f1b", 16, 4, [(0, 5, "none", [0], {}), (5, 10, "data", [1, 2], {"zero": 2, "recompute": "full"})])
    assert_same_training("gpt-tiny", plan, "1x3")


def data_x_tensor_then_device(zero: int) -> Plan:
    """gpt-tiny: layers 0-2 (the embedding and two blocks) as 2 replicas of a tensor x2 group (sharded at ``zero``),
    layers 3-9 on one device; 1F1B. The sharded stage is short: on simulated devices its cost grows with its
    layers (tensor-parallel shards on fake tensors), and two blocks show every kind of split a block has."""
    more = {"tensor_degree": 2, "zero": zero} if zero else {"tensor_degree": 2}
    return plan_of("1f1b", 16, 4, [(0, 3, "data+tensor", [0, 1, 2, 3], more), (3, 10, "none", [4], {})])


def device_then_data_x_tensor(zero: int) -> Plan:
    """gpt-tiny: layers 0-6 on one device, then layers 7-9 (two blocks and the head) as 2 replicas of a tensor x2
    group sharded at ``zero``; GPipe. Short, as :func:`data_x_tensor_then_device`'s sharded stage."""
    more = {"tensor_degree": 2, "zero": zero} if zero else {"tensor_degree": 2}
    return plan_of("gpipe", 16, 4, [(0, 7, "none", [0], {}), (7, 10, "data+tensor", [1, 2, 3, 4], more)])


def test_gpt_zero1_data_x_tensor_stage_then_pipeline_trains_the_same():
    """Megatron-style: 2 replicas of a tensor x2 group whose optimizer state is sharded per tensor rank."""
    _trained(data_x_tensor_then_device(1), "1x5")


@functools.cache
def _simulated(plan: Plan, cluster: str) -> Any:
    """The simulated fp32 run of ``plan`` for 3 iterations (as many as ``_trains_like_one_bf16_device``'s runs), once
    per module: the same plan's simulation serves the fp32 check of its training and the bf16 check of its masters."""
    sim = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=3, backend="sim"))
    assert sim.ok, sim.reason
    return sim


def _sim_counts_as(real: Any, plan: Plan, cluster: str) -> Any:
    """The simulated run of ``plan`` (as many iterations as ``real``): asserted to count every device's bytes
    as the real run ``real`` did; returned."""
    sim = _simulated(plan, cluster)
    for r, f in zip(real.devices, sim.devices, strict=True):
        assert (f.static_memory_bytes, f.iteration_peaks, f.peak_breakdown) == \
            (r.static_memory_bytes, r.iteration_peaks, r.peak_breakdown)
    return sim


def test_gpt_zero3_data_x_tensor_stage_then_tensor_stage_1f1b_trains_the_same():
    """FSDP2 over the data dimension of the stage's 2-D (data, tensor) mesh, on top of the tensor-parallel
    DTensor shards; then a plain tensor stage. The simulated devices count it as the runtime does."""
    plan = plan_of("1f1b", 16, 4, [(0, 3, "data+tensor", [0, 1, 2, 3], {"tensor_degree": 2, "zero": 3}),
                                   (3, 10, "tensor", [4, 5], {})])
    _sim_counts_as(assert_same_training("gpt-tiny", plan, "1x6"), plan, "1x6")


def test_zero2_data_x_tensor_stage_gpipe_trains_the_same_and_keeps_half_of_each_tensor_shard():
    """A device, then 2 replicas of a tensor x2 group under ZeRO-2. Each rank holds half of its tensor
    shard's parameters and AdamW moments (a tensor rank's static bytes unsharded are 3 P_t + 4 n: shard,
    two moments, a 4-byte step count per tensor; sharded over 2 replicas P_t / 2 + P_t + 4 n)."""
    zero2 = device_then_data_x_tensor
    sim = _sim_counts_as(assert_same_training("gpt-tiny", zero2(2), "1x5"), zero2(2), "1x5")
    plain = launch(RunConfig(model="gpt-tiny", plan=zero2(0), cluster=Cluster.parse("1x5"), iterations=2, backend="sim"))
    assert plain.ok, plain.reason
    n = sum(1 for layer in build_layers(get_model("gpt-tiny"), 7, 10, 0) for _ in layer.parameters())
    for unsharded, sharded in zip(plain.devices[1:], sim.devices[1:], strict=True):
        assert sharded.static_memory_bytes == (unsharded.static_memory_bytes - 4 * n) // 2 + 4 * n
    assert sim.devices[0].static_memory_bytes == plain.devices[0].static_memory_bytes


def test_zero1_on_a_data_x_tensor_stage_halves_the_optimizer_state_of_each_shard():
    """The 4 ranks of 2 x tensor x2 hold the same parameter shards as a tensor x2 stage; ZeRO-1 splits their
    AdamW moments between the 2 replicas of each tensor rank: per tensor rank, the two replicas' static bytes
    add up to two parameter shards and one unsharded set of moments and step counts.

    The real ZeRO-1 run is the one test_gpt_zero1_data_x_tensor_stage_then_pipeline_trains_the_same checks (the same
    plan; static bytes, held before the first iteration, do not depend on how many iterations ran)."""
    def statics(zero: int, backend: str = "sim") -> list[int]:
        plan = data_x_tensor_then_device(zero)
        if backend == "real":
            result = _trained(plan, "1x5")
        else:
            result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x5"), iterations=2,
                                      backend=backend))
        assert result.ok, result.reason
        return [d.static_memory_bytes for d in result.devices[:4]]

    plain, sharded = statics(0), statics(1, "sim")
    assert sharded == statics(1, "real")  # the simulated devices count ZeRO-1 of the shards as the runtime does
    for k in (0, 1):  # tensor rank k: devices k and 2 + k
        params_and_state = plain[k]
        assert sharded[k] + sharded[2 + k] < 2 * params_and_state
        assert max(sharded[k], sharded[2 + k]) < params_and_state


@functools.cache
def _bf16_reference() -> tuple[float, ...]:
    """The losses of gpt-tiny's batch of 16 in 4 micro-batches on one bf16 device (GPipe and 1F1B alike)."""
    from tests.runtime.test_precision import _run

    return tuple(_run(single_device(zero_plan(0)), "1x1", precision="bf16").losses)


def _trains_like_one_bf16_device(plan: Plan, cluster: str) -> Any:
    """Run ``plan`` in bf16: losses as tests/runtime/test_precision.py bounds a bf16 plan against one bf16 device
    (sums split and rounded differently: within a quarter of bf16's unit roundoff), and the simulated devices
    count every device as the runtime. Returns the run."""
    from tests.runtime.test_precision import BF16_UNIT_ROUNDOFF, _run

    got = _run(plan, cluster, precision="bf16")
    for a, b in zip(got.losses, _bf16_reference(), strict=True):
        assert abs(a - b) <= BF16_UNIT_ROUNDOFF / 4 * abs(b), (got.losses, _bf16_reference())
    sim = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=3, backend="sim",
                           precision="bf16"))
    assert sim.ok, sim.reason
    assert [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in sim.devices] == \
        [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in got.devices]
    return got


def test_zero1_in_bf16_trains_like_one_bf16_device_and_shards_the_master_copies():
    """ZeRO-1 in mixed precision: each replica keeps the bf16 parameters (2 bytes per element) and, for its share
    only, the fp32 master copy and two fp32 moments (12 bytes per element) and step counts. So the two replicas'
    static bytes add up to 2 x 2 + 12 = 16 bytes per element (4P for P fp32 parameter bytes) and 4 n."""
    got = _trains_like_one_bf16_device(zero_plan(1), "1x3")
    P, n = _stage0_sizes()
    static = [d.static_memory_bytes for d in got.devices[:2]]
    assert sum(static) == 4 * P + 4 * n and static[0] != static[1]


def test_zero1_in_bf16_over_more_ranks_than_parameter_tensors_trains_like_one_bf16_device():
    """gpt-tiny's head (final norm weight and bias, projection: 3 tensors) as a ZeRO-1 stage over 4 ranks: one rank's
    share is empty, and it holds no optimizer state, only the bf16 parameters (the MoE 1.3B lowest-peak plan of
    28 Nov, benchmarks/extension_gain, failed so before: "optimizer got an empty parameter list")."""
    plan = plan_of("1f1b", 16, 4, [(0, 9, "none", [0], {}), (9, 10, "data", [1, 2, 3, 4], {"zero": 1})])
    got = _trains_like_one_bf16_device(plan, "1x5")
    static = sorted(d.static_memory_bytes for d in got.devices[1:])
    bf16_params = 2 * (64 + 64 + 128 * 64)
    assert static[0] == bf16_params  # the empty share: parameters alone
    assert sum(static) == 4 * bf16_params + 12 * (64 + 64 + 128 * 64) + 3 * 4  # + masters, moments, step counts


@pytest.mark.parametrize("plan, cluster", [(zero_plan(3), "1x3"), (device_then_data_x_tensor(2), "1x5")],
                         ids=["zero3-1f1b", "zero2-data-x-tensor-gpipe"])
def test_zero2_and_3_in_bf16_keep_fp32_shards_as_masters(plan, cluster):
    """FSDP2's MixedPrecisionPolicy: the sharded stage stays fp32 (its shards are the master copies) and computes
    in bf16, so each of its devices holds between iterations exactly what the same plan holds in fp32."""
    got = _trains_like_one_bf16_device(plan, cluster)
    fp32 = _simulated(plan, cluster)  # tests above simulated the gpipe plan already
    sharded = plan.stages[0] if plan.stages[0].zero else plan.stages[1]
    for d in sharded.devices:
        assert got.devices[d].static_memory_bytes == fp32.devices[d].static_memory_bytes


def _stage0_sizes() -> tuple[int, int]:
    """Bytes of the fp32 parameters of ``zero_plan``'s sharded stage, and how many parameter tensors they are (from
    the model)."""
    stage = zero_plan(1).stages[0]
    params = [p for layer in build_layers(get_model("gpt-tiny"), stage.start, stage.stop, 0) for p in layer.parameters()]
    assert all(p.shape[0] % 2 == 0 for p in params)  # every shard of 2 is exact: no padding in the oracle
    return sum(4 * p.numel() for p in params), len(params)


@pytest.fixture(scope="module")
def runs() -> dict[int, Any]:
    """``zero_plan(zero)`` run for real at every level (3 iterations), each also checked to train as one device: the
    runs of ZeRO-1 and ZeRO-3 are those test_gpt_zero_stage_then_pipeline_trains_the_same checked (the same plans)."""
    return {zero: _trained(zero_plan(zero), "1x3") for zero in (0, 1, 2, 3)}


def test_each_level_shards_what_zero_says(runs):
    """At the start of an iteration a replica holds parameters and AdamW state (two fp32 moments per
    parameter and a 4-byte step count per tensor): 3P + 4n unsharded; ZeRO-1 splits the moments between
    the replicas; ZeRO-2/3 keep half of the parameters and of the moments each."""
    P, n = _stage0_sizes()
    static = {z: [d.static_memory_bytes for d in r.devices[:2]] for z, r in runs.items()}
    assert static[0] == [3 * P + 4 * n] * 2
    assert sum(static[1]) == 2 * P + 2 * P + 4 * n and max(static[1]) < static[0][0]
    assert static[2] == static[3] == [P // 2 + P + 4 * n] * 2
    stage1 = {z: r.devices[2].peak_memory_bytes for z, r in runs.items()}
    assert len(set(stage1.values())) == 1  # the unsharded stage is not affected


def test_sharding_lowers_the_peak(runs):
    peak = {z: max(d.peak_memory_bytes for d in r.devices[:2]) for z, r in runs.items()}
    assert peak[3] < peak[2] < peak[0] and peak[1] < peak[0]


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_simulated_devices_count_sharded_stages_as_the_runtime(runs, zero):
    sim = _simulated(zero_plan(zero), "1x3")  # as many iterations as ``runs``' (3); ZeRO-3's serves the bf16 test too
    assert sim.ok, sim.reason
    for real, fake in zip(runs[zero].devices, sim.devices, strict=True):
        assert (fake.static_memory_bytes, fake.iteration_peaks, fake.peak_breakdown) == \
            (real.static_memory_bytes, real.iteration_peaks, real.peak_breakdown)


@pytest.mark.parametrize("stage, settings, message", [
    ({"parallelism": "data", "degree": 2, "devices": [0, 1]}, {"schedule": "2bw"}, "with PipeDream-2BW"),
])
def test_what_is_not_sharded_yet_is_refused_before_any_process(stage, settings, message):
    schedule = settings.pop("schedule", "1f1b")
    plan = Plan.from_dict({"schedule": schedule, "global_batch_size": 16, "num_microbatches": 2,
                           "stages": [{"layers": [0, 10], "zero": 1} | stage]})
    with pytest.raises(UsageError, match=message):
        launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(f"1x{stage['degree']}"), **settings))
