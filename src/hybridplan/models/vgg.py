"""VGG11 (Simonyan & Zisserman, 2015, configuration "A"), as mCAP partitioned it: torchvision ``vgg11``.

mCAP profiles torchvision's ``vgg11`` (no batch norm) as the flat list of its modules, 30 layers:
the 21 modules of ``features`` (8 conv3x3, 8 ReLU, 5 max-pool), ``avgpool`` (adaptive to 7x7),
``flatten``, and the 7 modules of ``classifier`` (Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear).
Each module is one layer here too, so partitions line up with mCAP's.

Two deliberate differences from torchvision: Dropout has ``p=0.0`` (random masks would make the loss
depend on how the batch is split into micro-batches and shards, so plans could not be compared with
a single-device run; the layers are kept so the count stays 30), and ReLU is not in-place (a layer's
input may be a leaf received from another stage, which autograd forbids modifying in place).

Tensor parallelism: each conv layer is column-parallel over output channels with the output
all-gathered on channels, each linear column-parallel with the output all-gathered on features;
parameterless layers have an empty plan (computed replicated on every rank).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import ColumnParallel, GatherOutput, TensorParallelPlan
from hybridplan.models.zoo import register

__all__ = ["VGGConfig", "VGG", "VGG_CONFIGS"]

POOL = 0
"""Marker for a max-pool in :attr:`VGGConfig.features`."""


@dataclass(frozen=True, kw_only=True)
class VGGConfig:
    """Size of a VGG."""

    features: tuple[int, ...]
    """Output channels of each conv3x3 (+ ReLU), with :data:`POOL` (0) for each 2x2 max-pool."""
    classifier_width: int = 4096
    """Width of the two hidden classifier layers (torchvision: 4096)."""
    pool_size: int = 7
    """Side of the adaptive average pool output (torchvision: 7)."""
    image_size: int = 224
    """Height and width of the square input images (ImageNet, as in mCAP)."""
    num_classes: int = 1000
    """Output classes."""


# torchvision.models.vgg cfgs["A"] (vgg11).
_VGG11 = (64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL)

VGG_CONFIGS: dict[str, VGGConfig] = {
    "vgg11": VGGConfig(features=_VGG11),
    # Same 30 layers, channels / 16, small classifier; image 32 reaches 1x1 after the 5 pools.
    "vgg11-tiny": VGGConfig(
        features=tuple(c // 16 for c in _VGG11), classifier_width=64, image_size=32, num_classes=10
    ),
}

_CONV_TP = TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput(dim=1))])
_LINEAR_TP = TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput(dim=-1))])
_REPLICATED_TP = TensorParallelPlan([])


class VGG(LayeredModel):
    """A VGG as the flat list of torchvision's modules (30 layers for VGG11).

    Example:
        >>> m = VGG("vgg11", VGG_CONFIGS["vgg11"])
        >>> m.num_layers, m.layer_name(0), m.layer_name(21), m.layer_name(29)
        (30, 'conv0', 'avgpool', 'fc2')
    """

    def __init__(self, name: str, cfg: VGGConfig) -> None:
        self.name = name
        self.cfg = cfg
        self._specs = self._layer_specs()

    def _layer_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(name, kind, sizes)`` of each layer: kind is conv, relu, pool, avgpool, flatten, linear or dropout."""
        specs: list[tuple[str, str, tuple[int, ...]]] = []
        channels, counts = 3, {"conv": 0, "relu": 0, "pool": 0, "fc": 0, "dropout": 0}

        def add(kind: str, sizes: tuple[int, ...] = (), prefix: str | None = None) -> None:
            prefix = prefix or kind
            specs.append((f"{prefix}{counts[prefix]}", kind, sizes))
            counts[prefix] += 1

        for c in self.cfg.features:
            if c == POOL:
                add("pool")
            else:
                add("conv", (channels, c))
                add("relu")
                channels = c
        specs.append(("avgpool", "avgpool", ()))
        specs.append(("flatten", "flatten", ()))
        width, flat = self.cfg.classifier_width, channels * self.cfg.pool_size**2
        for i, (n_in, n_out) in enumerate([(flat, width), (width, width), (width, self.cfg.num_classes)]):
            add("linear", (n_in, n_out), prefix="fc")
            if i < 2:
                add("relu")
                add("dropout")
        return specs

    @property
    def num_layers(self) -> int:
        return len(self._specs)

    def layer_name(self, index: int) -> str:
        return self._specs[index][0]

    def build_layer(self, index: int) -> nn.Module:
        _, kind, sizes = self._specs[index]
        if kind == "conv":
            return nn.Conv2d(sizes[0], sizes[1], kernel_size=3, padding=1)
        if kind == "linear":
            return nn.Linear(sizes[0], sizes[1])
        if kind == "relu":
            return nn.ReLU()
        if kind == "pool":
            return nn.MaxPool2d(kernel_size=2, stride=2)
        if kind == "avgpool":
            return nn.AdaptiveAvgPool2d(self.cfg.pool_size)
        if kind == "flatten":
            return nn.Flatten(1)
        return nn.Dropout(p=0.0)

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        kind = self._specs[index][1]
        if kind == "conv":
            return _CONV_TP
        if kind == "linear":
            return _LINEAR_TP
        return _REPLICATED_TP

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.cfg.image_size
        images = torch.randn((num_samples, 3, size, size), generator=generator)
        labels = torch.randint(0, self.cfg.num_classes, (num_samples,), generator=generator)
        return images, labels

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "family": "vgg", **asdict(self.cfg)}

    def describe(self) -> str:
        c = self.cfg
        convs = [x for x in c.features if x != POOL]
        return (
            f"{self.name}: VGG, {self.num_layers} layers ({len(convs)} conv + ReLU, {c.features.count(POOL)} max-pool,"
            f" avgpool, flatten, 3-linear classifier width {c.classifier_width}), image {c.image_size},"
            f" {c.num_classes} classes"
        )


for _name, _cfg in VGG_CONFIGS.items():
    register(_name, partial(VGG, _name, _cfg))
