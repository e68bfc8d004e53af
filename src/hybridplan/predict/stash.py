"""PipeDream-2BW's weight stash in memory predictions made from a profile of another schedule.

[Note: predicting PipeDream-2BW] "flush" and "2bw" run 1F1B's actions (plan/schedule.py), so their
schedule replay is 1F1B's (profiling/schedule_memory.py). 2BW also keeps a second weight version for the
whole run (runtime/weight_stash.py), live at every action: it belongs to the ``static`` quantity. A
profile taken under "2bw" has it in its ``static`` already, and predicts 2BW plans as it predicts 1F1B
ones. A profile taken under another schedule predicts a 2BW plan with the stage's stash bytes ADDED to
``static`` (and a 2BW profile predicts the other schedules with them removed).

Those bytes are not taken from the ``gradient`` quantity, although a gradient has its parameter's size
and dtype: a trainable parameter that gets no gradient in the first backward (one the stage's forward does
not use) is stashed all the same, and the ``gradient`` quantity is a difference of two memory levels that
also moves with what the first backward frees. They are counted
instead, per layer and per stage kind and degree, by building the layers exactly as the runtime does, on
fake tensors (:func:`~hybridplan.profiling.stash_sizes.layer_stash_bytes`: tensor-parallel shards, the
compute dtype of mixed precision, CUDA block rounding); the profiling campaign stores them in the
database's ``weight_stash`` table. A stash is one tensor per parameter storage, so a stage's stash is the
sum of its layers'. Replicated stages ("none", "data" at any degree) stash whole parameters; a tensor
stage its shards. Checked against real 2BW runs in tests/predict/test_memory_2bw.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from hybridplan.profiling.quantities import INDEX

__all__ = ["StashAdjustment"]


class StashAdjustment:
    """Adds (or removes) a 2BW weight stash to quantity vectors of a profile (the note).

    Args:
        stash: ``{(kind, degree): {layer: bytes}}``; ``("none", 1)`` serves every replicated stage.
        num_layers: the model's layer count.
        schedule: the schedule predicted.
        profile_schedule: the schedule profiled (None: the same family as ``schedule``).

    Example:
        >>> adj = StashAdjustment({("none", 1): {0: 100, 1: 50}}, num_layers=2, schedule="2bw", profile_schedule="1f1b")
        >>> q = np.zeros(8)
        >>> float(adj.apply(q, 0, 2, "data", 2)[INDEX["static"]])
        150.0
    """

    def __init__(
        self,
        stash: Mapping[tuple[str, int], Mapping[int, int]],
        *,
        num_layers: int,
        schedule: str,
        profile_schedule: str | None,
    ) -> None:
        self.stash = stash
        self.num_layers = num_layers
        self.schedule = schedule
        self.profile_schedule = profile_schedule

    @property
    def sign(self) -> int:
        """+1: add the stash to the profile's ``static``; -1: remove it; 0: nothing to do."""
        if self.profile_schedule is None or (self.schedule == "2bw") == (self.profile_schedule == "2bw"):
            return 0
        return 1 if self.schedule == "2bw" else -1

    def prefix(self, kind: str, degree: int) -> np.ndarray | None:
        """Prefix sums of the per-layer stash bytes of a ``kind`` x ``degree`` stage (NaN from the first
        layer without a value), or None if the scenario has none."""
        key = (kind, degree) if kind == "tensor" and degree > 1 else ("none", 1)
        per_layer = self.stash.get(key)
        if not per_layer:
            return None
        values = np.array([per_layer.get(l, np.nan) for l in range(self.num_layers)], dtype=float)
        return np.concatenate(([0.0], np.cumsum(values)))

    def apply(self, q: np.ndarray, start: int | None, stop: int | None, kind: str, degree: int) -> np.ndarray | None:
        """``q`` with the stash of layers ``[start, stop)`` added to (removed from) its ``static`` entry, in
        place. With ``start`` None, ``q`` is a whole ``[L, L+1, Q]`` span table (NaN where unknown). Returns
        None where the stash bytes are unknown."""
        sign = self.sign
        if sign == 0:
            return q
        prefix = self.prefix(kind, degree)
        if prefix is None:
            return None
        s = INDEX["static"]
        if start is not None and stop is not None:
            total = float(prefix[stop] - prefix[start])
            if not math.isfinite(total):
                return None
            q[..., s] += sign * total
            return q
        with np.errstate(invalid="ignore"):
            spans = prefix[None, :] - prefix[:-1, None]  # [start, stop] -> bytes of layers [start, stop)
        q[..., s] += sign * spans
        return q
