"""Building one stage: its layers with deterministic weights, split for tensor parallelism if asked,
optionally checkpointed; and gathering a stage's full weights back (for checks).

The shapes of the tensors that cross a stage's boundaries are the model's (models/boundaries.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hybridplan.models.base import LayeredModel, build_layers
from hybridplan.models.tensor_parallel import TensorParallelGroup, full_parameter
from hybridplan.plan import StagePlan

__all__ = ["build_stage_module", "unsplit_state", "CheckpointedSequential"]


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` that runs every layer under activation checkpointing.

    Each layer keeps only its input for the backward pass and recomputes its activations there
    (``torch.utils.checkpoint``, non-reentrant, as torch recommends). The parameters keep the plain
    ``nn.Sequential`` names, so saved weights and checks do not change.

    ``preserve_rng_state=False``: stashing the RNG state would allocate a tensor per layer and
    micro-batch, and no zoo layer draws random numbers in its forward (VGG's dropout has p=0; a
    recomputed dropout with another mask would change the math, so a user model with random layers
    should not be checkpointed).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for layer in self:
            x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=False)
        return x


def build_stage_module(
    model: LayeredModel,
    stage: StagePlan,
    *,
    seed: int,
    device: torch.device,
    tp: TensorParallelGroup | None,
    checkpointing: bool = False,
) -> nn.Sequential:
    """The stage's layers as an ``nn.Sequential`` on ``device``; split over ``tp`` for a tensor stage.

    Each layer is built whole from its seed, then sharded, so a tensor-parallel stage holds exactly the
    slices of the weights a single device would hold. With ``checkpointing`` every layer recomputes its
    activations in the backward pass (:class:`CheckpointedSequential`).
    """
    if device.type == "cpu":  # the device context manager imports torch._dynamo (~2 s per process)
        layers = build_layers(model, stage.start, stage.stop, seed)
    else:
        with torch.device(device):
            layers = build_layers(model, stage.start, stage.stop, seed)
    if tp is not None:
        for index, layer in zip(stage.layers, layers, strict=True):
            tp_plan = model.tensor_parallel_plan(index)
            if tp_plan is None:  # Plan.validate rejects this earlier; kept as a guard for direct library use
                raise ValueError(f"layer {index} of {model.name} has no tensor-parallel split")
            tp_plan.apply(layer, tp)
    return CheckpointedSequential(*layers) if checkpointing else nn.Sequential(*layers)


def _unsplit_name(name: str) -> str:
    """Map a parameter name of a split layer back to the unsplit layer's name."""
    name = name.replace("parametrizations.", "").replace(".original", "")
    if name.endswith("tp_bias"):
        name = name[: -len("tp_bias")] + "bias"
    return name


def unsplit_state(module: nn.Sequential, first_layer: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Full weights and gradients of a stage keyed ``"<layer>.<param>"`` as the unsplit model names them.

    Gathers tensor-parallel shards (a collective: every rank of the stage must call it).
    """
    weights: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    for offset, layer in enumerate(module):
        for name, p in layer.named_parameters():
            key = f"{first_layer + offset}.{_unsplit_name(name)}"
            weights[key] = full_parameter(p).cpu().clone()
            if p.grad is not None:
                grads[key] = full_parameter(p.grad).cpu().clone()
    return weights, grads
