"""Building one stage: its layers with deterministic weights, split for tensor parallelism if asked,
optionally checkpointed; and gathering a stage's full weights back (for checks).

The shapes of the tensors that cross a stage's boundaries are the model's (models/boundaries.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hybridplan.models.base import LayeredModel, build_layers
from hybridplan.models.tensor_parallel import TensorParallelGroup, full_parameter, without_gathered_output
from hybridplan.plan import StagePlan
from hybridplan.runtime.checkpointing import selective_contexts

__all__ = ["build_stage_module", "unsplit_state", "CheckpointedSequential"]


class CheckpointedSequential(nn.Sequential):
    """An ``nn.Sequential`` that runs its layers under activation checkpointing: every layer (``selective`` None),
    or torchtitan's per-operation policy on the layers ``selective`` marks and nothing on the others.

    A fully checkpointed layer keeps only its input for the backward pass and recomputes its activations there
    (``torch.utils.checkpoint``, non-reentrant, as torch recommends); a selectively checkpointed one keeps what
    runtime/checkpointing.py's policy keeps as well. The parameters keep the plain ``nn.Sequential`` names, so
    saved weights and checks do not change.

    ``preserve_rng_state=False``: stashing the RNG state would allocate a tensor per layer and
    micro-batch, and no zoo layer draws random numbers in its forward (VGG's dropout has p=0; a
    recomputed dropout with another mask would change the math, so a user model with random layers
    should not be checkpointed).
    """

    def __init__(self, *layers: nn.Module, selective: Sequence[bool] | None = None) -> None:
        super().__init__(*layers)
        if selective is not None and len(selective) != len(layers):
            raise ValueError(f"{len(selective)} selective flags for {len(layers)} layers")
        self.selective = None if selective is None else tuple(selective)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for i, layer in enumerate(self):
            if self.selective is None:
                x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=False)
            elif self.selective[i]:
                x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=False, context_fn=selective_contexts)
            else:
                x = layer(x)
        return x


def build_stage_module(
    model: LayeredModel,
    stage: StagePlan,
    *,
    seed: int,
    device: torch.device,
    tp: TensorParallelGroup | None,
    checkpointing: bool | str = False,
    each_layer: Callable[[nn.Module], None] | None = None,
    split_loss: bool = False,
) -> nn.Sequential:
    """The stage's layers as an ``nn.Sequential`` on ``device``; split over ``tp`` for a tensor stage.

    Each layer is built whole from its seed, then sharded, so a tensor-parallel stage holds exactly the
    slices of the weights a single device would hold. With ``checkpointing`` (True or "full") every layer recomputes
    its activations in the backward pass; with "selective" the layers between the model's first and last (its
    blocks, not the embedding and the head) keep what torchtitan's per-operation policy keeps and recompute the
    rest (:class:`CheckpointedSequential`, runtime/checkpointing.py). ``split_loss``: the model's last layer keeps
    its tensor-parallel output split by vocabulary (its split without ``GatherOutput``), for the loss computed on
    the shards (``RunConfig.loss = "vocab-parallel"``). ``each_layer`` (FSDP's sharding of a
    ZeRO-2/3 stage: runtime/sharding.py ``shard_layer``) is applied to each layer once it is split.

    [Note: a layer is sharded before the next is built] A device never holds more than one whole layer: each
    layer is split (and sharded by ``each_layer``) before the next one is built. Built all at once, a stage held
    its every whole layer before any split, and that could be more than its training iteration ever holds:
    MoE 1.3B at a hidden size of 3,152 (benchmarks/extension_gain, the largest-model column), layers 9-17 as a
    data 2 x tensor 4 ZeRO-1 stage, predicted to peak at 35.4 GB a device, ran out of 40 GiB simulated devices
    while building (43.9 GB of whole fp32 layers live); gpt-tiny's ten layers so, in bf16, needed 1,677,824 bytes
    of device for an iteration peak of 1,221,056 (tests/runtime/test_stage.py). The weights do not change: each
    layer is built from its own seed (models/base.py ``build_layers``), whichever layers are built before it.
    """
    layers = []
    for index in stage.layers:
        if device.type == "cpu":  # the device context manager imports torch._dynamo (~2 s per process)
            layer = build_layers(model, index, index + 1, seed)[0]
        else:
            with torch.device(device):
                layer = build_layers(model, index, index + 1, seed)[0]
        if tp is not None:
            tp_plan = model.tensor_parallel_plan(index)
            if tp_plan is None:  # Plan.validate rejects this earlier; kept as a guard for direct library use
                raise ValueError(f"layer {index} of {model.name} has no tensor-parallel split")
            if split_loss and index == model.num_layers - 1:
                tp_plan = without_gathered_output(tp_plan)
            tp_plan.apply(layer, tp)
        if each_layer is not None:
            each_layer(layer)
        layers.append(layer)
    if checkpointing == "selective":
        blocks = [0 < index < model.num_layers - 1 for index in stage.layers]
        return CheckpointedSequential(*layers, selective=blocks)
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
            grad = p.grad if p.grad is not None else getattr(p, "main_grad", None)  # runtime/grad_buffers.py
            if grad is not None:
                grads[key] = full_parameter(grad).cpu().clone()
    return weights, grads
