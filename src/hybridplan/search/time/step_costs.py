"""The optimizer step of a cut's stages, as the stage-cut search reads it: the time model's ``max_i step_i``
([Note: the terms AMP leaves out] in predict/time_model.py) written over the layer ranges a stage may hold.

A stage steps the parameter bytes one of its devices updates, at the profile's measured seconds per byte
(:func:`~hybridplan.predict.stage_compute.optimizer_seconds`): ``rates[j] * range_bytes[a, b]`` when stage ``j``
holds layers ``[a, b)``, ``rates[j]`` the seconds per parameter byte of the stage's device type and tensor
degree over its shards (a tensor shard, and under ZeRO each replica's share). Non-negative and growing with the
range, as the windows of the cut search need (search/time/bottleneck_cuts.py, [Note: the optimizer step's
maximum]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hybridplan.errors import PlanError

__all__ = ["StepCosts"]


@dataclass(frozen=True)
class StepCosts:
    """The optimizer step of each stage: ``rates[j] * range_bytes[a, b]`` seconds when stage ``j`` holds layers
    ``[a, b)`` (``range_bytes``: :func:`~hybridplan.search.time.sync_costs.range_sums` of the layers' parameter
    bytes, shared parameters once per range, as the time model counts them).

    Example:
        >>> from hybridplan.search.time.sync_costs import range_sums
        >>> StepCosts(range_sums([1.0, 2.0, 3.0]), (1.0, 0.5)).seconds((0, 2, 3))   # max(3, 1.5)
        3.0
    """

    range_bytes: np.ndarray
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if any(not np.isfinite(r) or r < 0 for r in self.rates):
            raise PlanError(f"optimizer step rates must be finite and non-negative, got {self.rates}",
                            fix="check the time profile's optimizer seconds per byte")

    def matrix(self, j: int) -> np.ndarray:
        """Stage ``j``'s step seconds of every range ``[a, b)`` (0 where ``b <= a``)."""
        return self.rates[j] * self.range_bytes

    def seconds(self, boundaries: Sequence[int]) -> float:
        """The slowest stage's step of a cut (the same floats as :meth:`matrix`)."""
        return max(self.rates[j] * float(self.range_bytes[boundaries[j], boundaries[j + 1]])
                   for j in range(len(boundaries) - 1))

    def starts(self, j: int, cap: float) -> np.ndarray:
        """Per end ``i``, the least start ``a`` whose every range ``[a', i)``, ``a <= a' < i``, steps in at most
        ``cap`` on stage ``j`` (``i`` where ``[i - 1, i)`` does not): the window of
        :func:`~hybridplan.search.time.bottleneck_cuts.bottleneck_assignment`'s ``starts``. A range's step grows
        with it, but not always in floats: a range that starts after a tied layer counts its copy, summed in
        another order (``range_sums``), a last bit apart; every range of the window is within the cap all the same.

        Example:
            >>> from hybridplan.search.time.sync_costs import range_sums
            >>> StepCosts(range_sums([4.0, 1.0, 2.0]), (1.0,)).starts(0, 3.0)  # layer 0 alone steps 4: from 1
            array([0, 1, 1, 1])
        """
        m = self.matrix(j)
        n = m.shape[0] - 1
        a = np.arange(n + 1)[:, None]
        over = (m > cap) & (a < np.arange(n + 1)[None, :])
        return np.where(over, a + 1, 0).max(axis=0).astype(np.intp)
