"""The plan space of CAPTURE (seed 000, section III-C): stage configs, packing onto the mesh, enumeration.

A plan cuts the model's ``L`` layers into pipeline stages, in order, and gives each stage a *stage
config*: pipeline-only (``"none"``, degree 1) or data-/tensor-parallel at a power-of-two degree up to
the devices per node ``k`` (2, 4, ..., the powers of two ``<= k``). For ``k = 2^d`` that is ``2*d + 1``
configs, e.g. none, data x2, data x4, tensor x2, tensor x4 for ``k = 4``. (The paper writes
``2*log2(k) - 1``: ``2*d`` kind-and-degree pairs less the 1-way duplicate; but its degrees 1..k are
``d + 1`` per kind, which gives ``2*(d+1) - 1``.) Every device is used, a stage never spans nodes, so on
each node the stages' degrees sum to ``k``.

Which stage configs a plan uses fixes only the *multiset* of degrees that must be packed onto the
nodes; the order in which they are placed is free. [Note: packing powers of two] gives the exact
condition for a multiset to pack, which both the solvers (as the small state machine
:class:`MeshPacking`) and the placement (:func:`place_stages`) use.

[Note: packing powers of two]
Items of sizes that are powers of two go into bins with free capacities ``f_b``. For a size ``t``, the
items of size ``>= t`` are multiples of ``t``, so in any packing they take at most ``t*floor(f_b/t)``
of bin ``b``. Hence a packing exists only if, for every item size ``t``::

    (total size of the items of size >= t)  <=  sum_b t * floor(f_b / t)

and this is also sufficient: first-fit decreasing places the items of size ``t`` into the
``sum_b floor(f_b/t) - (size of larger items)/t`` slots of size ``t`` that remain whatever bins the
larger items went to. On an empty mesh of ``N`` nodes of ``k`` devices the bound is
``N * t * floor(k/t)``, which equals ``N*k`` when ``t`` divides ``k``: so **if k is a power of two, every
multiset of power-of-two degrees with total N*k packs exactly**, and the solvers need to track only
the number of devices used. For other ``k`` they also track the size of the items ``>= t`` for the
few ``t`` that do not divide ``k``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from hybridplan.cluster import Cluster
from hybridplan.errors import PlanError

__all__ = [
    "KINDS",
    "StageConfig",
    "StageChoice",
    "PlanSpace",
    "MeshPacking",
    "stage_configs",
    "place_stages",
    "enumerate_plans",
    "count_plans",
]

KINDS: tuple[str, ...] = ("none", "data", "tensor")
"""Stage kinds in canonical order (the rank breaks exact ties between plans, see objective.py)."""


class StageConfig(NamedTuple):
    """How one stage runs: ``kind`` ("none", "data", "tensor") at ``degree`` devices."""

    kind: str
    degree: int


class StageChoice(NamedTuple):
    """One stage of a plan before placement: layers ``[start, stop)`` with ``space.configs[config]``."""

    start: int
    stop: int
    config: int


def stage_configs(devices_per_node: int, *, pipeline_only: bool = False) -> tuple[StageConfig, ...]:
    """The stage configs of a node of ``devices_per_node`` devices, in canonical order.

    The order is by kind (none < data < tensor), then degree, so that comparing config indices is
    comparing ``(kind, degree)``: the exact solver relies on it to visit candidates in canonical order.

    >>> [f"{c.kind}{c.degree}" for c in stage_configs(4)]
    ['none1', 'data2', 'data4', 'tensor2', 'tensor4']
    """
    if pipeline_only:
        return (StageConfig("none", 1),)
    degrees = [2**a for a in range(1, devices_per_node.bit_length()) if 2**a <= devices_per_node]
    return (
        (StageConfig("none", 1),)
        + tuple(StageConfig("data", d) for d in degrees)
        + tuple(StageConfig("tensor", d) for d in degrees)
    )


class MeshPacking:
    """Which multisets of stage degrees still pack onto the mesh, as a small state machine.

    A state summarises the degrees chosen so far: the devices they use and, only when ``k`` is not a
    power of two, the sizes of the degrees ``>= t`` for the ``t`` that do not divide ``k`` ([Note:
    packing powers of two]). States are numbered ``0 .. num_states-1``; the empty multiset is
    :attr:`start`. For a power-of-two ``k`` the state number *is* the number of devices used.

    Attributes:
        degrees: the distinct degrees, indexing the columns of ``next``/``prev``.
        next: ``next[r, i]`` is the state after adding a stage of ``degrees[i]`` to ``r``, or -1 when
            the result cannot pack.
        prev: the inverse of ``next`` (adding a degree is injective), -1 where none.
        accepting: states that fill every device.
        used: devices used by each state.
        to_finish: fewest further stages that reach an accepting state (a large number if none).
    """

    def __init__(self, num_nodes: int, devices_per_node: int, degrees: Sequence[int]) -> None:
        self.degrees = tuple(sorted(set(degrees)))
        total = num_nodes * devices_per_node
        binding = [t for t in self.degrees if devices_per_node % t]
        caps = [num_nodes * t * (devices_per_node // t) for t in binding]
        start_key = (0,) + (0,) * len(binding)
        index = {start_key: 0}
        keys = [start_key]
        edges: list[list[int]] = []
        i = 0
        while i < len(keys):
            key = keys[i]
            row = []
            for d in self.degrees:
                new = (key[0] + d,) + tuple(v + (d if d >= t else 0) for v, t in zip(key[1:], binding))
                if new[0] > total or any(v > c for v, c in zip(new[1:], caps)):
                    row.append(-1)
                    continue
                if new not in index:
                    index[new] = len(keys)
                    keys.append(new)
                row.append(index[new])
            edges.append(row)
            i += 1
        # Number the states in key order, so that on a power-of-two mesh state r uses r devices.
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        rank = {old: new for new, old in enumerate(order)}
        self.keys = tuple(keys[i] for i in order)
        self.start = 0
        self.next = np.array([[rank[n] if n >= 0 else -1 for n in edges[i]] for i in order],
                             dtype=np.int64).reshape(len(keys), len(self.degrees))
        self.prev = np.full_like(self.next, -1)
        for col in range(len(self.degrees)):
            ok = self.next[:, col] >= 0
            self.prev[self.next[ok, col], col] = np.nonzero(ok)[0]
        self.used = np.array([k[0] for k in self.keys], dtype=np.int64)
        self.accepting = self.used == total
        unreachable = total + 1
        to_finish = np.where(self.accepting, 0, unreachable)
        for r in range(len(keys) - 1, -1, -1):  # successors come later in key order
            for col in range(len(self.degrees)):
                n = self.next[r, col]
                if n >= 0 and to_finish[n] + 1 < to_finish[r]:
                    to_finish[r] = to_finish[n] + 1
        self.to_finish = to_finish

    @property
    def num_states(self) -> int:
        """Number of states."""
        return len(self.keys)

    def column(self, degree: int) -> int:
        """The column of ``next``/``prev`` for ``degree``."""
        return self.degrees.index(degree)


@dataclass(frozen=True)
class PlanSpace:
    """All plans of a model of ``num_layers`` layers on a ``num_nodes`` x ``devices_per_node`` mesh.

    Raises:
        PlanError: for non-positive sizes, or when no plan exists at all (fewer layers or a lower
            ``max_stages`` than the stages the mesh needs).
    """

    num_layers: int
    """L: the layers to partition (after any layer merging)."""
    num_nodes: int
    """N: nodes of the mesh."""
    devices_per_node: int
    """k: devices per node; a stage never spans nodes."""
    pipeline_only: bool = False
    """mCAP's space: only degree-1 stages, hence exactly one stage per device."""
    max_stages: int | None = None
    """Upper bound on the pipeline depth; ``None``: no bound beyond the devices and layers."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_nodes", "devices_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"plan space: {name} must be a positive integer, got {value!r}",
                                fix="a model needs at least one layer and a mesh at least 1x1 devices")
        if self.max_stages is not None and (isinstance(self.max_stages, bool) or not isinstance(self.max_stages, int)
                                            or self.max_stages < 1):
            raise PlanError(f"plan space: max_stages must be a positive integer or None, got {self.max_stages!r}")
        need = int(self.packing.to_finish[self.packing.start])
        mesh = f"{self.num_nodes}x{self.devices_per_node}"
        if self.num_layers < need:
            how = "one per device, pipeline-only" if self.pipeline_only else "a stage never spans nodes"
            raise PlanError(
                f"a {mesh} mesh needs at least {need} stages ({how}) but the model has {self.num_layers} layers",
                fix="use a smaller mesh" + ("" if not self.pipeline_only else ", or allow data/tensor-parallel stages"),
            )
        if self.max_stages is not None and self.max_stages < need:
            raise PlanError(f"max_stages {self.max_stages} is below the {need} stages a {mesh} mesh needs",
                            fix=f"raise max_stages to at least {need}, or use a smaller mesh")

    @classmethod
    def for_cluster(cls, cluster: Cluster, num_layers: int, *, pipeline_only: bool = False,
                    max_stages: int | None = None) -> PlanSpace:
        """The space of a :class:`~hybridplan.cluster.Cluster`'s mesh."""
        return cls(num_layers, cluster.num_nodes, cluster.devices_per_node, pipeline_only, max_stages)

    @property
    def num_devices(self) -> int:
        """N x k."""
        return self.num_nodes * self.devices_per_node

    @property
    def max_num_stages(self) -> int:
        """The deepest pipeline possible: at most one stage per device, per layer, and ``max_stages``."""
        bound = min(self.num_devices, self.num_layers)
        return bound if self.max_stages is None else min(bound, self.max_stages)

    @cached_property
    def configs(self) -> tuple[StageConfig, ...]:
        """The stage configs, in canonical order."""
        return stage_configs(self.devices_per_node, pipeline_only=self.pipeline_only)

    @cached_property
    def packing(self) -> MeshPacking:
        """The packing state machine of the mesh."""
        return MeshPacking(self.num_nodes, self.devices_per_node, [c.degree for c in self.configs])

    def cluster(self) -> Cluster:
        """A uniform cluster of this shape (for :meth:`hybridplan.plan.Plan.validate`)."""
        return Cluster.uniform(self.num_nodes, self.devices_per_node)

    def place(self, choices: Sequence[StageChoice]) -> tuple[tuple[int, ...], ...]:
        """The devices of each stage of a plan (see :func:`place_stages`)."""
        return place_stages([self.configs[c.config].degree for c in choices], self.num_nodes, self.devices_per_node)


def place_stages(degrees: Sequence[int], num_nodes: int, devices_per_node: int) -> tuple[tuple[int, ...], ...]:
    """Global device indices for stages of the given degrees, in pipeline order; deterministic.

    Each stage goes on the node of the previous stage if it fits there and the remaining stages still
    pack ([Note: packing powers of two]), else on the lowest-numbered node where that holds; within a
    node it takes the lowest free devices. So consecutive stages share a node where possible (their
    activations cross the fast intra-node link) and the pipeline walks the nodes in order.

    Raises:
        PlanError: if the degrees do not pack onto the mesh exactly.

    >>> place_stages([1, 2, 1, 4], 2, 4)
    ((0,), (1, 2), (3,), (4, 5, 6, 7))
    """
    k = devices_per_node
    if sum(degrees) != num_nodes * k or any(d < 1 or d & (d - 1) for d in degrees):
        raise PlanError(f"stage degrees {list(degrees)} cannot fill a {num_nodes}x{k} mesh exactly",
                        fix=f"degrees must be powers of two summing to {num_nodes * k}")
    sizes = sorted(set(degrees))
    free = [k] * num_nodes
    remaining = {t: sum(d for d in degrees if d >= t) for t in sizes}
    capacity = {t: num_nodes * t * (k // t) for t in sizes}
    if any(remaining[t] > capacity[t] for t in sizes):
        raise PlanError(f"stage degrees {sorted(degrees, reverse=True)} do not pack onto {num_nodes} nodes of {k} devices")
    out: list[tuple[int, ...]] = []
    current = 0
    for d in degrees:
        for n in [current] + [n for n in range(num_nodes) if n != current]:
            f = free[n]
            if f >= d and all(
                remaining[t] - (d if d >= t else 0) <= capacity[t] - t * (f // t) + t * ((f - d) // t) for t in sizes
            ):
                break
        else:  # pragma: no cover - excluded by the packing condition checked above
            raise PlanError(f"internal: cannot place a stage of degree {d}")
        first = n * k + (k - f)
        out.append(tuple(range(first, first + d)))
        for t in sizes:
            remaining[t] -= d if d >= t else 0
            capacity[t] += t * ((f - d) // t) - t * (f // t)
        free[n] -= d
        current = n
    return tuple(out)


def enumerate_plans(space: PlanSpace,
                    keep: Callable[[StageChoice, int], bool] | None = None) -> Iterator[tuple[StageChoice, ...]]:
    """Every plan of the space, once each, as stage choices in pipeline order.

    Plans are built from the last stage to the first, so that when a stage is chosen the number of
    stages after it is known: ``keep(choice, stages_after)``, if given, can then cut every plan that
    contains the stage (CAPTURE's pruning, :mod:`~hybridplan.search.exhaustive`). Partial plans that can
    no longer be completed (too few layers left for the stages the remaining devices need) are cut
    early; that removes no complete plan.
    """
    pk = space.packing
    cols = [pk.column(c.degree) for c in space.configs]
    limit = space.max_num_stages

    def walk(stop: int, state: int, suffix: list[StageChoice]) -> Iterator[tuple[StageChoice, ...]]:
        for start in range(stop - 1, -1, -1):
            for ci, col in enumerate(cols):
                nxt = int(pk.next[state, col])
                if nxt < 0:
                    continue
                choice = StageChoice(start, stop, ci)
                if keep is not None and not keep(choice, len(suffix)):
                    continue
                suffix.append(choice)
                if start == 0:
                    if pk.accepting[nxt]:
                        yield tuple(reversed(suffix))
                else:
                    need = int(pk.to_finish[nxt])
                    if 1 <= need <= start and len(suffix) + need <= limit:
                        yield from walk(start, nxt, suffix)
                suffix.pop()

    yield from walk(space.num_layers, pk.start, [])


def count_plans(space: PlanSpace) -> int:
    """The number of plans in the space, by dynamic programming (no enumeration).

    ``ways[s][r][n]`` counts the ways to cover layers ``[s, L)`` with ``n`` stages whose degrees form
    packing state ``r``. Pipeline-only on ``G`` devices gives ``C(L-1, G-1)`` (mCAP's ``P_all``).
    """
    pk = space.packing
    cols = [pk.column(c.degree) for c in space.configs]
    L, limit = space.num_layers, space.max_num_stages
    ways: list[dict[tuple[int, int], int]] = [dict() for _ in range(L + 1)]
    ways[L][(pk.start, 0)] = 1
    for start in range(L - 1, -1, -1):
        acc = ways[start]
        for stop in range(start + 1, L + 1):
            for (state, n), w in ways[stop].items():
                if n + 1 > limit:
                    continue
                for col in cols:
                    nxt = int(pk.next[state, col])
                    if nxt >= 0:
                        acc[(nxt, n + 1)] = acc.get((nxt, n + 1), 0) + w
    return sum(w for (state, _), w in ways[0].items() if pk.accepting[state])
