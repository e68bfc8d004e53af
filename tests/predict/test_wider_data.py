"""[Note: a data stage wider than the profiled ones] (predict/memory.py): a data stage above every profiled data
degree (data x4 from a profile whose data degrees stop at 2, as data x8 across two 4-device nodes is) is predicted
as the data x2 stage at the global batch B * 2 / 4, and equals what the simulated runtime measures.

Tolerance, derived: none. Each of the 4 replicas runs what a replica of data x2 runs on the same 32 / 2 / 4 = 4
rows per micro-batch; the composed data x2 stage is then at a global batch of 16 in micro-batches of 8, one of the
two sizes the profile measured (B/2 and B/4 of 32), so the batch fit adds nothing; and the data x2 prediction of
the whole MLP (the one data span a 1x2 profile measures) is exact on simulated devices. ZeRO-1's shares for 4
ranks come from the parameter shapes, exactly as for a profiled degree, so it errs as ZeRO-1 does there. ZeRO-3 is the widest profiled ZeRO-3 stage at
that batch with its shards moved (its tests below)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


def _zero3_cluster_errors(db: Path, schedule: str, degree: int) -> list[int]:
    plan = _plan(schedule, 3, degree)
    report = validate_plan(db, plan, cluster=Cluster.parse(f"2x{degree // 2}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    return [r.predicted - r.measured for r in report.rows]


@pytest.mark.parametrize("degree", [4, 8])
def test_zero3_above_the_profiled_degrees_equals_the_simulated_runtime_under_1f1b(sharded_mlp_files, degree):
    """[Note: a ZeRO-3 stage wider than the profiled ones] (predict/zero_stage.py): ZeRO-3 over 4 and 8 ranks
    (two nodes) from the data2-zero3 scenario, every rank to the byte. Tolerance, derived: none. Each replica runs
    the x2 replica's rows (4 per micro-batch, a profiled size, as above); what differs is computed from the
    parameter shapes: the stored chunks and reduce-scattered gradients (the first rank's, padded: 1,996 and 1,064
    bytes against x2's 3,860), each rank's AdamW state of its own chunks (the last ranks' chunks of the 10-row
    head are shorter or empty: they predict 528 bytes lower, and measure it), the step's two temporaries of the
    largest chunk, and the head's gathered bytes, its 10 rows padded to 12 and 16 (+264 and +792 bytes held while
    it is gathered)."""
    errors = _zero3_cluster_errors(sharded_mlp_files / "p.sqlite", "1f1b", degree)
    assert errors == [0] * degree


def test_zero3_above_the_profiled_degrees_errs_no_more_than_at_the_profiled_degree_under_gpipe(sharded_mlp_files):
    """Under GPipe the x2 stage's own ZeRO-3 prediction is 2,012 bytes high (its backward-after-a-backward rule
    on a profile taken under 1F1B); composed over 4 and 8 ranks the error stays below it, every rank alike and
    never under the measured peak (measured: 412 and 396 bytes high, 1.9% and 2.1%)."""
    db = sharded_mlp_files / "p.sqlite"
    profiled = max(map(abs, _errors(db, _plan("gpipe", 3, degree=2))))
    for degree in (4, 8):
        errors = _zero3_cluster_errors(db, "gpipe", degree)
        assert len(set(errors)) == 1 and 0 <= errors[0] <= profiled


def test_zero3_above_the_profiled_degrees_is_searched_and_refused_by_the_capture_method(sharded_mlp_files):
    db = sharded_mlp_files / "p.sqlite"
    predictor = MemoryPredictor.from_db(db)
    peaks = [d.peak_memory_bytes for d in predictor.predict(_plan("1f1b", 3, degree=4)).devices]
    assert predictor.stage_memory(0, 5, "data", 4, 0, zero=3) == max(peaks)  # what the search sees
    matrix = predictor.stage_memory_matrix("data", 4, 0, 5, zero=3)  # the exact search's table of every span
    assert matrix[0, 5] == max(peaks)
    narrow = predictor.stage_memory_matrix("data", 2, 0, 5, zero=3)  # offered wherever the x2 stage is predicted
    assert (np.isfinite(matrix) == np.isfinite(narrow)).all()
    capture = MemoryPredictor.from_db(db, method="capture")
    assert capture.stage_memory(0, 5, "data", 4, 0, zero=3) == float("inf")
    with pytest.raises(ProfileError, match=r"ZeRO-3 over 4 devices is above the profiled ZeRO-3 degrees \[2\]"):
        capture.predict(_plan("1f1b", 3))


def test_the_capture_method_keeps_seed_000s_degree_fit(sharded_mlp_files):
    """Seed 000 fits degrees through two profiled ones; with one, it cannot predict data x4 at all."""
    predictor = MemoryPredictor.from_db(sharded_mlp_files / "p.sqlite", method="capture")
    assert predictor.stage_memory(0, 5, "data", 4, 0) == float("inf")
