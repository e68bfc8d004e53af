"""[Note: a data x tensor stage is a tensor stage at a smaller batch] (predict/memory.py): a "data+tensor" stage is
predicted from the tensor scenario's statistics, and the prediction equals what the simulated runtime measures
(byte-exact: simulated devices are byte-identical to the real CPU runtime, tests/runtime/test_sim_agreement.py)."""

from __future__ import annotations

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP


def _plan(schedule: str, stages: list[dict]) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 32, "num_microbatches": 2, "stages": stages})


DT = {"parallelism": "data+tensor", "degree": 4, "tensor_degree": 2}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages", [
    [{"layers": [0, 2], **DT, "devices": [0, 1, 2, 3]}, {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}],
    [{"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]}, {"layers": [3, 5], **DT, "devices": [2, 3, 4, 5]}],
])
def test_data_tensor_predictions_equal_the_simulated_runtime(mlp_files, schedule, stages):
    plan = _plan(schedule, stages)
    report = validate_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    assert [(r.predicted, r.measured) for r in report.rows] == [(r.measured, r.measured) for r in report.rows]


def test_a_data_tensor_stage_is_its_tensor_stage_at_the_replica_batch(mlp_files):
    """By hand: replica micro-batches of 16 / 2 = 8 rows, as a tensor x2 stage of a global batch of 16."""
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    composite = _plan("1f1b", [{"layers": [0, 2], **DT, "devices": [0, 1, 2, 3]},
                               {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}])
    tensor = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [2]}]})
    assert predictor.predict(composite).devices[0].peak_memory_bytes == predictor.predict(tensor).devices[0].peak_memory_bytes
    # the pipeline-only stage after it still sees the whole batch
    assert predictor.predict(composite).devices[4].peak_memory_bytes != predictor.predict(tensor).devices[2].peak_memory_bytes
