"""Peak memory in GPU terms (runtime/gpu_memory.py): the cuBLAS workspaces a simulated CUDA device allocates
(checked against the H100 measurement in ../shared/notes/gpu-h100-facts.md), the memory outside the allocator
(the notes' measured steps), and the NCCL communicators each rank of a plan creates (derived by hand from the
routes between stages)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridplan.plan import Plan
from hybridplan.runtime.gpu_memory import (
    CUDA_CONTEXT_BYTES,
    NCCL_COMMUNICATOR_BYTES,
    CudaDeviceModel,
    communicators_of,
    cuda_block_bytes,
    estimate_overhead_bytes,
)
from hybridplan.runtime.memory import DeviceOutOfMemory, StorageTracker
from tests.cli.conftest import MIXED

MIB = 2**20


@pytest.mark.parametrize("request_bytes, block", [(0, 0), (-8, 0), (1, 512), (511, 512), (512, 512), (513, 1024),
                                                  (1_000_000, 1_000_448)])  # ceil(1e6 / 512) = 1954 blocks
def test_cuda_block_bytes(request_bytes, block):
    assert cuda_block_bytes(request_bytes) == block


def _train_step(tracker: StorageTracker, layer: nn.Module, x: torch.Tensor) -> None:
    with tracker:
        with tracker.in_phase("activations"):
            y = layer(x)
        with tracker.in_phase("backward"):
            y.sum().backward()


def test_a_bias_linear_forward_and_backward_hold_the_measured_65_mib_of_workspaces():
    """The notes measured a constant 65.0 MiB = 68,157,440 B of cuBLAS/cuBLASLt workspaces inside the allocator."""
    dev = CudaDeviceModel(None, communicators=0)
    tr = StorageTracker(device=dev)
    layer, x = nn.Linear(8, 8), torch.randn(4, 8)
    _train_step(tr, layer, x)
    assert tr.by_category["workspace"] == 68_157_440
    _train_step(tr, layer, x)  # a second iteration: the same handles, no new workspace
    assert tr.by_category["workspace"] == 68_157_440
    # the context and the cuBLAS kernels (+66 MiB), no attention, no cuDNN, no communicator
    assert dev.outside_bytes == round(618.8 * MIB) + 66 * MIB


def test_a_recomputed_forward_gives_the_backward_thread_a_cublaslt_workspace_too():
    tr = StorageTracker(device=CudaDeviceModel(None, communicators=0))
    layer, x = nn.Linear(8, 8), torch.randn(4, 8)
    with tr, tr.in_phase("backward"):
        layer(x).sum().backward()
    assert tr.by_category["workspace"] == (32 + 1) * MIB  # one thread: its cuBLAS and cuBLASLt workspaces


def test_attention_and_convolution_load_their_libraries():
    dev = CudaDeviceModel(None, communicators=2)
    tr = StorageTracker(device=dev)
    q = torch.randn(1, 2, 4, 8)
    with tr:
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.nn.functional.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3))
    assert dev.libraries == {"attention", "cudnn"}
    assert dev.outside_bytes == round(618.8 * MIB) + (16 + 2 + 2 * 562) * MIB


def test_a_device_runs_out_when_its_total_memory_would_exceed_the_capacity():
    # the context alone leaves 1 MiB + 1 byte: room for no 2 MiB segment
    dev = CudaDeviceModel(CUDA_CONTEXT_BYTES + MIB + 1, communicators=0)
    tr = StorageTracker(device=dev)
    with pytest.raises(DeviceOutOfMemory), tr:
        torch.empty(1)
    roomy = StorageTracker(device=CudaDeviceModel(CUDA_CONTEXT_BYTES + 2 * MIB, communicators=0))
    with roomy:
        t = torch.empty(1)
    assert roomy.current == 512 and roomy.reserved_peak == 2 * MIB and roomy.overhead_bytes() == CUDA_CONTEXT_BYTES
    del t


def test_communicators_of_a_tensor_then_two_single_device_stages():
    """MIXED: tensor x2 on devices 0, 1 -> device 2 -> device 3. Forward, rank 0 sends the (replicated) rows to 2;
    backward, 2 sends the gradient to both tensor ranks, each of which needs all of it."""
    plan = Plan.from_dict(MIXED)
    sizes = {rank: sorted(communicators_of(plan, rank)) for rank in range(4)}
    assert sizes == {0: [2, 2, 4],  # the world, the tensor group, the pair with 2
                     1: [2, 2, 4],  # the world, the tensor group, the pair with 2 (backward only)
                     2: [2, 2, 2, 4],  # the world, pairs with 0, 1 and 3
                     3: [2, 4]}  # the world, the pair with 2


def test_communicators_of_a_data_stage():
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [2]}]})
    # each replica sends its half of the rows to 2 and gets its half of the gradient back
    assert sorted(communicators_of(plan, 0)) == [2, 2, 3] and sorted(communicators_of(plan, 2)) == [2, 2, 3]


def test_a_single_device_creates_no_communicator():
    plan = Plan.from_dict({**MIXED, "stages": [{"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0]}]})
    assert communicators_of(plan, 0) == [] and estimate_overhead_bytes(plan, 0) == CUDA_CONTEXT_BYTES
    # a GPT's libraries: 618.8 + 66 + 16 MiB (the notes' measured steps)
    assert estimate_overhead_bytes(plan, 0, {"cublas", "attention"}) == round(618.8 * MIB) + 82 * MIB


def test_the_overhead_is_the_context_the_libraries_and_each_communicator():
    plan = Plan.from_dict(MIXED)
    # rank 2: the world (4 ranks) and three pairs
    assert estimate_overhead_bytes(plan, 2) == CUDA_CONTEXT_BYTES + 4 * NCCL_COMMUNICATOR_BYTES
    # rank 0: the world and two 2-rank communicators (its tensor group, its pair with 2), and cuBLAS
    assert estimate_overhead_bytes(plan, 0, {"cublas"}) == round(618.8 * MIB) + 66 * MIB + 3 * 562 * MIB
