"""profiling/split_layers.py: the parameter shards a tensor rank holds, read off the layers split on fake tensors as
the runtime splits them (what ZeRO-1 of a data x tensor stage partitions: predict/zero_layout.py)."""

from __future__ import annotations

from hybridplan.models import get_model
from hybridplan.profiling.split_layers import layer_shard_shapes


def test_a_gpt_block_splits_as_megatron_says():
    """By hand, gpt-tiny (hidden 64, MLP 256, vocabulary 128) at tensor degree 2: column-parallel q, k, v and fc1
    keep half their output rows and bias; row-parallel o and fc2 half their input columns and their whole bias;
    the layer norms stay whole; the head's projection is column-parallel without a bias."""
    shapes = layer_shard_shapes(get_model("gpt-tiny"), 2)
    block = [[64]] * 4 + [[32, 64], [32]] * 3 + [[64, 32], [64]] + [[128, 64], [128], [64, 128], [64]]
    assert sorted(s[1:] for s in shapes[1]) == sorted(block)
    assert all(s[0] == 4 for s in shapes[1])
    assert sorted(s[1:] for s in shapes[9]) == sorted([[64], [64], [64, 64]])


def test_a_layer_that_does_not_split_is_none():
    """gpt-tiny's 4 heads split 2 and 4 ways, not 3 ways (nor does its hidden size 64)."""
    assert all(layer is None for layer in layer_shard_shapes(get_model("gpt-tiny"), 3)[1:9])
