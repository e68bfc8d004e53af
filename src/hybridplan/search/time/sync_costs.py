"""The data-parallel gradient sync of a cut's stages, as the stage-cut search reads it: seconds per byte of each
stage's ring all-reduce times the gradient bytes of the layers it holds (the time model's eq. 4 term,
:func:`~hybridplan.predict.communication.sync_seconds`), shared parameters counted once per stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SyncCosts", "range_sums"]


@dataclass(frozen=True)
class SyncCosts:
    """The data-parallel gradient sync of each stage: ``factors[j] * range_bytes[a, b]`` seconds when stage
    ``j`` holds layers ``[a, b)``.

    ``range_bytes`` is ``(L + 1) x (L + 1)`` (:func:`range_sums`: parameters shared by several layers count
    once per stage); ``factors[j]`` is the ring all-reduce's seconds per byte on stage ``j``'s slowest data
    group (0 without data parallelism).
    """

    range_bytes: np.ndarray
    factors: tuple[float, ...]

    def seconds(self, boundaries: Sequence[int]) -> float:
        """``max_j factors[j] * range_bytes[b_j, b_{j+1}]``: the sync term of a cut."""
        return max(float(self.factors[j] * self.range_bytes[boundaries[j], boundaries[j + 1]])
                   for j in range(len(boundaries) - 1))


def range_sums(values: Sequence[float], groups: Sequence[str | None] | None = None) -> np.ndarray:
    """``R[a, b]`` = the sum of ``values[a:b]``, counting once the layers of one group (shared parameters,
    e.g. tied embeddings) that fall in the same range; ``R[a, b] = 0`` for ``b <= a``.

    Example:
        >>> r = range_sums([1.0, 2.0, 1.0], ["emb", None, "emb"])
        >>> float(r[0, 3]), float(r[1, 3]), float(r[0, 2])    # the tied layer counted once in [0, 3)
        (3.0, 3.0, 3.0)
    """
    v = np.asarray(values, dtype=float)
    n = len(v)
    prefix = np.concatenate(([0.0], np.cumsum(v)))
    out = prefix[None, :] - prefix[:, None]
    if groups is not None:
        # layer l repeats a group last seen at layer prev[l]: it is a duplicate in [a, b) iff a <= prev[l] < l < b
        prev = np.full(n, -1)
        last: dict[str, int] = {}
        for i, g in enumerate(groups):
            if g is not None:
                prev[i] = last.get(g, -1)
                last[g] = i
        if (prev >= 0).any():
            dup = np.where(np.arange(n + 1)[:, None] <= prev[None, :], v[None, :], 0.0)  # dup[a, l]
            out -= np.concatenate((np.zeros((n + 1, 1)), np.cumsum(dup, axis=1)), axis=1)
    return np.triu(out, 1)
