"""Per-layer memory statistics M_i and M_a (CAPTURE seed 000 III-A), for every quantity.

For a scenario (pipeline-only, or data/tensor-parallel at a degree) and a profiled batch size:

- ``M_i(l)``: the quantities of layer ``l`` alone on a stage;
- ``M_a(l) = Q(n..l) - Q(n..l-1)``: what adding layer ``l`` to its neighbours ``n..l-1`` adds, with
  ``n`` the anchor the campaign profiled (profiling/partitions.py), else the nearest one measured.

A stage ``[a, b)`` then has ``Q(a..b-1) = M_i(a) + sum M_a(a+1..b-1)`` (the predictor of seed 000,
applied to each quantity); a span that was measured directly is used as measured. The same is kept for
the stage *peak* as measured in the profiling runs (``peak`` below): that is CAPTURE's original
statistic, position-dependent under 1F1B, kept to compare against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hybridplan.profiling.quantities import QUANTITIES
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import Measurement, ProfileStore

__all__ = ["SpanStatistics", "build_statistics", "STATISTIC_QUANTITIES", "statistics_of", "load_statistics", "anchor_of"]

STATISTIC_QUANTITIES: tuple[str, ...] = QUANTITIES + ("peak",)
"""Columns of the statistics: the eight quantities, then CAPTURE's measured peak."""


@dataclass
class SpanStatistics:
    """Statistics of one scenario at one profiled batch size.

    ``mi[l]`` and ``ma[l]`` are vectors over :data:`STATISTIC_QUANTITIES` (NaN where unmeasured).
    """

    num_layers: int
    microbatch_size: int
    batch_size: int
    spans: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    mi: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    ma: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    inconsistency: float = 0.0
    """Largest difference between two measurements of the same span (bytes); 0 on a deterministic runtime."""
    bounds: list[int] | None = None
    """For merged layers (profiling/merger.py): unit ``i`` is original layers ``[bounds[i], bounds[i+1])``;
    None when units are the original layers."""

    def __post_init__(self) -> None:
        if self.mi.size == 0:
            shape = (self.num_layers, len(STATISTIC_QUANTITIES))
            self.mi = np.full(shape, np.nan)
            self.ma = np.full(shape, np.nan)
        self._prefix: tuple[np.ndarray, np.ndarray] | None = None

    def _ma_prefix(self) -> tuple[np.ndarray, np.ndarray]:
        """Prefix sums of M_a (missing values as 0) and of the number of missing M_a rows."""
        if self._prefix is None:
            missing = np.isnan(self.ma).any(axis=1)
            missing[0] = False
            ma = np.where(np.isnan(self.ma), 0.0, self.ma)
            ma[0] = 0.0
            zero = np.zeros((1, ma.shape[1]))
            self._prefix = (np.vstack([zero, np.cumsum(ma, axis=0)]), np.concatenate([[0], np.cumsum(missing)]))
        return self._prefix

    def span(self, start: int, stop: int) -> np.ndarray | None:
        """Statistic vector of the stage ``[start, stop)``: measured, else composed, else None."""
        measured = self.spans.get((start, stop))
        if measured is not None:
            return measured
        sums, missing = self._ma_prefix()
        if missing[stop] - missing[start + 1] > 0 or np.isnan(self.mi[start]).any():
            return None
        return self.mi[start] + (sums[stop] - sums[start + 1])

    def all_spans(self) -> np.ndarray:
        """``[L, L+1, Q]`` array of every span's statistics (NaN where unknown), measured spans as measured."""
        L, Q = self.num_layers, len(STATISTIC_QUANTITIES)
        sums, missing = self._ma_prefix()
        out = self.mi[:, None, :] + (sums[None, :, :] - sums[1 : L + 1, None, :])
        unknown = (missing[None, :] - missing[1 : L + 1, None]) > 0
        out[unknown] = np.nan
        starts, stops = np.triu_indices(L + 1, 1)
        mask = np.zeros((L, L + 1), dtype=bool)
        mask[starts[starts < L], stops[starts < L]] = True
        out[~mask] = np.nan
        for (a, b), v in self.spans.items():
            out[a, b] = v
        return out.reshape(L, L + 1, Q)

    def rows(self) -> list[tuple[int, str, str, float]]:
        """``(layer, "M_i"|"M_a", quantity, value)`` rows for the database."""
        out = []
        for layer in range(self.num_layers):
            for name, table in (("M_i", self.mi), ("M_a", self.ma)):
                for q, value in zip(STATISTIC_QUANTITIES, table[layer]):
                    if np.isfinite(value) and not (name == "M_a" and layer == 0):
                        out.append((layer, name, q, float(value)))
        return out


def build_statistics(
    measurements: Sequence[Measurement],
    *,
    num_layers: int,
    anchor: Callable[[int], int] | None = None,
    bounds: Sequence[int] | None = None,
) -> SpanStatistics:
    """Statistics from the measurements of ONE scenario at ONE batch size.

    Args:
        measurements: the device measurements (all devices of a stage report the same span).
        num_layers: L (the number of units when ``bounds`` is given).
        anchor: the profiled neighbour anchor of each layer (``n`` for ``M_a(l)``); when its pair is
            missing, the nearest measured pair (largest ``n < l``) is used.
        bounds: merged units' original boundaries; measurements not on them are ignored.
    """
    if not measurements:
        raise ValueError("no measurements")
    unit = {b: i for i, b in enumerate(bounds)} if bounds is not None else None
    spans: dict[tuple[int, int], np.ndarray] = {}
    worst = 0.0
    for m in measurements:
        vector = np.append(m.quantities, m.peak)
        key = (m.start, m.stop)
        if unit is not None:
            if m.start not in unit or m.stop not in unit:
                continue
            key = (unit[m.start], unit[m.stop])
        if key in spans:
            # Quantities are position-free and must agree; peaks legitimately differ with the position.
            worst = max(worst, float(np.max(np.abs(spans[key][:-1] - vector[:-1]))))
            continue
        spans[key] = vector
    stats = SpanStatistics(
        num_layers=num_layers,
        microbatch_size=measurements[0].microbatch_size,
        batch_size=measurements[0].batch_size,
        spans=spans,
        inconsistency=worst,
        bounds=list(bounds) if bounds is not None else None,
    )
    for layer in range(num_layers):
        single = spans.get((layer, layer + 1))
        if single is not None:
            stats.mi[layer] = single
        if layer == 0:
            continue
        candidates = sorted((n for n in range(layer) if (n, layer) in spans and (n, layer + 1) in spans), reverse=True)
        preferred = anchor(layer) if anchor is not None else None
        if preferred in candidates:
            candidates.remove(preferred)
            candidates.insert(0, preferred)
        if candidates:
            n = candidates[0]
            stats.ma[layer] = spans[(n, layer + 1)] - spans[(n, layer)]
    return stats


def statistics_of(
    store: ProfileStore,
    scenario: Scenario,
    batch: int,
    num_units: int,
    anchor: Callable[[int], int] | None,
    bounds: list[int] | None = None,
) -> SpanStatistics | None:
    """The statistics of one scenario at one profiled batch size, from the stored measurements (None if none)."""
    ms = store.measurements(kind=scenario.measured_kind, degree=scenario.degree, batch_size=batch)
    return build_statistics(ms, num_layers=num_units, anchor=anchor, bounds=bounds) if ms else None


def load_statistics(store: ProfileStore) -> dict[tuple[str, int], list[SpanStatistics]]:
    """Every scenario's statistics at every profiled batch size, from the stored measurements."""
    meta = store.meta()
    if "num_layers" not in meta:
        return {}
    L = meta["num_layers"]
    bounds = meta.get("merge_groups")
    out: dict[tuple[str, int], list[SpanStatistics]] = {}
    for name in meta.get("scenarios", []):
        scenario = Scenario.parse(name)
        anchor = anchor_of(meta.get("neighbors", {}).get(name, 1))
        merged = bounds if bounds is not None and scenario.degree > 1 else None
        for batch in meta["batch_sizes"]:
            stats = statistics_of(store, scenario, batch, L if merged is None else len(merged) - 1, anchor, merged)
            if stats is not None:
                out.setdefault((scenario.measured_kind, scenario.degree), []).append(stats)
    return out


def anchor_of(neighbors: int) -> Callable[[int], int]:
    """The neighbour-chain anchor of layer ``l`` for chains of ``neighbors`` layers (Description 1)."""
    return lambda l: ((l - 1) // neighbors) * neighbors
