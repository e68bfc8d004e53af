"""Building one stage: its layers with deterministic weights, split for tensor parallelism if asked,
and the shapes of the tensors that cross its boundaries."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel, build_layers
from hybridplan.models.tensor_parallel import TensorParallelGroup, full_parameter
from hybridplan.plan import StagePlan
from hybridplan.runtime.executor import BoundarySpec

__all__ = ["build_stage_module", "boundary_specs", "unsplit_state", "CheckpointedSequential"]


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


def boundary_specs(model: LayeredModel, stop: int | None = None) -> list[BoundarySpec]:
    """``specs[i]`` describes one sample of the input of layer ``i`` (``specs[num_layers]``: the output).

    Computed by running the layers on the meta device: no memory, no compute.
    """
    stop = model.num_layers if stop is None else stop
    inputs, _ = model.make_batch(model.sample_granularity, torch.Generator().manual_seed(0))
    x = inputs.to("meta")
    specs = [BoundarySpec(tuple(x.shape[1:]), x.dtype)]
    with torch.device("meta"):
        for i in range(stop):
            try:
                x = model.build_layer(i)(x)
            except Exception as e:  # a user model's layer: report which one and why
                raise ModelError(
                    f"layer {i} ({model.layer_name(i)}) of {model.name} failed on a meta-device batch of shape"
                    f" {tuple(x.shape)}: {type(e).__name__}: {e}",
                    fix="every layer must take one batch-first tensor, return one, and run on the meta device",
                ) from e
            if not isinstance(x, torch.Tensor) or x.dim() == 0:
                raise ModelError(
                    f"layer {i} ({model.layer_name(i)}) of {model.name} returned {type(x).__name__}"
                    f"{'' if not isinstance(x, torch.Tensor) else ' with no batch dimension'}",
                    fix="every layer must return one tensor whose first dimension is the batch",
                )
            specs.append(BoundarySpec(tuple(x.shape[1:]), x.dtype))
    return specs  # per-sample shapes: the batch dimension is dropped


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
