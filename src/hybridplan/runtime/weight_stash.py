"""PipeDream-2BW's double-buffered weights: two versions of a stage's parameters, gradients on the older.

[Note: 2BW weight versions] PipeDream-2BW (Narayanan et al., ICML 2021; seed 003, "Semantics Comparison")
updates ``W(t+1) = W(t) - nu * grad f(W(t-1))``: the forward and backward passes of iteration ``t`` run on
the previous version ``W(t-1)``, and the optimizer applies that gradient to the newest version ``W(t)``. A
stage holds two versions ("2 weight versions", the slides' memory line). The executor keeps

- the module's parameters: the newest version between iterations (what the optimizer updates, what a
  saved checkpoint holds);
- the stash: one plain tensor per parameter storage (a DTensor parameter's local shard), in the
  parameter's dtype: the previous version.

Per iteration: at the start, :meth:`WeightStash.use_stale` swaps the two (pointer swaps through
``tensor.data``: no copy, no allocation), so the forward and backward passes compute on ``W(t-1)``; before
the step, :meth:`WeightStash.rotate` swaps back and copies the newest version into the stash (``W(t)``
becomes the next iteration's stale version); the optimizer then turns the parameters into ``W(t+1)``. The
first iteration has no older version: the stash starts as a copy of the initial weights (``W(-1) = W(0)``),
so iteration 0 trains exactly as 1F1B does, and later ones differ.

Memory: one more copy of the trainable parameters in the compute dtype, allocated when the executor is
built and filed under "weight_stash"; the swaps and the copy allocate nothing, so everything else in the
iteration is 1F1B's to the byte. With mixed precision the optimizer's fp32 masters hold ``W(t)`` and are
not stashed: the stale version is only computed with, in the low precision. :func:`layer_stash_bytes`
gives these bytes per layer without running anything (the memory predictor adds them to profiles taken
under another schedule; predict/memory.py).

The runtime still ends every iteration at a barrier (it measures per iteration), so its iteration TIME is
PipeDream-Flush's; the flush-free pipeline of the paper is what the cost model predicts
(predict/time_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hybridplan.models.base import LayeredModel
from hybridplan.runtime.memory import _storage_tensors

__all__ = ["WeightStash", "layer_stash_bytes"]


class WeightStash:
    """The older weight version of a stage's parameters (see [Note: 2BW weight versions]).

    Args:
        params: the stage's trainable parameters (plain or DTensor), in the compute dtype.
        meter: the memory meter; the stash is allocated in its "weight_stash" phase.

    Example:
        >>> from hybridplan.runtime.memory import NullMeter
        >>> p = torch.nn.Parameter(torch.zeros(2))              # W(0) = 0
        >>> stash = WeightStash([p], NullMeter())
        >>> stash.use_stale(); stash.rotate()                   # iteration 0 (computes on W(0))
        >>> with torch.no_grad():
        ...     _ = p.add_(1.0)                                  # its step: W(1) = 1
        >>> stash.use_stale(); p.tolist()                       # iteration 1 computes on W(0)
        [0.0, 0.0]
        >>> stash.rotate(); p.tolist()                          # and its step updates W(1)
        [1.0, 1.0]
    """

    def __init__(self, params: Sequence[torch.Tensor], meter: Any) -> None:
        self._live = [t for p in params for t in _storage_tensors(p)]
        with meter.in_phase("weight_stash"), torch.no_grad():
            self._stale = [t.detach().clone() for t in self._live]
        self._swapped = False

    def _swap(self) -> None:
        for live, stale in zip(self._live, self._stale, strict=True):
            data = live.data
            live.data = stale.data
            stale.data = data
        self._swapped = not self._swapped

    def use_stale(self) -> None:
        """Make the parameters hold the older version (start of an iteration)."""
        if not self._swapped:
            self._swap()

    def rotate(self) -> None:
        """Back to the newest version, which also becomes the stash's (before the optimizer step)."""
        if self._swapped:
            self._swap()
        with torch.no_grad():
            for live, stale in zip(self._live, self._stale, strict=True):
                stale.copy_(live)

    @property
    def nbytes(self) -> int:
        """Bytes of the stash (exact bytes of its tensors)."""
        return sum(t.numel() * t.element_size() for t in self._stale)


def layer_stash_bytes(
    model: LayeredModel, kind: str, degree: int, *, precision: str = "fp32", device_type: str = "cpu"
) -> list[int | None]:
    """Per-device bytes a 2BW weight stash holds for each layer of ``model`` in a ``kind`` x ``degree`` stage.

    Builds every layer as the runtime does (``build_stage_module``: tensor-parallel shards on a fake process
    group, mixed-precision cast) on fake tensors, so it costs no device memory and no compute. Stash tensors
    are one per parameter storage, so a stage's stash is the sum of its layers'. For ``device_type="cuda"``
    each tensor counts the CUDA caching allocator's block (runtime/gpu_memory.py), as the runtime's GPU
    meters see it. ``None`` for a layer that cannot be tensor-parallel at ``degree``.

    Raises:
        UsageError: if this process already has a process group (the fake one cannot be set up).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    from hybridplan.models.tensor_parallel import TensorParallelGroup
    from hybridplan.plan import StagePlan
    from hybridplan.runtime.gpu_memory import cuda_block_bytes
    from hybridplan.runtime.precision import cast_module, compute_dtype
    from hybridplan.runtime.sim import fake_process_group
    from hybridplan.runtime.stage import build_stage_module

    tensor = kind == "tensor" and degree > 1
    label = kind if degree > 1 else "none"
    dtype = compute_dtype(precision)
    out: list[int | None] = []
    with fake_process_group(0, degree), FakeTensorMode():
        tp = None
        if tensor:
            with unset_fake_temporarily():
                mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
            tp = TensorParallelGroup(dist.group.WORLD, mesh, 0, degree)
        for layer in range(model.num_layers):
            if tensor and model.tensor_parallel_problem(layer, degree) is not None:
                out.append(None)
                continue
            stage = StagePlan(layer, layer + 1, label, degree, tuple(range(degree)))
            module = build_stage_module(model, stage, seed=0, device=torch.device("cpu"), tp=tp)
            if dtype != torch.float32:
                cast_module(module, dtype)
            total = 0
            for p in module.parameters():
                if p.requires_grad:
                    for t in _storage_tensors(p):
                        n = t.numel() * t.element_size()
                        total += cuda_block_bytes(n) if device_type == "cuda" else n
            out.append(total)
    return out
