"""Per-layer bytes of a PipeDream-2BW weight stash, counted on fake tensors without running anything.

A 2BW stage keeps an older copy of its trainable parameters (runtime/weight_stash.py, [Note: 2BW weight
versions]): one plain tensor per parameter storage, in the compute dtype. The memory predictor adds those
bytes to profiles taken under another schedule ([Note: predicting PipeDream-2BW] in predict/stash.py),
so the profiling campaign records them per layer, per stage kind and degree (profiling/auxiliary_tables.py). They
are counted by building every layer exactly as the runtime does (runtime/split_layers.py: tensor-parallel
shards on a fake process group; then the mixed-precision cast) on fake tensors: no device memory, no compute.
"""

from __future__ import annotations

import torch

from hybridplan.models.base import LayeredModel

__all__ = ["layer_stash_bytes"]


def layer_stash_bytes(
    model: LayeredModel, kind: str, degree: int, *, precision: str = "fp32", device_type: str = "cpu"
) -> list[int | None]:
    """Per-device bytes a 2BW weight stash holds for each layer of ``model`` in a ``kind`` x ``degree`` stage.

    Stash tensors are one per parameter storage, so a stage's stash is the sum of its layers'. For
    ``device_type="cuda"`` each tensor counts the CUDA caching allocator's block (runtime/gpu_memory.py),
    as the runtime's GPU meters see it.

    Args:
        model: the layered model.
        kind: the stage's parallelism ("none", "data" or "tensor"); only "tensor" at a degree above 1 shards.
        degree: the stage's device count.
        precision: the run's precision (the stash is in its compute dtype).
        device_type: "cpu" (exact bytes) or "cuda" (allocator blocks).

    Returns:
        One entry per layer: its bytes, or ``None`` for a layer that cannot be tensor-parallel at ``degree``.

    Raises:
        UsageError: if this process already has a process group (the fake one cannot be set up).

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> sizes = layer_stash_bytes(get_model("gpt-tiny"), "tensor", 2)
        >>> len(sizes), sizes[1] < layer_stash_bytes(get_model("gpt-tiny"), "none", 1)[1]
        (10, True)
    """
    from hybridplan.runtime.split_layers import per_layer
    from hybridplan.runtime.gpu_memory import cuda_block_bytes
    from hybridplan.runtime.memory import storage_tensors
    from hybridplan.runtime.precision import cast_module, compute_dtype

    dtype = compute_dtype(precision)

    def stash(module: torch.nn.Module) -> int:
        if dtype != torch.float32:
            cast_module(module, dtype)
        total = 0
        for p in module.parameters():
            if p.requires_grad:
                for t in storage_tensors(p):
                    n = t.numel() * t.element_size()
                    total += cuda_block_bytes(n) if device_type == "cuda" else n
        return total

    return per_layer(model, kind, degree, stash)
