"""The tensors that cross a model's layer boundaries: one sample's shape and dtype before every layer.

A pipeline stage receives the output of the layer before its first one and sends the output of its
last one, so the runtime must know those shapes before any data flows: a receive allocates its buffer
from them (runtime/executor.py), and a slice of a model that starts inside it makes inputs of that shape
(models/slice.py). They are a property of the model alone, found by running the layers on the meta
device: no memory, no compute.

Example::

    >>> from hybridplan.models.zoo import get_model
    >>> specs = boundary_specs(get_model("gpt-tiny"))
    >>> specs[0], specs[1].sample_shape
    (BoundarySpec(sample_shape=(16,), dtype=torch.int64), (16, 64))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel

__all__ = ["BoundarySpec", "boundary_specs"]


@dataclass(frozen=True)
class BoundarySpec:
    """Shape of one sample (without the batch dim) and dtype of a tensor crossing a stage boundary."""

    sample_shape: tuple[int, ...]
    dtype: torch.dtype


def boundary_specs(model: LayeredModel, stop: int | None = None) -> list[BoundarySpec]:
    """``specs[i]`` describes one sample of the input of layer ``i`` (``specs[num_layers]``: the output).

    Computed once per model object (a profile asks for them from many places; a 7B model's meta-device
    forward takes over a second), and a layer whose signature (``LayeredModel.layer_signature``) and input equal an
    earlier layer's gives that layer's output without being built again.

    Args:
        model: the layered model.
        stop: compute the specs of layers ``0 .. stop`` only (default: every layer and the output); the
            first meta-device forward of a process costs about a second, the later layers little.

    Raises:
        ModelError: if a layer fails on a meta-device batch, or does not return one batch-first tensor.
    """
    stop = model.num_layers if stop is None else stop
    known: dict[int, list[BoundarySpec]] = model.__dict__.setdefault("_boundary_specs", {})
    if stop not in known:
        known[stop] = _compute_specs(model, stop)
    return list(known[stop])


def _compute_specs(model: LayeredModel, stop: int) -> list[BoundarySpec]:
    seen: dict[tuple[str, BoundarySpec], BoundarySpec] = {}
    inputs, _ = model.make_batch(model.sample_granularity, torch.Generator().manual_seed(0))
    x = inputs.to("meta")
    specs = [BoundarySpec(tuple(x.shape[1:]), x.dtype)]
    with torch.device("meta"):
        for i in range(stop):
            signature = model.layer_signature(i)
            known = seen.get((signature, specs[-1])) if signature is not None else None
            if known is not None:
                specs.append(known)
                x = torch.empty((x.shape[0], *known.sample_shape), dtype=known.dtype)
                continue
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
            if signature is not None:
                seen[(signature, specs[-1])] = BoundarySpec(tuple(x.shape[1:]), x.dtype)
            specs.append(BoundarySpec(tuple(x.shape[1:]), x.dtype))
    return specs  # per-sample shapes: the batch dimension is dropped
