"""runtime/split_layers.py: the parameter shards a tensor rank holds, read off the layers split on fake tensors as
the runtime splits them (what ZeRO-1 of a data x tensor stage partitions: predict/zero_layout.py)."""

from __future__ import annotations

from hybridplan.models import get_model
from hybridplan.runtime.split_layers import layer_shard_shapes


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


def test_each_distinct_layer_is_built_once_and_every_layer_gets_its_own_answer(monkeypatch):
    """per_layer builds one layer per signature (llama-tiny: embed, its decoders, head), and each layer's answer
    equals the one of that layer built alone, as a copy (editing one never edits another)."""
    import hybridplan.runtime.split_layers as split
    from hybridplan.models.zoo import resolve_model
    from hybridplan.profiling.stash_sizes import layer_stash_bytes

    model = resolve_model("hf:llama-tiny")
    built: list[int] = []
    real = split.split_layers

    def counting(m, kind, degree, layers=None):
        built.extend(layers if layers is not None else range(m.num_layers))
        return real(m, kind, degree, layers)

    monkeypatch.setattr(split, "split_layers", counting)
    shapes = split.layer_shard_shapes(model, 2)
    assert len(built) == len({model.layer_signature(i) for i in range(model.num_layers)}) < model.num_layers
    monkeypatch.setattr(split, "split_layers", real)
    alone = [[[p.element_size(), *(p.to_local() if hasattr(p, "to_local") else p).shape]
              for p in module.parameters() if p.requires_grad]
             for i in range(model.num_layers) for module in real(model, "tensor", 2, [i])]
    assert shapes == alone
    shapes[1].append([0])
    assert shapes[2] == alone[2]
    stash = layer_stash_bytes(model, "tensor", 2, precision="bf16", device_type="cuda")
    assert stash[1] == stash[2] > 0 and len(stash) == model.num_layers
