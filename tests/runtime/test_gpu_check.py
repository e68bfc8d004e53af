"""Whether a run's devices are here (runtime/gpu_check.py): a real CUDA run needs a GPU PyTorch can use, ``share_gpu``
needs CUDA devices, simulated runs need nothing. PyTorch's answer is forced so that the tests mean the same on a
machine with a GPU."""

from __future__ import annotations

import pytest
import torch

from hybridplan.errors import UsageError
from hybridplan.runtime import gpu_check
from hybridplan.runtime.gpu_check import check_devices, require_gpu, visible_gpus


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_visible_gpus_counts_only_usable_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert visible_gpus() == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert visible_gpus() == 0


def test_no_gpu_is_refused_saying_why(no_gpu, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(UsageError, match=r"the run is on CUDA devices \(--device cuda\), but PyTorch sees no GPU"
                       r" on this machine \(this PyTorch \(.*\) is built without CUDA\)") as e:
        require_gpu("the run")
    assert "--backend sim" in str(e.value.fix)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES='' hides every GPU"):
        require_gpu("x")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(UsageError, match=r"torch.cuda.is_available\(\) is False"):
        require_gpu("x")


def test_a_gpu_passes(monkeypatch):
    monkeypatch.setattr(gpu_check, "visible_gpus", lambda: 1)
    require_gpu("x")
    check_devices("x", backend="real", device_type="cuda", share_gpu=True)


def test_what_needs_a_gpu(no_gpu):
    check_devices("x", backend="sim", device_type="cuda", share_gpu=False)  # simulated CUDA devices
    check_devices("x", backend="real", device_type="cpu", share_gpu=False)
    check_devices("x", backend="real", device_type="cuda", share_gpu=False, here=False)  # other machines' GPUs
    with pytest.raises(UsageError, match="sees no GPU"):
        check_devices("x", backend="real", device_type="cuda", share_gpu=False)
    with pytest.raises(UsageError, match="sees no GPU"):
        check_devices("x", backend="real", device_type="cuda", share_gpu=True)
    with pytest.raises(UsageError, match=r"--share-gpu runs several ranks on one GPU, but the devices of x are CPUs"):
        check_devices("x", backend="real", device_type="cpu", share_gpu=True)


def test_the_process_launcher_starts_nothing_without_a_gpu(no_gpu, monkeypatch):
    from hybridplan.plan import Plan
    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime import processes
    from hybridplan.runtime.config import RunConfig

    monkeypatch.setattr(processes, "_context", lambda: pytest.fail("a process was about to start"))
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2,
                           "stages": [{"layers": [0, 10], "parallelism": "none", "degree": 1, "devices": [0]}]})
    cfg = RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x1", device_type="cuda"), device_type="cuda")
    with pytest.raises(UsageError, match="sees no GPU"):
        processes.run_processes(cfg)
