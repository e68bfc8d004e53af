"""What the solvers minimise: the stage-memory model they ask, the score of a plan, and their result.

The score of a plan is the multiset of its per-device predicted peaks (a stage of degree ``d``
contributes ``d`` devices with its value). Plans compare by [Note: leximax order]; exact ties fall back
to the canonical order of plans, so every solver returns the same unique best plan.

[Note: leximax order]
CAPTURE (seed 000, III-C) and mCAP (seed 004, 3.4) pick the plan with the lowest peak; among equal
peaks they drop the device with the highest value and compare the rest, again and again. Made
deterministic, that is comparing the per-device values sorted in descending order lexicographically
(leximax). We encode the sorted values run-length as the flat tuple ``(v1, n1, v2, n2, ...)`` with
``v1 > v2 > ...`` and ``n_i`` devices at ``v_i``: Python's tuple order on it *is* the leximax order for
plans on the same number of devices (a lower value wins; at an equal value fewer devices there win,
because the next device of that plan is lower). Adding the same devices to two multisets keeps their
order, strictly, which is what lets the exact solver decide suffixes of plans independently.

If two plans have the same multiset, the one whose sequence of ``(stop, kind, degree)`` per stage
(kind ranked none < data < tensor) is lexicographically smaller wins: :func:`canonical_key`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.plan import Cluster, Parallelism, Plan, StagePlan, as_schedule
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.memory.configs import StageChoice, StageConfig
from hybridplan.search.memory.space import PlanSpace

__all__ = [
    "StageMemoryModel",
    "StageTable",
    "PlacedStage",
    "SearchResult",
    "leximax_key",
    "canonical_key",
    "plan_score",
    "build_result",
    "no_allowed_plan",
    "model_horizon",
    "bad_prediction",
]


@runtime_checkable
class StageMemoryModel(Protocol):
    """Predicted per-device peak memory of any pipeline stage (implemented by the predictor).

    A model may also offer ``stage_memory_matrix(kind, degree, stages_after, num_layers)`` returning
    an ``(L, L+1)`` array whose ``[start, stop]`` entry (for ``start < stop``) is ``stage_memory`` or
    ``inf`` where not :meth:`allowed`; :class:`StageTable` then uses it instead of ``L^2`` calls.

    A "data+tensor" config (the extended space) is asked with the keyword ``tensor_degree`` as well (its
    ``degree`` is data x tensor); the other kinds are asked without it, so a model of CAPTURE's space only
    need not know it.
    """

    position_horizon: int
    """H >= 1: ``stage_memory`` at ``stages_after >= H-1`` equals its value at ``H-1`` (1F1B with m
    micro-batches keeps ``min(stages_after+1, m)`` in flight, so H = m; GPipe: H = 1)."""

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int) -> float:
        """Per-device peak bytes of a stage holding layers ``[start, stop)`` run as ``kind`` x ``degree``
        when ``stages_after`` stages follow it in the pipeline."""
        ...

    def allowed(self, start: int, stop: int, kind: str, degree: int) -> bool:
        """Whether the stage config can run at all (tensor support of its layers, batch divisibility)."""
        ...


class StageTable:
    """Every stage value a solver may need, computed once: ``values[config, position, start, stop]``.

    ``position`` is ``min(stages_after, horizon-1)`` where ``horizon`` is the model's capped at the
    deepest pipeline of the space (beyond it no stage can sit). Disallowed configs and empty ranges
    hold ``+inf``, so no solver can pick them.

    Raises:
        PlanError: if the model returns a non-finite value for an allowed stage, or has a bad horizon.
    """

    def __init__(self, model: StageMemoryModel, space: PlanSpace, *, progress: ProgressCallback | None = None) -> None:
        """Ask the model for every stage value.

        Args:
            model: the stage-memory model.
            space: the plans the table serves.
            progress: receives progress lines (:mod:`~hybridplan.search.progress`): a model without
                ``stage_memory_matrix`` is asked ``L^2/2`` times per config and position.
        """
        started = time.perf_counter()
        report = Progress.of(progress)
        self.space = space
        self.horizon = min(model_horizon(model), space.max_num_stages)
        if space.unsplit_last_stage and space.max_num_stages > 1:
            self.horizon = max(self.horizon, 2)  # the last stage (position 0) is then never another stage's position
        L, n = space.num_layers, len(space.configs)
        self.values = np.full((n, self.horizon, L, L + 1), np.inf)
        upper = np.triu(np.ones((L, L + 1), dtype=bool), 1)  # start < stop
        allowed = np.zeros((n, L, L + 1), dtype=bool)
        matrix = getattr(model, "stage_memory_matrix", None)
        for ci, cfg in enumerate(space.configs):
            what = f"stage table: config {ci + 1}/{n} ({cfg.label})"
            more = cfg.model_kwargs
            if matrix is not None:
                for pos in range(self.horizon):
                    if report.due():
                        report.update(f"{what}, position {pos + 1}/{self.horizon}")
                    block = np.asarray(matrix(cfg.kind, cfg.degree, pos, L, **more), dtype=np.float64)
                    self.values[ci, pos] = np.where(upper, block, np.inf)
                allowed[ci] = upper & (self.values[ci, 0] != np.inf)
                continue
            for start in range(L):
                if report.due():
                    report.update(f"{what}, layer {start + 1}/{L}")
                for stop in range(start + 1, L + 1):
                    if model.allowed(start, stop, cfg.kind, cfg.degree, **more):
                        allowed[ci, start, stop] = True
                        for pos in range(self.horizon):
                            self.values[ci, pos, start, stop] = model.stage_memory(start, stop, cfg.kind, cfg.degree, pos,
                                                                                   **more)
        # One config at a time: whole-table temporaries would be as large as the table (GBs on big meshes).
        for ci in range(n):
            bad = ~np.isfinite(self.values[ci]) & allowed[ci]
            if bad.any():
                pos, start, stop = (int(v) for v in np.argwhere(bad)[0])
                raise bad_prediction(self.values[ci, pos, start, stop], StageChoice(start, stop, ci), space, pos)
        for ci in range(n):
            self.values[ci][:, ~(allowed[ci] & upper)] = np.inf
            if space.unsplit_last_stage and space.configs[ci].kind in ("tensor", "data+tensor"):
                self.values[ci, 0] = np.inf  # position 0: no stage after it, the last
        self.seconds = time.perf_counter() - started

    @classmethod
    def reuse(cls, table: StageTable | None, model: StageMemoryModel, space: PlanSpace, *,
              progress: ProgressCallback | None = None) -> StageTable:
        """``table`` if given (it must have been built for ``space``), else a new table.

        Raises:
            PlanError: if ``table`` was built for another plan space.
        """
        if table is None:
            return cls(model, space, progress=progress)
        if table.space != space:
            raise PlanError(f"the stage table was built for {table.space}, not for {space}",
                            fix="build the table for the plan space being searched, or omit it")
        return table

    def value(self, choice: StageChoice, stages_after: int) -> float:
        """The value of one stage of a plan with ``stages_after`` stages behind it."""
        return float(self.values[choice.config, min(stages_after, self.horizon - 1), choice.start, choice.stop])


def model_horizon(model: StageMemoryModel) -> int:
    """The model's ``position_horizon``, checked.

    Raises:
        PlanError: if it is not an integer >= 1.
    """
    horizon = getattr(model, "position_horizon", None)
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise PlanError(f"the stage-memory model's position_horizon must be an integer >= 1, got {horizon!r}",
                        fix="1 for GPipe, the number of micro-batches for 1F1B")
    return horizon


def bad_prediction(value: float, choice: StageChoice, space: PlanSpace, stages_after: int) -> PlanError:
    """The error for a non-finite prediction of an allowed stage."""
    cfg = space.configs[choice.config]
    return PlanError(f"the stage-memory model predicts {value} for layers [{choice.start}, {choice.stop})"
                     f" {cfg.label} with {stages_after} stages after",
                     fix="an allowed stage needs a finite prediction; mark impossible ones not allowed")


def leximax_key(values: Iterable[tuple[float, int]]) -> tuple[float, ...]:
    """The score of ``(value, devices)`` pairs: ``(v1, n1, v2, n2, ...)``, ``v1 > v2 > ...`` ([Note: leximax order]).

    >>> leximax_key([(3.0, 2), (5.0, 1), (3.0, 1)])
    (5.0, 1, 3.0, 3)
    """
    count: dict[float, int] = {}
    for v, n in values:
        count[v] = count.get(v, 0) + n
    out: list[float] = []
    for v in sorted(count, reverse=True):
        out += (v, count[v])
    return tuple(out)


def canonical_key(choices: Sequence[StageChoice]) -> tuple[tuple[int, int], ...]:
    """The final tie-break: per stage ``(stop, config index)``; config indices are ordered by (kind, degree)."""
    return tuple((c.stop, c.config) for c in choices)


def plan_score(value_of: Callable[[StageChoice, int], float], space: PlanSpace,
               choices: Sequence[StageChoice]) -> tuple[tuple[float, ...], tuple[tuple[int, int], ...]]:
    """The full sort key of a plan (lower is better): its leximax key, then its canonical key."""
    n = len(choices)
    pairs = [(value_of(c, n - 1 - i), space.configs[c.config].degree) for i, c in enumerate(choices)]
    return leximax_key(pairs), canonical_key(choices)


@dataclass(frozen=True)
class PlacedStage:
    """One stage of a solver's answer."""

    start: int
    stop: int
    kind: Parallelism
    """"none" (degree 1), "data", "tensor" or "data+tensor"."""
    degree: int
    devices: tuple[int, ...]
    """Global device indices (node = index // devices per node)."""
    value: float
    """Predicted per-device peak bytes of each of its devices."""
    tensor_degree: int = 0
    """The tensor degree of a "data+tensor" stage (0 otherwise)."""
    zero: int = 0
    """The ZeRO level of a sharded data stage (0 otherwise)."""
    recompute: bool = False
    """Whether the stage recomputes its activations (the plan's ``"recompute": "full"``)."""

    @property
    def label(self) -> str:
        """E.g. ``tensor x2`` or ``data x2 + tensor x2``."""
        return StageConfig(self.kind, self.degree, self.tensor_degree, self.zero, self.recompute).label


@dataclass(frozen=True)
class SearchResult:
    """A solver's best plan and how it got there."""

    solver: str
    """"exhaustive", "exact" or "bayesian"."""
    num_layers: int
    num_nodes: int
    devices_per_node: int
    stages: tuple[PlacedStage, ...]
    device_values: tuple[float, ...]
    """Predicted peak of every device, by global device index."""
    peak: float
    """The highest device value: the quantity minimised."""
    visited: int
    """Complete plans scored (exhaustive, bayesian) or dynamic-programming states expanded (exact)."""
    elapsed_s: float
    """Wall-clock seconds of the search, building the stage table included when the solver built it."""
    stats: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Solver-specific counters (pruned configs, candidates, table seconds, ...)."""

    @property
    def key(self) -> tuple[float, ...]:
        """The leximax key of the device values ([Note: leximax order])."""
        return leximax_key((v, 1) for v in self.device_values)

    def to_plan(self, *, schedule: str, global_batch_size: int, num_microbatches: int) -> Plan:
        """The plan in the project's JSON-able form, checked against the layers and the mesh.

        Raises:
            PlanError: if the batch does not fit the plan (e.g. a data-parallel degree that does not
                divide the micro-batch size).
        """
        plan = Plan(
            schedule=as_schedule(schedule),
            global_batch_size=global_batch_size,
            num_microbatches=num_microbatches,
            stages=tuple(StagePlan(s.start, s.stop, s.kind, s.degree, s.devices, {}, s.tensor_degree, s.zero,
                                   "full" if s.recompute else "none")
                         for s in self.stages),
        )
        plan.validate(num_layers=self.num_layers,
                      cluster=Cluster.uniform(self.num_nodes, self.devices_per_node))
        return plan

    def describe(self) -> str:
        """A few lines for terminals."""
        head = (f"{self.solver}: peak {self.peak:.6g} on {self.num_nodes}x{self.devices_per_node}, "
                f"{len(self.stages)} stages, {self.visited} visited in {self.elapsed_s:.3f} s")
        return "\n".join([head] + [f"  [{s.start}, {s.stop}) {s.label} on {list(s.devices)}: {s.value:.6g}"
                                   for s in self.stages])


def build_result(solver: str, space: PlanSpace, value_of: Callable[[StageChoice, int], float],
                 choices: Sequence[StageChoice], *, visited: int, started: float, now: float,
                 stats: Mapping[str, Any] | None = None) -> SearchResult:
    """Place a chosen plan on the mesh and package it with its values."""
    devices = space.place(choices)
    n = len(choices)
    stages = []
    per_device = [math.nan] * space.num_devices
    for i, (c, devs) in enumerate(zip(choices, devices)):
        cfg = space.configs[c.config]
        v = value_of(c, n - 1 - i)
        stages.append(PlacedStage(c.start, c.stop, cfg.kind, cfg.degree, devs, v, cfg.tensor_degree, cfg.zero,
                                  cfg.recompute))
        for d in devs:
            per_device[d] = v
    return SearchResult(
        solver=solver,
        num_layers=space.num_layers,
        num_nodes=space.num_nodes,
        devices_per_node=space.devices_per_node,
        stages=tuple(stages),
        device_values=tuple(per_device),
        peak=max(per_device),
        visited=visited,
        elapsed_s=now - started,
        stats=dict(stats or {}),
    )


def no_allowed_plan(space: PlanSpace) -> PlanError:
    """The error for a space whose every plan uses a stage config the model does not allow."""
    return PlanError(
        f"every plan of {space.num_layers} layers on a {space.num_nodes}x{space.devices_per_node} mesh contains a"
        " stage config the memory model does not allow",
        fix="allow more stage configs (e.g. a micro-batch size divisible by the data-parallel degrees) or use another mesh",
    )
