"""[Note: a data stage wider than the profiled ones] (predict/memory.py): a data stage above every profiled data
degree (data x4 from a profile whose data degrees stop at 2, as data x8 across two 4-device nodes is) is predicted
as the data x2 stage at the global batch B * 2 / 4, and equals what the simulated runtime measures.

Tolerance, derived: none. Each of the 4 replicas runs what a replica of data x2 runs on the same 32 / 2 / 4 = 4
rows per micro-batch; the composed data x2 stage is then at a global batch of 16 in micro-batches of 8, one of the
two sizes the profile measured (B/2 and B/4 of 32), so the batch fit adds nothing; and the data x2 prediction of
the whole MLP (the one data span a 1x2 profile measures) is exact on simulated devices. ZeRO-1's shares for 4
ranks come from the parameter shapes, exactly as for a profiled degree, so it errs as ZeRO-1 does there."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridplan.errors import ProfileError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP


def _plan(schedule: str, zero: int, degree: int = 4) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 8 * degree, "num_microbatches": 2, "stages": [
        {"layers": [0, 5], "parallelism": "data", "degree": degree, "devices": list(range(degree)),
         **({"zero": zero} if zero else {})}]})


def _errors(db: Path, plan: Plan) -> list[int]:
    report = validate_plan(db, plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    return [r.predicted - r.measured for r in report.rows]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_data_stage_above_the_profiled_degrees_equals_the_simulated_runtime(sharded_mlp_files, schedule):
    db = sharded_mlp_files / "p.sqlite"
    assert MemoryPredictor.from_db(db).profiled_degrees("data") == [2]  # nothing to fit a degree 4 from
    assert _errors(db, _plan(schedule, 0)) == [0, 0, 0, 0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero1_above_the_profiled_degrees_errs_as_zero1_at_the_profiled_degree(sharded_mlp_files, schedule):
    """ZeRO-1 over 4 ranks from the data x2 stage: the rank holding the 32 x 32 weight's state (rank 0 at both
    degrees: shares are dealt largest first) steps the stage's largest temporaries, whose composition from span
    statistics is ZeRO-1's own error at the profiled degree (tests/predict/test_zero_stage.py); the composition across
    degrees adds nothing to it: rank 0 errs exactly as at x2 (same rows per replica), no rank more."""
    db = sharded_mlp_files / "p.sqlite"
    wide, profiled = _errors(db, _plan(schedule, 1)), _errors(db, _plan(schedule, 1, degree=2))
    assert wide[0] == profiled[0]
    assert max(map(abs, wide)) <= max(map(abs, profiled))


def test_zero3_above_the_profiled_degrees_is_refused(sharded_mlp_files):
    predictor = MemoryPredictor.from_db(sharded_mlp_files / "p.sqlite")
    assert predictor.stage_memory(0, 5, "data", 4, 0, zero=3) == float("inf")  # the search leaves it out
    with pytest.raises(ProfileError, match=r"ZeRO-3 over 4 devices is above the profiled ZeRO-3 degrees \[2\]"):
        predictor.predict(_plan("1f1b", 3))


def test_the_capture_method_keeps_seed_000s_degree_fit(sharded_mlp_files):
    """Seed 000 fits degrees through two profiled ones; with one, it cannot predict data x4 at all."""
    predictor = MemoryPredictor.from_db(sharded_mlp_files / "p.sqlite", method="capture")
    assert predictor.stage_memory(0, 5, "data", 4, 0) == float("inf")
