"""What the time model knows about one layer, independent of device and batch; a stage's parameter bytes and
tensors, shared parameters (tied embeddings) counted once.

A :class:`LayerInfo` gives the bytes that cross a pipeline-stage boundary placed right after the layer (per
sample), the bytes of its gradients that data parallelism all-reduces, how many activation all-reduces tensor
parallelism adds to it, and which parameters it shares with other layers. Its JSON keys are in
:mod:`hybridplan.profiling.time_profile_json`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["LayerInfo", "parameter_bytes", "parameter_tensors"]


@dataclass(frozen=True, kw_only=True)
class LayerInfo:
    """Static facts about one layer of the chain (independent of device and batch)."""

    name: str
    """Human-readable name, e.g. ``"block3"``."""
    activation_bytes_per_sample: float
    """Bytes per sample that cross a stage boundary placed right after this layer (for a plain chain, the
    layer's output; for a linearised DAG, every earlier output still needed later). Also the volume of the
    layer's tensor-parallel all-reduces."""
    parameter_bytes: float
    """Bytes of this layer's gradients as a data-parallel all-reduce sends them (parameters x bytes per
    gradient element: 4 for fp32 gradients or DeepSpeed's ``fp32_allreduce``, 2 for fp16)."""
    tensor_parallel_allreduces: tuple[int, int] = (0, 0)
    """(forward, backward) all-reduces of the activation this layer needs when tensor-parallel. Megatron
    transformer block: (2, 2) (Shoeybi et al. 2019, section 3, figure 4)."""
    shared_parameters: str | None = None
    """Layers with the same tag hold one parameter tensor (tied embeddings): a stage counts it once."""
    parameter_tensors: int | None = None
    """Trainable parameter tensors of the layer (the runtime all-reduces each on its own); None: not recorded."""


def parameter_tensors(layers: Sequence[LayerInfo]) -> int:
    """The trainable parameter tensors one copy of ``layers`` holds, shared layers once (as :func:`parameter_bytes`);
    a layer that did not record its count (an older or imported profile) counts 1 if it has parameters: a lower
    bound, every layer with parameters has at least one tensor.

    Example:
        >>> parameter_tensors([LayerInfo(name="a", activation_bytes_per_sample=0, parameter_bytes=8, parameter_tensors=3),
        ...                    LayerInfo(name="b", activation_bytes_per_sample=0, parameter_bytes=8)])
        4
    """
    return sum(layer.parameter_tensors if layer.parameter_tensors is not None else int(layer.parameter_bytes > 0)
               for layer in _each_copy_once(layers))


def parameter_bytes(layers: Sequence[LayerInfo]) -> float:
    """The parameter bytes one copy of ``layers`` holds: layers that share parameters (tied embeddings) count once.

    Example:
        >>> parameter_bytes([LayerInfo(name="a", activation_bytes_per_sample=0, parameter_bytes=8, shared_parameters="e"),
        ...                  LayerInfo(name="b", activation_bytes_per_sample=0, parameter_bytes=8, shared_parameters="e")])
        8.0
    """
    return float(sum(layer.parameter_bytes for layer in _each_copy_once(layers)))


def _each_copy_once(layers: Sequence[LayerInfo]) -> Iterator[LayerInfo]:
    """``layers`` without the repeats of a shared parameter tag (tied embeddings: a stage holds one copy)."""
    seen: set[str] = set()
    for layer in layers:
        if layer.shared_parameters is not None:
            if layer.shared_parameters in seen:
                continue
            seen.add(layer.shared_parameters)
        yield layer
