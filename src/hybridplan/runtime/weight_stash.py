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
not stashed: the stale version is only computed with, in the low precision.
:func:`~hybridplan.profiling.stash_sizes.layer_stash_bytes` gives these bytes per layer without running
anything (the memory predictor adds them to profiles taken under another schedule; predict/memory.py).

The runtime still ends every iteration at a barrier (it measures per iteration), so its iteration TIME is
PipeDream-Flush's; the flush-free pipeline of the paper is what the cost model predicts
(predict/time_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybridplan.runtime.memory import storage_tensors

__all__ = ["WeightStash"]


class WeightStash:
    """The older weight version of a stage's parameters (see [Note: 2BW weight versions]).

    Args:
        params: the stage's trainable parameters (plain or DTensor), in the compute dtype.
        meter: the memory meter; the stash is allocated in its "weight_stash" phase.

    Example:
        >>> from hybridplan.runtime.meters import NullMeter
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
        self._live = [t for p in params for t in storage_tensors(p)]
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
