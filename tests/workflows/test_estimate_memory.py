"""The one-shot estimate: each device's peak must equal a whole-plan simulation of every device (runtime/sim.py
``simulate(distinct_only=False)``, the reference the stage cache is an argument about), and the candidates are the
uniform grids the model runs, counted by hand."""

from __future__ import annotations

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.gpu_memory import LIBRARY_BYTES
from hybridplan.runtime.sim import simulate
from hybridplan.workflows.estimate_memory import candidate_plans, estimate_plans
from tests.cli.conftest import MIXED, MLP

CLUSTER = Cluster.parse("1x4")


def _simulate(plan: Plan, **options):
    return simulate(RunConfig(model=MLP, plan=plan, cluster=CLUSTER, iterations=2, backend="sim", **options),
                    distinct_only=False)


def _reference(plan: Plan, **options) -> dict[int, int]:
    return {d.device: d.peak_memory_bytes for d in _simulate(plan, **options).devices}


def test_a_plan_equals_its_whole_simulation():
    plan = Plan.from_dict(MIXED)
    lines: list[str] = []
    [estimate] = estimate_plans(MLP, CLUSTER, [plan], progress=lines.append)
    assert {d.device: d.peak_memory_bytes for d in estimate.devices} == _reference(plan)
    assert sum("simulated stage" in line for line in lines) == 3  # 3 distinct stages, each once
    assert estimate.peak_memory_bytes == max(_reference(plan).values())


def test_cuda_terms_and_overhead():
    plan = Plan.from_dict(MIXED)
    [estimate] = estimate_plans(MLP, CLUSTER, [plan], run_options={"device_type": "cuda"})
    assert {d.device: d.peak_memory_bytes for d in estimate.devices} == _reference(plan, device_type="cuda")
    assert all(d.peak_memory_bytes % 512 == 0 for d in estimate.devices)  # CUDA blocks (runtime/gpu_memory.py)
    # Outside the tensors: what the whole simulation's devices hold (the MLP loads cuBLAS only), or up to the
    # attention and cuDNN kernels more (the estimate, like the predictor, counts every library).
    whole = {d.device: d.overhead_bytes for d in _simulate(plan, device_type="cuda").devices}
    unused = LIBRARY_BYTES["attention"] + LIBRARY_BYTES["cudnn"]
    assert all(whole[d.device] <= d.overhead_bytes <= whole[d.device] + unused for d in estimate.devices)
    # the allocator's reserved peak, as the whole simulation replays it, and the total that must fit = reserved +
    # outside: 66 MiB by hand on every device (two 32 MiB cuBLAS workspace segments, one 2 MiB small segment for
    # the 1 MiB cuBLASLt workspace and the MLP's few KiB: tests/cli/test_predict.py)
    reserved = {d.device: d.reserved_peak_bytes for d in _simulate(plan, device_type="cuda").devices}
    assert {d.device: d.reserved_peak_bytes for d in estimate.devices} == reserved == {d: 66 * 2**20 for d in range(4)}
    assert all(d.total_bytes == d.reserved_peak_bytes + d.overhead_bytes for d in estimate.devices)
    assert not estimate.fits(Cluster.parse("1x4", device_memory=str(max(d.total_bytes for d in estimate.devices) - 1)))
    assert estimate.fits(Cluster.parse("1x4", device_memory=str(max(d.total_bytes for d in estimate.devices))))


def test_zero_stages_are_simulated_whole():
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 24, "num_microbatches": 2, "stages": [
        {"layers": [0, 3], "parallelism": "data", "degree": 3, "devices": [0, 1, 2], "zero": 1},
        {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]})
    [estimate] = estimate_plans(MLP, CLUSTER, [plan])
    assert {d.device: d.peak_memory_bytes for d in estimate.devices} == _reference(plan)


def test_candidates_are_the_uniform_grids_the_model_runs():
    plans = candidate_plans(MLP, CLUSTER, global_batch_size=16, num_microbatches=2)
    grids = sorted((p.num_stages, p.stages[0].data_degree, p.stages[0].tensor_degree) for p in plans)
    # pp x dp x tp = 4 with tp in {1, 2, 4}; tp 4 is out: the last Linear has 10 outputs, not divisible by 4
    assert grids == [(1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert [p.boundaries for p in plans if p.num_stages == 4] == [(0, 2, 3, 4, 5)]  # 5 layers: 2, 1, 1, 1


def test_no_candidate_names_why():
    from hybridplan.errors import PlanError

    # 7 devices: pipeline 1 x data 7 (a micro-batch of 1 sample does not split 7 ways) or tensor 7 (32 outputs
    # do not split 7 ways); 7 stages exceed the 5 layers
    with pytest.raises(PlanError, match="no uniform plan of .* runs on 1x7"):
        candidate_plans(MLP, Cluster.parse("1x7"), global_batch_size=2, num_microbatches=2)


def _zero_plan(zero: int, kind: str, degree: int, **extra) -> Plan:
    """gpt-tiny: the embedding and two blocks (every kind of parameter a block has) as the ZeRO stage, the rest on one
    device. The ZeRO stage is short: every one of its devices is simulated, at a cost that grows with its layers."""
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": 12 * degree, "num_microbatches": 2, "stages": [
        {"layers": [0, 3], "parallelism": kind, "degree": degree, "devices": list(range(degree)), "zero": zero, **extra},
        {"layers": [3, 10], "parallelism": "none", "degree": 1, "devices": [degree]}]})


@pytest.mark.parametrize("plan", [
    pytest.param(_zero_plan(3, "data", 3), id="zero3-d3-uneven-rows"),
    pytest.param(_zero_plan(1, "data+tensor", 4, tensor_degree=2), id="zero1-d2-t2"),
    pytest.param(_zero_plan(3, "data+tensor", 4, tensor_degree=2), id="zero3-d2-t2"),
])
def test_zero_devices_with_equal_shares_are_simulated_once(plan: Plan) -> None:
    """[Note: equal ZeRO shares]: every device of the plan, simulated, equals its representative's report, which is
    what ``simulate`` gives by default."""
    from dataclasses import replace

    from hybridplan.runtime.zero_shares import zero_representatives

    cluster = Cluster.uniform(1, plan.num_devices, device_type="cuda")
    cfg = RunConfig(model="gpt-tiny", plan=plan, cluster=cluster, iterations=2, backend="sim", device_type="cuda")
    same = zero_representatives("gpt-tiny", plan)
    every = {d.device: replace(d, iteration_seconds=[]) for d in simulate(cfg, distinct_only=False).devices}
    fewer = {d.device: replace(d, iteration_seconds=[]) for d in simulate(cfg, same_as=same).devices}
    default = {d.device: replace(d, iteration_seconds=[]) for d in simulate(cfg).devices}
    assert fewer == every == default
    stage = plan.stages[0]
    representatives = {same[r] for r in stage.devices}
    if stage.zero == 1:
        assert len(representatives) == stage.data_degree
    elif stage.data_degree == 2:  # gpt-tiny's dimensions are even: every rank's rows are equal
        assert len(representatives) == 1
    else:  # 3 does not divide them: the last rank's rows differ
        assert 1 < len(representatives) <= 3
