"""Wide-ResNet zoo: structure after Alpa, GroupNorm, determinism, paper sizes, tensor parallelism."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from gloo import (
    WORLD,
    GlooPool,
    assert_builds_deterministic,
    assert_make_batch_deterministic,
    assert_samples_independent,
    assert_tensor_parallel_matches,
    check_tensor_parallel,
    meta_parameter_count,
    run_chain,
    run_chain_fake,
    tensor_parallel_layers,
)
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models import get_model
from hybridplan.models.wresnet import WRESNET_CONFIGS, Bottleneck, WResNet

TINY = WRESNET_CONFIGS["wresnet-tiny"]


def test_paper_layout_is_stem_16_blocks_head() -> None:
    model = get_model("wresnet-250m")
    assert model.num_layers == 18
    names = [model.layer_name(i) for i in range(18)]
    assert names == ["stem", *(f"block{i}" for i in range(16)), "head"]


def test_tiny_layout() -> None:
    model = get_model("wresnet-tiny")
    assert model.num_layers == sum(TINY.blocks) + 2 == 7
    blocks = [model.build_layer(i) for i in range(1, 6)]
    assert all(isinstance(b, Bottleneck) for b in blocks)
    assert [b.proj is not None for b in blocks] == [True, False, True, True, True]  # identity shortcut in block1


def test_bottleneck_widths_follow_alpa() -> None:
    # Stage 2 of wresnet-1b: filters 320 * 4 = 1280; conv1 -> 1280, conv2 (3x3, stride 2) -> 1280 * 2,
    # conv3 -> 4 * 1280.
    model = get_model("wresnet-1b")
    with torch.device("meta"):
        block = model.build_layer(1 + 3 + 4)  # first block of stage 2
    assert (block.conv1.in_channels, block.conv1.out_channels) == (2560, 1280)
    assert (block.conv2.out_channels, block.conv2.stride) == (2560, (2, 2))
    assert block.conv3.out_channels == 5120 and block.proj.stride == (2, 2)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in block.modules())
    assert all(m.num_groups == 32 for m in block.modules() if isinstance(m, nn.GroupNorm))


def test_last_norm_of_a_block_starts_at_zero() -> None:
    block = get_model("wresnet-tiny").build_layer(1)
    assert torch.equal(block.norm3.weight, torch.zeros_like(block.norm3.weight))


def test_builds_are_deterministic() -> None:
    assert_builds_deterministic(get_model("wresnet-tiny"))


def test_make_batch_is_deterministic() -> None:
    x, y = assert_make_batch_deterministic(get_model("wresnet-tiny"))
    assert x.shape == (3, 3, 32, 32) and y.max() < TINY.num_classes


def test_training_step_runs() -> None:
    out, _ = run_chain(get_model("wresnet-tiny"), 2)
    assert out.shape == (2, TINY.num_classes)


def test_samples_are_independent() -> None:
    # GroupNorm normalises each sample alone; BatchNorm would fail this.
    assert_samples_independent(get_model("wresnet-tiny"), num_samples=4, split=1)


def test_runs_under_fake_tensors() -> None:
    assert run_chain_fake(get_model("wresnet-tiny"), 2) == (2, TINY.num_classes)


def test_norm_groups_must_divide_channels() -> None:
    with pytest.raises(ModelError, match="stem has 12 channels, not divisible by norm_groups 8"):
        WResNet("bad", replace(TINY, num_channels=12, norm_groups=8))


# Alpa's names: 250M ... 4B; measured 254.0M, 494.9M, 1005.4M, 1964.7M, 4000.4M (the same structure,
# GroupNorm has as many parameters as BatchNorm), so within 2% of the names.
@pytest.mark.parametrize(
    "name, nominal",
    [("wresnet-250m", 250e6), ("wresnet-500m", 500e6), ("wresnet-1b", 1e9), ("wresnet-2b", 2e9), ("wresnet-4b", 4e9)],
)
def test_paper_sizes_on_meta(name: str, nominal: float) -> None:
    count = meta_parameter_count(get_model(name))
    assert 0.97 * nominal <= count <= 1.03 * nominal, f"{name}: {count:,} parameters"


def test_tensor_parallel_problems() -> None:
    model = get_model("wresnet-tiny")
    assert all(model.tensor_parallel_problem(i, 4) is None for i in range(6))
    assert "fc: output size of Linear 10 is not divisible by degree 4" in model.tensor_parallel_problem(6, 4)
    # GroupNorm shards must hold whole groups: 4 groups cannot split 8 ways.
    assert "num_groups 4 is not divisible by degree 8" in model.tensor_parallel_problem(0, 8)
    paper = get_model("wresnet-250m")
    assert all(paper.tensor_parallel_problem(i, 8) is None for i in range(18))


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_tensor_parallel_matches_unsplit(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    model = get_model("wresnet-tiny")
    layers = tensor_parallel_layers(model, degree)
    assert layers == list(range(7 if degree == 2 else 6))  # 10 classes do not split 4 ways
    results = gloo_pool(WORLD).run(check_tensor_parallel, [(model, layers)], degree)
    assert_tensor_parallel_matches(results)
    first = results[0]
    # Projection block: conv1, norm1 (2), conv2 (rows), conv3, norm3 (2), proj, proj_norm (2); identity
    # block: the same without the projection's 3.
    assert first["wresnet-tiny block0 sharded"] == 10 and first["wresnet-tiny block1 sharded"] == 7
    assert first["wresnet-tiny stem sharded"] == 3
