"""Which stages to profile, and how to pack them into runs (CAPTURE seed 000, Description 1, generalised).

CAPTURE derives two statistics per layer from profiled stage memory (``PM``):
``M_i(l) = PM(l)`` (layer l alone on a device) and ``M_a(l) = PM(n..l) - PM(n..l-1)`` for one set of
neighbours ``n..l-1``. Description 1 obtains them for L layers on G devices with L+1 pipeline runs:
the first device takes 1, 2, ..., L/G + 1 layers (a *chain* of growing ranges from anchor 0) while
the next two devices hold single layers; then the anchor moves to L/G, and so on.

This module asks for exactly those ranges — every single layer, and the chains that start at anchors
``0, n, 2n, ...`` with ``n = ceil(L / G)`` by default (``neighbors``) and grow to ``n + 1`` layers —
and packs them greedily into runs: each run places as many still-missing ranges as fit on the device
budget, each on a sub-mesh of the scenario's degree, and covers the layers between them with
pipeline-only *filler* stages. That works for any L and G (not only L divisible by G), and measures
the same statistics in fewer runs than Description 1 (tests/profiling/test_partitions.py counts them).

Because a stage's quantities do not depend on its position (profiling/quantities.py), fillers and the
number of stages in a run do not change what a measured stage tells us.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from hybridplan.errors import ProfileError
from hybridplan.plan import Parallelism, Plan, StagePlan, as_schedule

__all__ = ["Scenario", "Span", "ProfilingRun", "required_spans", "pack_run", "default_neighbors"]


@dataclass(frozen=True, order=True)
class Scenario:
    """A training scenario whose stages are profiled: pipeline-only, or data/tensor-parallel at a degree, or
    data-parallel with ZeRO-3 sharding (``zero=3``: predict/zero_layout.py says why only that level is profiled)."""

    kind: Parallelism
    """"none", "data" or "tensor"."""
    degree: int
    zero: int = 0
    """ZeRO level of the measured data-parallel stages (0: unsharded)."""

    @property
    def name(self) -> str:
        """``"pipeline"``, ``"data2"``, ``"tensor4"``, ``"data2-zero3"``, ..."""
        base = "pipeline" if self.kind == "none" else f"{self.kind}{self.degree}"
        return f"{base}-zero{self.zero}" if self.zero else base

    @property
    def measured_kind(self) -> str:
        """The ``kind`` its measurements and statistics are filed under: the parallelism, ``-zero3`` added."""
        return f"{self.kind}-zero{self.zero}" if self.zero else self.kind

    @classmethod
    def parse(cls, name: str) -> Scenario:
        """Inverse of :attr:`name`."""
        base, _, zero = name.partition("-zero")
        if zero and zero.isdigit() and base.startswith("data") and base[4:].isdigit():
            return cls("data", int(base[4:]), int(zero))
        if name == "pipeline":
            return cls("none", 1)
        for kind in ("data", "tensor"):
            if name.startswith(kind) and name[len(kind) :].isdigit():
                return cls(kind, int(name[len(kind) :]))
        raise ProfileError(f"unknown scenario {name!r}", fix="use pipeline, data<d>, tensor<d> or data<d>-zero3, e.g. tensor2")


@dataclass(frozen=True, order=True)
class Span:
    """Layers ``[start, stop)`` profiled as one stage."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def overlaps(self, other: Span) -> bool:
        return self.start < other.stop and other.start < self.stop


@dataclass(frozen=True)
class ProfilingRun:
    """One profiling run: the stages (measured spans on sub-meshes, fillers pipeline-only) on ``devices`` devices."""

    scenario: Scenario
    stages: tuple[StagePlan, ...]
    measured: tuple[Span, ...]
    """The spans this run was packed to measure (fillers are measured too, as a bonus)."""

    @property
    def devices(self) -> int:
        return sum(s.degree for s in self.stages)

    def plan(self, *, schedule: str, global_batch_size: int, num_microbatches: int) -> Plan:
        """The run as a plan for a ``1 x devices`` cluster."""
        return Plan(schedule=as_schedule(schedule), global_batch_size=global_batch_size, num_microbatches=num_microbatches, stages=self.stages)


def default_neighbors(num_layers: int, groups: int) -> int:
    """CAPTURE's chain length: ``ceil(L / G)`` layers per anchor block (Description 1)."""
    return max(1, math.ceil(num_layers / max(1, groups)))


def required_spans(num_layers: int, neighbors: int, allowed: Callable[[Span], bool] = lambda s: True) -> list[Span]:
    """The spans whose memory gives ``M_i`` of every layer and ``M_a`` of every layer after the first.

    Layer ``l`` gets ``M_a`` from ``[n, l+1)`` and ``[n, l)`` with ``n`` the anchor of its block
    (anchors every ``neighbors`` layers; the first layer of a block uses the previous anchor, as
    Description 1's "L/G + 1" runs do). Spans that are not ``allowed`` (e.g. a tensor-parallel span
    over a layer that cannot be split) are replaced by the nearest allowed neighbours, ``n = l - 1``.
    """
    if num_layers < 1 or neighbors < 1:
        raise ProfileError(f"need at least one layer and one neighbour, got {num_layers} layers, neighbors={neighbors}")
    wanted: list[Span] = [Span(l, l + 1) for l in range(num_layers) if allowed(Span(l, l + 1))]
    for l in range(1, num_layers):
        anchor = ((l - 1) // neighbors) * neighbors
        pair = (Span(anchor, l), Span(anchor, l + 1))
        if not all(allowed(s) for s in pair):
            pair = (Span(l - 1, l), Span(l - 1, l + 1))
            if not all(allowed(s) for s in pair):
                continue
        wanted.extend(pair)
    return sorted(set(wanted))


def _gaps(chosen: Sequence[Span], num_layers: int) -> list[Span]:
    gaps, pos = [], 0
    for s in sorted(chosen):
        if s.start > pos:
            gaps.append(Span(pos, s.start))
        pos = s.stop
    if pos < num_layers:
        gaps.append(Span(pos, num_layers))
    return gaps


_Chain: TypeAlias = "tuple[Span, _Chain] | None"
"""Spans chosen so far, the last first: (span, the chain before it)."""


def _most_spans(
    pending: Sequence[Span], num_layers: int, degree: int, devices: int, max_groups: int, fillers_per_gap: int
) -> list[Span]:
    """The most disjoint pending spans that fit with fillers on the budget (fewest devices on ties).

    Dynamic program over layer positions: ``best[pos, used, groups, after_filler]`` is the largest
    count of spans covering ``[0, pos)`` with ``used`` devices; a step places a pending span starting
    at ``pos`` or a filler gap (never two gaps in a row: they would be one). The states are kept per
    position, each with its spans as a chain back to the first, and a gap ends only where a pending
    span starts or at the model's end (a state after a gap anywhere else cannot go on): a campaign
    packs a run this way for each scenario, batch size and estimate, and Llama-3-70B's 82 layers on
    256 devices took about a second a run when every state was looked for among all positions.
    """
    starting: dict[int, list[Span]] = {}
    for span in pending:
        starting.setdefault(span.start, []).append(span)
    ends = sorted(set(starting) | {num_layers})  # where a gap may end
    # per position: (used, groups, after_filler) -> (count, chosen spans), explored in order of position; a state
    # reached again keeps the first of equally many spans
    frontier: list[dict[tuple[int, int, bool], tuple[int, _Chain]]] = [{} for _ in range(num_layers + 1)]
    frontier[0][(0, 0, True)] = (0, None)
    for pos in range(num_layers):
        gap_ends = ends[bisect.bisect_right(ends, pos):]
        for (used, groups, after_filler), (count, chosen) in frontier[pos].items():
            if used + degree <= devices and groups + 1 <= max_groups:
                for span in starting.get(pos, ()):
                    key, bucket = (used + degree, groups + 1, False), frontier[span.stop]
                    kept = bucket.get(key)
                    if kept is None or count + 1 > kept[0]:
                        bucket[key] = (count + 1, (span, chosen))
            if not after_filler or pos == 0:
                for stop in gap_ends:
                    u = used + min(fillers_per_gap, stop - pos)
                    if u > devices:
                        continue
                    key, bucket = (u, groups, True), frontier[stop]
                    kept = bucket.get(key)
                    if kept is None or count > kept[0]:
                        bucket[key] = (count, chosen)
    finals = [(count, -used, chosen) for (used, _, _), (count, chosen) in frontier[num_layers].items()]
    if not finals:
        return []
    count, _, chain = max(finals, key=lambda f: (f[0], f[1]))
    spans: list[Span] = []
    while chain is not None:
        spans.append(chain[0])
        chain = chain[1]
    return spans[::-1] if count else []


def pack_run(
    pending: Iterable[Span],
    *,
    num_layers: int,
    scenario: Scenario,
    devices: int,
    max_groups: int,
    fillers_per_gap: int = 1,
) -> ProfilingRun | None:
    """The next run: as many pending spans as fit, left to right, fillers in between.

    Args:
        pending: spans still to measure.
        num_layers: the model's layers.
        scenario: kind and degree of the measured stages.
        devices: the device budget (the target mesh's device count).
        max_groups: how many sub-meshes of the scenario's degree the mesh holds (N * floor(k / d)).
        fillers_per_gap: pipeline-only stages per uncovered gap (more: smaller fillers, more devices).

    Returns:
        The run measuring the most pending spans the budget allows, or None if none fits even alone.
    """
    chosen = _most_spans(sorted(set(pending)), num_layers, scenario.degree, devices, max_groups, fillers_per_gap)
    if not chosen:
        return None
    pieces: list[tuple[Span, bool]] = [(s, True) for s in chosen]
    for gap in _gaps(chosen, num_layers):
        parts = min(fillers_per_gap, len(gap))
        bounds = [gap.start + (len(gap) * i) // parts for i in range(parts + 1)]
        pieces += [(Span(a, b), False) for a, b in zip(bounds, bounds[1:])]
    pieces.sort()
    stages, next_device = [], 0
    for span, measured in pieces:
        degree = scenario.degree if measured else 1
        kind: Parallelism = scenario.kind if measured and degree > 1 else "none"
        stages.append(StagePlan(span.start, span.stop, kind, degree, tuple(range(next_device, next_device + degree)),
                                zero=scenario.zero if kind == "data" else 0))
        next_device += degree
    return ProfilingRun(scenario, tuple(stages), tuple(chosen))
