"""The layer merger (CAPTURE seed 000 III-A3): fewer, bigger layers for the parallel scenarios and the search.

After the pipeline-only profiling, adjacent layers are merged, two at a time, until ``L_m`` remain:
each step merges the adjacent pair whose merged layer has the lowest memory, with the statistics of
the merged layer ``M_i(l, l+1) = M_i(l) + M_a(l+1)`` and ``M_a(l, l+1) = M_a(l) + M_a(l+1)``
(seed 000, applied to every quantity). "Memory" here is the merged layer's predicted peak as a
pipeline stage at the profiled batch (the one seed 000 ranks by, M_i, made schedule-aware).

The data- and tensor-parallel scenarios are then profiled on the merged layers only, which cuts their
runs, and the recommender searches plans whose stage boundaries fall between merged layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybridplan.errors import PlanError, ProfileError
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.profiling.quantities import QUANTITIES
from hybridplan.profiling.statistics import SpanStatistics

__all__ = ["merge_layers", "LayerGroups"]


class LayerGroups:
    """Merged layers: group ``i`` holds the original layers ``[bounds[i], bounds[i+1])``."""

    def __init__(self, bounds: Sequence[int]) -> None:
        if len(bounds) < 2 or bounds[0] != 0 or any(b >= c for b, c in zip(bounds, bounds[1:])):
            raise ProfileError(f"layer group bounds must rise strictly from 0, got {list(bounds)}")
        self.bounds = list(bounds)
        self._index = {b: i for i, b in enumerate(self.bounds)}

    @classmethod
    def identity(cls, num_layers: int) -> LayerGroups:
        return cls(list(range(num_layers + 1)))

    @property
    def num_groups(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_layers(self) -> int:
        return self.bounds[-1]

    def original(self, start: int, stop: int) -> tuple[int, int]:
        """Original layer range of merged layers ``[start, stop)``."""
        return self.bounds[start], self.bounds[stop]

    def merged(self, start: int, stop: int) -> tuple[int, int] | None:
        """Merged indices of original layers ``[start, stop)``, or None if not on group boundaries."""
        a, b = self._index.get(start), self._index.get(stop)
        return None if a is None or b is None else (a, b)

    def merged_or_raise(self, start: int, stop: int, what: str) -> tuple[int, int]:
        found = self.merged(start, stop)
        if found is None:
            raise PlanError(
                f"{what} covers layers [{start}, {stop}), which do not start and end between merged layers",
                fix=f"the profile merged layers into groups starting at {self.bounds[:-1]}; use those boundaries",
            )
        return found

    def original_spans(self, spans: Sequence[Any]) -> list[Any]:
        """Spans (with ``start``/``stop`` in units) turned into original-layer spans of the same type."""
        return [type(s)(*self.original(s.start, s.stop)) for s in spans]

    def to_list(self) -> list[int]:
        return list(self.bounds)


def merge_layers(stats: SpanStatistics, target: int, *, schedule: str, num_microbatches: int) -> LayerGroups:
    """Merge adjacent layers until ``target`` remain (seed 000's layer merger), using pipeline statistics.

    Raises:
        ProfileError: if ``target`` is not between 1 and the number of layers, or statistics are missing.
    """
    L = stats.num_layers
    if not 1 <= target <= L:
        raise ProfileError(f"cannot merge {L} layers into {target}", fix=f"choose --merge-layers between 1 and {L}")
    Q = len(QUANTITIES)
    mi = [stats.mi[l, :Q].copy() for l in range(L)]
    ma = [stats.ma[l, :Q].copy() if l > 0 else np.zeros(Q) for l in range(L)]
    if any(np.isnan(v).any() for v in mi) or any(np.isnan(v).any() for v in ma[1:]):
        raise ProfileError("the layer merger needs M_i and M_a of every layer in the pipeline scenario")
    bounds = list(range(L + 1))
    while len(mi) > target:
        costs = [stage_peak(mi[i] + ma[i + 1], schedule, 0, num_microbatches) for i in range(len(mi) - 1)]
        i = int(np.argmin(costs))
        mi[i] = mi[i] + ma[i + 1]
        ma[i] = ma[i] + ma[i + 1]
        del mi[i + 1], ma[i + 1], bounds[i + 1]
    return LayerGroups(bounds)
