"""Per-layer weight-stash bytes on fake tensors (profiling/stash_sizes.py), against hand counts."""

from __future__ import annotations

import pytest

from hybridplan.models.zoo import get_model
from hybridplan.profiling.stash_sizes import layer_stash_bytes
from hybridplan.runtime.gpu_memory import cuda_block_bytes


def test_replicated_stages_stash_whole_parameters_in_the_compute_dtype():
    model = get_model("gpt-tiny")
    fp32 = layer_stash_bytes(model, "none", 1)
    assert fp32 == [4 * sum(p.numel() for p in model.build_layer(i).parameters()) for i in range(model.num_layers)]
    assert layer_stash_bytes(model, "data", 2) == fp32  # every replica holds every parameter
    assert layer_stash_bytes(model, "none", 1, precision="bf16") == [n // 2 for n in fp32]


def test_tensor_stages_stash_their_shards_and_cuda_counts_blocks():
    model = get_model("gpt-tiny")
    whole = layer_stash_bytes(model, "none", 1)
    halves = layer_stash_bytes(model, "tensor", 2)
    assert all(h is not None and h < w for h, w in zip(halves[1:-1], whole[1:-1]))  # the blocks are split
    cuda = layer_stash_bytes(model, "none", 1, device_type="cuda")
    assert all(c >= w and c % 512 == 0 for c, w in zip(cuda, whole))
    assert cuda[1] == sum(cuda_block_bytes(4 * p.numel()) for p in model.build_layer(1).parameters())


def test_cannot_count_inside_a_process_group():
    from hybridplan.errors import UsageError
    from hybridplan.runtime.sim import fake_process_group

    with fake_process_group(0, 1), pytest.raises(UsageError, match="already has a torch.distributed process group"):
        layer_stash_bytes(get_model("gpt-tiny"), "none", 1)
