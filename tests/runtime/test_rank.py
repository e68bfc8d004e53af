"""What every rank does (runtime/rank.py), apart from training (tested through both backends): its meter,
its process-group backend, and its failure report."""

from __future__ import annotations

import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.gpu_memory import cuda_block_bytes
from hybridplan.runtime.memory import DeviceOutOfMemory, NullMeter, StorageTracker
from hybridplan.runtime.rank import make_meter, process_group_backend, rank_failure
from hybridplan.runtime.result import EXIT_FAILED, EXIT_OOM
from tests.runtime.util import make_plan

PLAN = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])


def cfg(**kw) -> RunConfig:
    return RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x2"), **kw)


def test_meter_of_a_rank():
    cpu = torch.device("cpu")
    assert isinstance(make_meter(cfg(track_memory=False), cpu, None, simulated=False), NullMeter)
    exact = make_meter(cfg(), cpu, 1000, simulated=False)
    assert isinstance(exact, StorageTracker) and exact.rounding is None
    gpu_terms = make_meter(cfg(device_type="cuda", backend="sim"), cpu, None, simulated=True)
    assert isinstance(gpu_terms, StorageTracker) and gpu_terms.rounding is cuda_block_bytes


def test_process_group_backend():
    assert (process_group_backend("cpu"), process_group_backend("cuda")) == ("gloo", "nccl")
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): ranks sharing one run on gloo
    assert process_group_backend("cuda", share_gpu=True) == process_group_backend("cpu", share_gpu=True) == "gloo"


def test_failure_report_of_a_rank():
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        failed = rank_failure(2, e)
    assert (failed.status, failed.rank, failed.reason, failed.exit_code) == ("failed", 2, "device 2: RuntimeError: boom", EXIT_FAILED)
    assert "raise RuntimeError" in failed.traceback and failed.time > 0
    oom = rank_failure(0, DeviceOutOfMemory(2048, 1024, "activations"))
    assert oom.status == "oom" and oom.exit_code == EXIT_OOM and oom.reason.startswith("device 0: DeviceOutOfMemory:")
    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})  # torch.cuda's, by name: no CUDA here
    assert rank_failure(1, OutOfMemoryError("CUDA out of memory")).status == "oom"
