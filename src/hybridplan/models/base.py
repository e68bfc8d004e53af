"""The layered-model protocol: an ordered list of layers (the unit of partitioning), data, and loss.

A pipeline stage holds a contiguous range of layers. Each layer maps ONE batch-first tensor to ONE
batch-first tensor (dim 0 is the sample), which is what lets the runtime cut the model between any two
layers and re-split activations between stages of different degrees. A layer may declare how it is
split for tensor parallelism (:mod:`hybridplan.models.tensor_parallel`); a layer that declares nothing
cannot be in a tensor-parallel stage.

Weights are deterministic: layer ``i`` is built right after seeding the RNG with ``layer_seed(seed, i)``,
so every plan (and every process) starts from the same weights and trains the same math.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hybridplan.models.tensor_parallel import TensorParallelPlan

__all__ = ["LayeredModel", "layer_seed", "build_layers", "seeded", "parameter_shapes"]


def layer_seed(seed: int, layer: int) -> int:
    """The RNG seed used to build ``layer``: distinct per layer, identical in every process and plan."""
    return (seed * 1_000_003 + layer * 7919 + 17) % (2**63 - 1)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with the global RNGs seeded, restoring their state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class LayeredModel(ABC):
    """A model as an ordered list of layers plus how to make a synthetic batch and the loss.

    Subclasses implement :attr:`num_layers`, :meth:`layer_name`, :meth:`build_layer`, :meth:`make_batch`
    and :meth:`loss`; they override :meth:`tensor_parallel_plan` for layers that can be split.
    """

    name: str = "model"
    """Registry name, e.g. ``"gpt-tiny"``."""

    vocab_parallel_loss: bool = False
    """Whether the loss may be computed on a tensor-parallel last layer's vocabulary shards
    (models/tensor_parallel.py ``vocab_parallel_cross_entropy``; ``RunConfig.loss``): True where :meth:`loss` is
    the mean cross entropy over the output's last dimension, which the last layer's split gathers (a language
    model's head)."""

    @property
    @abstractmethod
    def num_layers(self) -> int:
        """Number of layers (the partitioning unit)."""

    @abstractmethod
    def layer_name(self, index: int) -> str:
        """Short human-readable name of layer ``index``, e.g. ``"block3"``."""

    @abstractmethod
    def build_layer(self, index: int) -> nn.Module:
        """A fresh layer ``index`` with default initialisation, on the current default device.

        Callers seed the RNG first (:func:`build_layers`); implementations must draw their random
        numbers only from the global RNG so that the seed fixes the weights.
        """

    @abstractmethod
    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A synthetic batch ``(inputs, targets)`` of ``num_samples`` samples (dim 0), on the CPU.

        Sample ``j`` must depend only on the generator state, so that the same global batch is produced
        whatever the plan.
        """

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Scalar loss: the MEAN over the samples of the batch (the runtime relies on the mean to
        weight micro-batch and data-parallel shards)."""

    @property
    def sample_granularity(self) -> int:
        """Every micro-batch and data-parallel shard must hold a multiple of this many samples.

        1 for most models; a GShard MoE groups tokens across samples (hybridplan/models/moe.py).
        """
        return 1

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        """How layer ``index`` is split for tensor parallelism, or ``None`` if it cannot be."""
        return None

    def tensor_parallel_problem(self, index: int, degree: int) -> str | None:
        """Why layer ``index`` cannot be tensor-parallel at ``degree``, or ``None`` if it can."""
        plan = self.tensor_parallel_plan(index)
        if plan is None:
            return "this layer has no tensor-parallel split"
        signature = self.layer_signature(index)
        known: dict[tuple[str, int], str | None] = self.__dict__.setdefault("_tensor_parallel_problems", {})
        if signature is not None and (signature, degree) in known:  # the same layer: the same answer
            return known[(signature, degree)]
        with torch.device("meta"):
            layer = self.build_layer(index)
        problem = plan.problem(layer, degree)
        if signature is not None:
            known[(signature, degree)] = problem
        return problem

    def layer_signature(self, index: int) -> str | None:
        """What layer ``index`` is, apart from where it sits: two layers with the same (non-None) signature build
        the same modules (classes, shapes, dtypes, tensor-parallel split), take inputs of the same shape and run the
        same operations, so a stage over them holds the same bytes whichever of them it holds.

        A simulated profile measures each distinct span of signatures once (profiling/stage_memo.py: a Llama's 32
        decoder layers are one ``"decoder"``), so a signature must name everything the layer's memory depends on.
        ``None`` (the default) claims nothing: the layer is measured as itself.
        """
        return None

    def config(self) -> dict[str, Any]:
        """The model's hyper-parameters, for reports and profile databases."""
        return {"name": self.name}

    def describe(self) -> str:
        """One line for ``hybridplan models``."""
        return f"{self.name}: {self.num_layers} layers"

    def parameter_count(self) -> int:
        """Total parameters, counted on the meta device (no memory needed)."""
        total = 0
        with torch.device("meta"):
            for i in range(self.num_layers):
                total += sum(p.numel() for p in self.build_layer(i).parameters())
        return total


def parameter_shapes(model: LayeredModel) -> list[list[list[int]]]:
    """Each layer's trained parameters as ``[bytes per element, *shape]``, in ``parameters()`` order, built on
    the meta device (no memory, no run).

    What ZeRO shards is a function of these alone (ZeroRedundancyOptimizer's partition, FSDP2's dim-0
    chunks; predict/zero_layout.py), so a profile records them and predicts any sharding without running it."""
    out = []
    with torch.device("meta"):
        for i in range(model.num_layers):
            out.append([[p.element_size(), *p.shape] for p in model.build_layer(i).parameters() if p.requires_grad])
    return out


def build_layers(model: LayeredModel, start: int, stop: int, seed: int) -> list[nn.Module]:
    """Build layers ``[start, stop)`` with their deterministic weights (see :func:`layer_seed`)."""
    layers = []
    for i in range(start, stop):
        with seeded(layer_seed(seed, i)):
            layers.append(model.build_layer(i))
    return layers
