"""Validation (workflows/validate.py): a plan predicted from the profile, run with the profiled settings (here
simulated devices, as the MLP's profile of ``mlp_files`` in tests/conftest.py was taken), and compared per device."""

from __future__ import annotations

import pytest

from hybridplan.errors import ProfileError
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.validate import DeviceMemory, relative_error, validate_plan
from tests.cli.conftest import MIXED, MLP


def test_relative_error_and_a_device_without_both_sides():
    assert relative_error(110, 100) == pytest.approx(0.1) and relative_error(90, 100) == pytest.approx(-0.1)
    assert DeviceMemory(0, 0, 150, 100).error == pytest.approx(0.5)
    assert DeviceMemory(0, 0, None, 100).error is None and DeviceMemory(0, 0, 100, None).error is None
    assert DeviceMemory(0, 0, 100, 0).error is None  # nothing measured: no error to divide by


@pytest.fixture(scope="module")
def report(mlp_files):
    return validate_plan(mlp_files / "p.sqlite", Plan.from_dict(MIXED), model=MLP)


def test_every_device_pairs_its_prediction_with_its_measurement(report, mlp_files):
    assert report.run.ok, report.run.reason
    predicted = MemoryPredictor.from_db(mlp_files / "p.sqlite").predict(Plan.from_dict(MIXED))
    assert [(r.device, r.stage) for r in report.rows] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [r.predicted for r in report.rows] == [d.peak_memory_bytes for d in predicted.devices]
    assert [r.measured for r in report.rows] == [d.peak_memory_bytes for d in report.run.devices]
    assert report.max_abs_error == max(abs(r.error) for r in report.rows)


def test_the_json_form_and_the_table_carry_the_same_numbers(report):
    data = report.to_dict()
    assert data["status"] == "ok" and data["reason"] is None and data["plan"] == Plan.from_dict(MIXED).to_dict()
    assert [d["relative_error"] for d in data["devices"]] == [r.error for r in report.rows]
    assert data["predicted_peak_bytes"] == max(r.predicted for r in report.rows)
    assert data["measured_peak_bytes"] == max(r.measured for r in report.rows)
    assert data["max_abs_relative_error"] == report.max_abs_error
    lines = report.table().splitlines()
    assert "run: ok" in lines and len([line for line in lines if line.split()[:2] in (["0", "0"], ["3", "2"])]) == 2
    assert lines[-1].startswith(f"largest per-device error {100 * report.max_abs_error:.2f}%")


def test_a_profile_of_user_code_runs_only_the_model_the_user_names(mlp_files):
    with pytest.raises(ProfileError, match=f"add --model {MLP}"):
        validate_plan(mlp_files / "p.sqlite", Plan.from_dict(MIXED))


def test_on_cuda_the_reserved_peak_is_compared_too(tmp_path, report):
    """A simulated CUDA profile of the MLP (pipeline only, 1x2): the predicted and the replayed reserved peak, 66 MiB
    by hand on both devices (two 32 MiB cuBLAS workspace segments, one 2 MiB small segment for the 1 MiB cuBLASLt
    workspace and the MLP's few KiB: tests/cli/test_predict.py); a CPU validation has no reserved column."""
    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.workflows.runs import ensure_profile

    db = ensure_profile(tmp_path / "cuda.sqlite", model=MLP, cluster=Cluster.parse("1x2", device_type="cuda"),
                        global_batch_size=16, num_microbatches=2, run_options={"backend": "sim", "device_type": "cuda"},
                        scenarios=(Scenario("none", 1),))
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [1]}]})
    cuda = validate_plan(db, plan, model=MLP)
    assert cuda.run.ok, cuda.run.reason
    assert cuda.reserved() == {0: (66 * 2**20, 66 * 2**20), 1: (66 * 2**20, 66 * 2**20)}
    assert [(d["predicted_reserved"], d["measured_reserved"]) for d in cuda.to_dict()["devices"]] == [(66 * 2**20,) * 2] * 2
    assert "reserved pred." in cuda.table() and "66.00 MiB" in cuda.table()
    assert report.reserved() == {} and "reserved" not in report.table()
    assert "predicted_reserved" not in report.to_dict()["devices"][0]
