"""The data-parallel gradient sync of a cut's stages, as the stage-cut search reads it: the time model's sync term
(:func:`~hybridplan.predict.communication.sync_seconds`, eq. 4 with [Note: per-message latency] in
predict/communication.py) of each stage, written over the layer ranges it may hold: seconds per byte of its
ring all-reduce times the gradient bytes of the layers, plus seconds per parameter tensor (the ring steps'
latency) times their parameter tensors, shared parameters counted once per stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hybridplan.errors import PlanError

__all__ = ["SyncCosts", "range_sums"]


@dataclass(frozen=True)
class SyncCosts:
    """The data-parallel gradient sync of each stage: ``factors[j] * range_bytes[a, b] + latencies[j] *
    range_tensors[a, b]`` seconds when stage ``j`` holds layers ``[a, b)``.

    ``range_bytes`` and ``range_tensors`` are ``(L + 1) x (L + 1)`` (:func:`range_sums` of the layers' gradient
    bytes and parameter tensors: parameters shared by several layers count once per stage, as
    :func:`~hybridplan.profiling.layer_info.parameter_bytes` and
    :func:`~hybridplan.profiling.layer_info.parameter_tensors` count them); ``factors[j]`` is the ring
    all-reduce's seconds per byte on stage ``j``'s slowest data group (0 without data parallelism), and
    ``latencies[j]`` its seconds per parameter tensor (each tensor is all-reduced on its own, a ring of
    ``2 (d - 1)`` steps of ``alpha``: :func:`~hybridplan.predict.communication.sync_latency_per_tensor`). Without
    ``latencies`` (the default) the sync is bandwidth only, AMP's eq. 3.

    Example:
        >>> r = range_sums([1.0, 2.0, 3.0])
        >>> SyncCosts(r, (1.0, 2.0), range_sums([1.0, 1.0, 4.0]), (0.5, 0.25)).seconds((0, 2, 3))   # max(3 + 1, 6 + 1)
        7.0
    """

    range_bytes: np.ndarray
    factors: tuple[float, ...]
    range_tensors: np.ndarray | None = None
    latencies: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if (self.range_tensors is None) != (self.latencies is None):
            raise PlanError("sync costs need range_tensors and latencies together, or neither",
                            fix="pass both (the latency per parameter tensor) or neither (bandwidth only)")

    @property
    def kinds(self) -> tuple[tuple[float, float], ...]:
        """Each stage's ``(factor, latency)``: stages with equal pairs have equal sync matrices."""
        return tuple(zip(self.factors, self.latencies or (0.0,) * len(self.factors)))

    def matrix(self, factor: float, latency: float) -> np.ndarray:
        """``factor * range_bytes + latency * range_tensors``: a stage's sync seconds of every range."""
        out = factor * self.range_bytes
        if latency and self.range_tensors is not None:
            out = out + latency * self.range_tensors
        return out

    def seconds(self, boundaries: Sequence[int]) -> float:
        """The slowest stage's sync (class docstring): the sync term of a cut (the same floats as :meth:`matrix`)."""
        out = []
        kinds = self.kinds
        for j in range(len(boundaries) - 1):
            (factor, latency), a, b = kinds[j], boundaries[j], boundaries[j + 1]
            value = factor * float(self.range_bytes[a, b])
            if latency and self.range_tensors is not None:
                value += latency * float(self.range_tensors[a, b])
            out.append(value)
        return max(out)


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
