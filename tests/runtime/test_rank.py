"""What every rank does (runtime/rank.py), apart from training (tested through both backends): its meter,
its process-group backend, and its failure report."""

from __future__ import annotations

import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.gpu_memory import CUDA_CONTEXT_BYTES, NCCL_COMMUNICATOR_BYTES
from hybridplan.runtime.memory import DeviceOutOfMemory, StorageTracker
from hybridplan.runtime.meters import NullMeter
from hybridplan.runtime.rank import make_meter, process_group_backend, process_group_device, rank_failure
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
    gpu_terms = make_meter(cfg(device_type="cuda", backend="sim"), cpu, 10**11, simulated=True, rank=1)
    assert isinstance(gpu_terms, StorageTracker) and gpu_terms.device is not None
    # a modelled CUDA device of the whole capacity; rank 1 joins the world (2 ranks) and its pair with rank 0
    assert gpu_terms.capacity_bytes == 10**11
    assert gpu_terms.overhead_bytes() == CUDA_CONTEXT_BYTES + 2 * NCCL_COMMUNICATOR_BYTES


def test_process_group_backend():
    assert (process_group_backend("cpu"), process_group_backend("cuda")) == ("gloo", "nccl")
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): ranks sharing one run on gloo
    assert process_group_backend("cuda", share_gpu=True) == process_group_backend("cpu", share_gpu=True) == "gloo"


def test_process_group_device_names_the_gpu_on_cuda_only():
    """init_process_group gets device_id on CUDA (else NCCL warns it is "Guessing device ID"), nothing for gloo."""
    assert process_group_device(torch.device("cpu")) is None
    assert process_group_device(torch.device("cuda", 3)) == torch.device("cuda", 3)  # a device object needs no GPU


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
