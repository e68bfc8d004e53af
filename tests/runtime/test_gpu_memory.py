"""Peak memory in GPU terms (runtime/gpu_memory.py): the caching allocator's 512-byte blocks, the NCCL communicators
each rank of a plan creates (derived by hand from the routes between stages), and the overhead they add."""

from __future__ import annotations

import pytest

from hybridplan.plan import Plan
from hybridplan.runtime.gpu_memory import (
    CUDA_CONTEXT_BYTES,
    NCCL_GROUP_COMMUNICATOR_BYTES,
    NCCL_PAIR_COMMUNICATOR_BYTES,
    communicators_of,
    cuda_block_bytes,
    estimate_overhead_bytes,
)
from tests.cli.conftest import MIXED


@pytest.mark.parametrize("request_bytes, block", [(0, 0), (-8, 0), (1, 512), (511, 512), (512, 512), (513, 1024),
                                                  (1_000_000, 1_000_448)])  # ceil(1e6 / 512) = 1954 blocks
def test_cuda_block_bytes(request_bytes, block):
    assert cuda_block_bytes(request_bytes) == block


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


def test_the_overhead_is_the_context_and_each_communicator():
    plan = Plan.from_dict(MIXED)
    # rank 2: the world (4 ranks) and three pairs
    assert estimate_overhead_bytes(plan, 2) == CUDA_CONTEXT_BYTES + NCCL_GROUP_COMMUNICATOR_BYTES + 3 * NCCL_PAIR_COMMUNICATOR_BYTES
    # rank 0: the world and two 2-rank communicators (its tensor group, its pair with 2)
    assert estimate_overhead_bytes(plan, 0) == CUDA_CONTEXT_BYTES + NCCL_GROUP_COMMUNICATOR_BYTES + 2 * NCCL_PAIR_COMMUNICATOR_BYTES
