"""Running one profiling run (profiling/execution.py): the stage a failure names, a launcher's result collected,
database rows of a run, and simulated stages that give the bytes a whole simulated run gives."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from hybridplan.models.boundaries import boundary_specs
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.profiling.execution import RunOutcome, failed_stage, measurements_of, run_plan, simulate_stages
from hybridplan.profiling.quantities import quantities_from_timeline
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from tests.cli.conftest import MLP

TIMELINE = [{"action": "F0", "before": 100, "peak": 130, "after": 120}, {"action": "B0", "before": 120, "peak": 150, "after": 110},
            {"action": "step", "before": 110, "peak": 115, "after": 110}]


def _plan(schedule: str = "1f1b", micro: int = 4) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 16, "num_microbatches": micro, "stages": [
        {"layers": [0, 2], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [2, 3], "parallelism": "tensor", "degree": 2, "devices": [1, 2]},
        {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]})


def test_the_stage_a_failure_names():
    assert failed_stage("device 3 (stage 1): DeviceOutOfMemory: out of memory") == 1
    assert failed_stage("device 12 (stage 10): RuntimeError") == 10
    assert failed_stage("timed out after 900 s") is None and failed_stage(None) is None
    assert RunOutcome("oom", "device 0 (stage 2): x").failed_stage == 2


@dataclass
class _Device:
    device: int
    stage: int
    peak_memory_bytes: int
    timeline: list = field(default_factory=list)


def test_a_launchers_result_is_collected_device_by_device():
    seen = []

    def execute(plan, cluster):
        seen.append((plan, cluster))
        return SimpleNamespace(status="ok", reason=None, devices=[_Device(0, 0, 7), {"device": 1, "stage": 1, "peak_memory_bytes": 9}])

    plan, cluster = _plan(), Cluster.parse("1x4")
    outcome = run_plan(plan, cluster, execute)
    assert seen == [(plan, cluster)]
    assert outcome == RunOutcome("ok", None, [{"device": 0, "stage": 0, "peak_memory_bytes": 7, "timeline": []},
                                              {"device": 1, "stage": 1, "peak_memory_bytes": 9}])
    failed = run_plan(plan, cluster, lambda p, c: SimpleNamespace(status="failed", reason="boom", devices=[_Device(0, 0, 7)]))
    assert failed == RunOutcome("failed", "boom", [])  # a failed run measured nothing


def test_a_cuda_runs_tensor_and_reserved_peaks_go_to_the_database_rows():
    cuda = {"device": 0, "stage": 0, "peak_memory_bytes": 150, "static_memory_bytes": 100, "data_bytes": 8,
            "timeline": TIMELINE, "reserved_peak_bytes": 2097152}
    cpu = {**cuda, "device": 2, "stage": 1, "reserved_peak_bytes": None}
    outcome = run_plan(_plan(), Cluster.parse("1x4"), lambda p, c: SimpleNamespace(status="ok", reason=None, devices=[cuda, cpu]))
    assert [r["reserved"] for r in measurements_of(outcome, _plan(), 16)] == [(150, 2097152), None]


def test_a_simulated_cuda_stage_records_the_peaks_of_its_own_two_micro_batches():
    """The reserved peak cannot be replayed to 4 micro-batches as the tensor peak is: a simulated profiling run keeps
    the tensor and reserved peaks of its two micro-batches, those of a whole simulated run of 2 micro-batches."""
    plan, cluster, model = _plan(), Cluster.parse("1x4", device_type="cuda"), get_model(MLP)
    options = {"backend": "sim", "device_type": "cuda"}
    outcome = simulate_stages(plan, cluster, {(0, 2)}, model=model, seed=0, iterations=2, run_options=options,
                              specs=boundary_specs(model))
    short = Plan(plan.schedule, 8, 2, plan.stages, plan.extra)
    whole = {d.device: d for d in launch(RunConfig(model=MLP, plan=short, cluster=cluster, iterations=2, **options)).devices}
    assert [d["reserved"] for d in outcome.devices] == [(whole[0].peak_memory_bytes, whole[0].reserved_peak_bytes)]
    assert whole[0].reserved_peak_bytes == 66 * 2**20  # two 32 MiB workspace segments and one 2 MiB small segment


def test_the_database_rows_of_a_run():
    outcome = RunOutcome("ok", None, [
        {"device": 0, "stage": 0, "peak_memory_bytes": 150, "static_memory_bytes": 100, "data_bytes": 8, "timeline": TIMELINE},
        {"device": 2, "stage": 1, "peak_memory_bytes": 150, "static_memory_bytes": 100, "data_bytes": 0, "timeline": TIMELINE}])
    rows = measurements_of(outcome, _plan(), 16)
    assert [(r["device"], r["stage"], r["start"], r["stop"], r["kind"], r["degree"]) for r in rows] == [
        (0, 0, 0, 2, "none", 1), (2, 1, 2, 3, "tensor", 2)]
    assert all(r["batch_size"] == 16 and r["microbatch_size"] == 4 and r["peak"] == 150 for r in rows)
    assert list(rows[0]["quantities"]) == list(quantities_from_timeline(100, 8, TIMELINE))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_simulated_stages_give_the_bytes_of_the_whole_simulated_run(schedule):
    """Two micro-batches simulated, data scaled and the peak replayed at 4 ([Note: two micro-batches suffice on
    simulated devices]): every device of a measured stage as in the whole run of 4 micro-batches."""
    plan, cluster, model = _plan(schedule), Cluster.parse("1x4"), get_model(MLP)
    outcome = simulate_stages(plan, cluster, {(0, 2), (3, 5)}, model=model, seed=0, iterations=2,
                              run_options={"backend": "sim"}, specs=boundary_specs(model))
    whole = launch(RunConfig(model=MLP, plan=plan, cluster=cluster, iterations=2, backend="sim"))
    assert outcome.status == "ok" and whole.ok
    assert [d["device"] for d in outcome.devices] == [0, 3]  # one device of each stage asked for
    runs = {d.device: d for d in whole.devices}
    for d in outcome.devices:
        assert (d["peak_memory_bytes"], d["data_bytes"]) == (runs[d["device"]].peak_memory_bytes, runs[d["device"]].data_bytes)


def test_a_simulated_stage_out_of_memory_names_its_device_and_stage():
    model = get_model(MLP)
    outcome = simulate_stages(_plan(), Cluster.parse("1x4", device_memory="1KiB"), {(3, 5)}, model=model, seed=0,
                              iterations=2, run_options={"backend": "sim"}, specs=boundary_specs(model))
    assert outcome.status == "oom" and outcome.reason.startswith("device 3 (stage 2): DeviceOutOfMemory")
    assert outcome.failed_stage == 2 and outcome.devices == []
