"""Wide-ResNet, as benchmarked by Alpa (``benchmark/alpa/suite_wresnet.py``, model ``alpa/model/wide_resnet.py``).

A ResNet-50 (He et al., 2016; bottleneck stages ``[3, 4, 6, 3]``) whose widths follow Alpa's flax
model: stage ``i`` has ``f = num_channels * 2**i`` filters; a bottleneck block is conv1x1 to ``f``,
conv3x3 (stride on the first block of stages 1-3) to ``f * width_factor``, conv1x1 to ``4 f``, and a
projection shortcut (conv1x1 + norm) where the shape changes; the last norm of a block starts at zero
(Goyal et al., 2017), as in Alpa. Layers: ``stem`` (conv7x7/2 + norm + ReLU + maxpool3x3/2), one layer
per bottleneck block (16 for ResNet-50), ``head`` (global average pool + linear); 18 layers.

Norm: GroupNorm (Wu & He, 2018) instead of Alpa's BatchNorm. BatchNorm normalises with statistics of
the batch on each device, so micro-batching and data-parallel sharding would change the math (and its
running statistics are state outside the gradients); GroupNorm normalises each sample on its own.
``norm_groups`` (32, the paper's default) divides every channel count of the paper sizes, and is
divisible by the tensor-parallel degrees 2, 4 and 8, so channel shards hold whole groups.

Tensor parallelism (Megatron-style on channels; convolution output channels play the role of a
linear's columns): in a block, conv1 is column-parallel and its norm is sharded with it (whole groups
per rank); conv2 is row-parallel (input channels sharded, all-reduce), its norm replicated; conv3 is
column-parallel, its norm sharded, and the output all-gathered on channels before the residual add; the
projection shortcut is split the same way as conv3. The stem conv is column-parallel with a sharded
norm, gathered after the (per-channel) ReLU and max-pool; the head linear is column-parallel over
classes with the logits gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    GatherOutput,
    RowParallel,
    ShardParams,
    TensorParallelPlan,
)
from hybridplan.models.zoo import register

__all__ = ["WResNetConfig", "WResNet", "WRESNET_CONFIGS"]


@dataclass(frozen=True, kw_only=True)
class WResNetConfig:
    """Size of a Wide-ResNet."""

    num_channels: int
    """Filters of the stem and of stage 0 (Alpa's ``num_channels``); stage ``i`` has ``num_channels * 2**i``."""
    width_factor: int
    """Widening of each block's 3x3 convolution (Alpa's ``width_factor``)."""
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    """Bottleneck blocks per stage; ``(3, 4, 6, 3)`` is ResNet-50 (Alpa ``model_configs[50]``)."""
    image_size: int = 224
    """Height and width of the square input images (Alpa wresnet_specs: 224)."""
    num_classes: int = 1000
    """Output classes (ImageNet, as in Alpa's benchmark)."""
    norm_groups: int = 32
    """GroupNorm groups; must divide every channel count (Wu & He, 2018 use 32)."""


WRESNET_CONFIGS: dict[str, WResNetConfig] = {
    # Small enough for multi-process tests; two blocks in stage 0 so that one has an identity shortcut.
    "wresnet-tiny": WResNetConfig(
        num_channels=8, width_factor=2, blocks=(2, 1, 1, 1), image_size=32, num_classes=10, norm_groups=4
    ),
    # Alpa benchmark/alpa/suite_wresnet.py wresnet_specs (commit b8078a9f): 50 layers, image 224, fp32,
    # (num_channels, width_factor) of "250M" ... "4B".
    "wresnet-250m": WResNetConfig(num_channels=160, width_factor=2),
    "wresnet-500m": WResNetConfig(num_channels=224, width_factor=2),
    "wresnet-1b": WResNetConfig(num_channels=320, width_factor=2),
    "wresnet-2b": WResNetConfig(num_channels=448, width_factor=2),
    "wresnet-4b": WResNetConfig(num_channels=640, width_factor=2),
}


def _norm(channels: int, cfg: WResNetConfig) -> nn.GroupNorm:
    return nn.GroupNorm(cfg.norm_groups, channels)


class Stem(nn.Module):
    """conv7x7 stride 2 (no bias) + norm + ReLU + maxpool 3x3 stride 2."""

    def __init__(self, cfg: WResNetConfig) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, cfg.num_channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.norm = _norm(cfg.num_channels, cfg)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))


class Bottleneck(nn.Module):
    """Alpa's ``BottleneckResNetBlock``: conv1x1 to ``filters``, conv3x3 to ``filters * width_factor``,
    conv1x1 to ``4 * filters``; a projection shortcut where the shape changes."""

    def __init__(self, in_channels: int, filters: int, stride: int, cfg: WResNetConfig) -> None:
        super().__init__()
        wide, out = filters * cfg.width_factor, 4 * filters
        self.conv1 = nn.Conv2d(in_channels, filters, kernel_size=1, bias=False)
        self.norm1 = _norm(filters, cfg)
        self.conv2 = nn.Conv2d(filters, wide, kernel_size=3, stride=stride, padding=1, bias=False)
        self.norm2 = _norm(wide, cfg)
        self.conv3 = nn.Conv2d(wide, out, kernel_size=1, bias=False)
        self.norm3 = _norm(out, cfg)
        nn.init.zeros_(self.norm3.weight)  # zero-init last norm scale, Alpa's scale_init=zeros
        self.proj: nn.Module | None = None
        if stride != 1 or in_channels != out:
            self.proj = nn.Conv2d(in_channels, out, kernel_size=1, stride=stride, bias=False)
            self.proj_norm = _norm(out, cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        residual = x if self.proj is None else self.proj_norm(self.proj(x))
        return F.relu(residual + y)


class Head(nn.Module):
    """Global average pool + linear classifier (Alpa: ``jnp.mean`` over H, W + ``nn.Dense``)."""

    def __init__(self, in_channels: int, cfg: WResNetConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


_SHARD_NORM = ShardParams({"weight": 0, "bias": 0}, divide=("num_groups", "num_channels"))
_STEM_TP = TensorParallelPlan([("conv", ColumnParallel()), ("norm", _SHARD_NORM), ("pool", GatherOutput(dim=1))])
_BLOCK_TP = TensorParallelPlan(
    [
        ("conv1", ColumnParallel()),
        ("norm1", _SHARD_NORM),
        ("conv2", RowParallel()),
        ("conv3", ColumnParallel()),
        ("norm3", _SHARD_NORM),
        ("norm3", GatherOutput(dim=1)),
    ]
)
_PROJ_TP = [("proj", ColumnParallel()), ("proj_norm", _SHARD_NORM), ("proj_norm", GatherOutput(dim=1))]
_PROJ_BLOCK_TP = TensorParallelPlan([*_BLOCK_TP.rules, *_PROJ_TP])
_HEAD_TP = TensorParallelPlan([("fc", ColumnParallel()), ("fc", GatherOutput(dim=-1))])


class WResNet(LayeredModel):
    """A Wide-ResNet as ``[stem, block0, ..., block{n-1}, head]``.

    Example:
        >>> m = WResNet("wresnet-250m", WRESNET_CONFIGS["wresnet-250m"])
        >>> m.num_layers, m.layer_name(0), m.layer_name(1), m.layer_name(17)
        (18, 'stem', 'block0', 'head')
    """

    def __init__(self, name: str, cfg: WResNetConfig) -> None:
        self.name = name
        self.cfg = cfg
        self._blocks = self._block_shapes(cfg.blocks)
        for what, channels in self._channel_counts():
            if channels % cfg.norm_groups:
                raise ModelError(
                    f"Wide-ResNet {name!r}: {what} has {channels} channels, not divisible by norm_groups"
                    f" {cfg.norm_groups}",
                    fix="choose norm_groups dividing num_channels (and so every channel count)",
                )

    def _block_shapes(self, blocks: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(in_channels, filters, stride)`` of each bottleneck block, in order."""
        shapes, channels = [], self.cfg.num_channels
        for stage, count in enumerate(blocks):
            filters = self.cfg.num_channels * 2**stage
            for j in range(count):
                shapes.append((channels, filters, 2 if stage > 0 and j == 0 else 1))
                channels = 4 * filters
        return shapes

    def _channel_counts(self) -> list[tuple[str, int]]:
        counts = [("stem", self.cfg.num_channels)]
        for i, (_, filters, _) in enumerate(self._blocks):
            counts += [(f"block{i} conv1", filters), (f"block{i} conv2", filters * self.cfg.width_factor)]
        return counts

    @property
    def num_layers(self) -> int:
        return len(self._blocks) + 2

    def layer_name(self, index: int) -> str:
        if index == 0:
            return "stem"
        if index == self.num_layers - 1:
            return "head"
        return f"block{index - 1}"

    def build_layer(self, index: int) -> nn.Module:
        if index == 0:
            return Stem(self.cfg)
        if index == self.num_layers - 1:
            return Head(4 * self._blocks[-1][1], self.cfg)
        return Bottleneck(*self._blocks[index - 1], self.cfg)

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        if index == 0:
            return _STEM_TP
        if index == self.num_layers - 1:
            return _HEAD_TP
        in_channels, filters, stride = self._blocks[index - 1]
        return _PROJ_BLOCK_TP if stride != 1 or in_channels != 4 * filters else _BLOCK_TP

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.cfg.image_size
        images = torch.randn((num_samples, 3, size, size), generator=generator)
        labels = torch.randint(0, self.cfg.num_classes, (num_samples,), generator=generator)
        return images, labels

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "family": "wresnet", **asdict(self.cfg)}

    def describe(self) -> str:
        c = self.cfg
        return (
            f"{self.name}: Wide-ResNet, {self.num_layers} layers (stem, {len(self._blocks)} bottleneck blocks"
            f" {list(c.blocks)}, head), channels {c.num_channels}, width x{c.width_factor}, image {c.image_size},"
            f" {c.num_classes} classes, GroupNorm({c.norm_groups})"
        )


for _name, _cfg in WRESNET_CONFIGS.items():
    register(_name, partial(WResNet, _name, _cfg))
