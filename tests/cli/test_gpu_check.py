"""``--device cuda`` where PyTorch sees no GPU, and ``--share-gpu`` on CPU devices (runtime/gpu_check.py), as a user
meets them: refused with exit code 2 before any process starts or any file is written; what only simulates CUDA
devices works without a GPU. PyTorch's answer is forced, so the tests mean the same on a machine with a GPU."""

from __future__ import annotations

import json

import pytest
import torch

import hybridplan.runtime.launch as launch_module
from hybridplan.cli import main
from tests.cli.conftest import MLP

ONE_STAGE = {"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2,
             "stages": [{"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0]}]}
PROFILE = ["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2"]


@pytest.fixture
def no_gpu(monkeypatch):
    """No GPU, and no run may start."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch_module, "launch", lambda *a, **k: pytest.fail("a run was started"))


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(ONE_STAGE))
    return path


def _refused(capsys, command: str, fragment: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"hybridplan {command}: error: ") and fragment in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2
    return err


@pytest.mark.parametrize("extra", [[], ["--share-gpu"], ["--gpu", "h100-sxm"]])
def test_run_on_cuda_without_a_gpu_is_refused_before_any_process(no_gpu, plan, tmp_path, capsys, extra):
    out = tmp_path / "r.json"
    assert main(["run", "--model", MLP, "--cluster", "1x1", "--plan", str(plan), "--out", str(out),
                 *(["--device", "cuda"] if "--gpu" not in extra else []), *extra]) == 2
    err = _refused(capsys, "run", "the run is on CUDA devices (--device cuda), but PyTorch sees no GPU on this machine")
    assert "MODE" not in err and "started" not in err and not out.exists()


def test_share_gpu_on_cpu_devices_is_refused_rather_than_announced(no_gpu, plan, capsys):
    assert main(["run", "--model", MLP, "--cluster", "1x1", "--plan", str(plan), "--share-gpu"]) == 2
    err = _refused(capsys, "run", "--share-gpu runs several ranks on one GPU, but the devices of the run are CPUs")
    assert "MODE" not in err


def test_simulated_cuda_devices_need_no_gpu(plan, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    assert main(["run", "--model", MLP, "--cluster", "1x1", "--plan", str(plan), "--backend", "sim", "--device", "cuda",
                 "--iterations", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["status"] == "ok"


def test_a_configuration_for_torchrun_elsewhere_needs_no_gpu_here(no_gpu, plan, tmp_path):
    cfg = tmp_path / "cfg.json"
    assert main(["run", "--model", MLP, "--cluster", "1x1", "--plan", str(plan), "--device", "cuda",
                 "--write-config", str(cfg)]) == 0
    assert json.loads(cfg.read_text())["device_type"] == "cuda"


@pytest.mark.parametrize("extra, fragment", [
    (["--device", "cuda"], "the profile is on CUDA devices (--device cuda), but PyTorch sees no GPU"),
    (["--device", "cuda", "--time"], "the layer timing is on CUDA devices"),
    (["--share-gpu"], "but the devices of the profile are CPUs"),
])
def test_profile_without_the_devices_is_refused_and_writes_no_database(no_gpu, tmp_path, capsys, extra, fragment):
    db = tmp_path / "p.sqlite"
    assert main([*PROFILE, "--db", str(db), *extra]) == 2
    _refused(capsys, "profile", fragment)
    assert not db.exists()


def test_profile_dry_run_needs_no_gpu(no_gpu, capsys):
    assert main([*PROFILE, "--db", "unused.sqlite", "--device", "cuda", "--dry-run"]) == 0
    assert "runs:" in capsys.readouterr().out


def test_validate_share_gpu_on_a_cpu_profile_is_refused(no_gpu, files, capsys):
    """It ran before and announced a GPU mode on CPU devices; on a GPU, the mode is tested in
    tests/runtime/test_shared_gpu.py."""
    assert main(["validate", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--model", MLP,
                 "--backend", "real", "--share-gpu"]) == 2
    _refused(capsys, "validate", "--share-gpu runs several ranks on one GPU, but the devices of the validation run are CPUs")
