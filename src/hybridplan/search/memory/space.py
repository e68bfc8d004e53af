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

[Note: stages across nodes]
``PlanSpace(cross_node=True)`` also lets a data (or data x tensor) stage's replicas span nodes, as plans allow
(plan/rules.py: only a tensor group must share a node). Such a stage takes ``m`` *whole* nodes, ``m`` = 2, 4, ...:
its degree is ``m*k``. Whole nodes because the value of a stage depends on its degree only, so a stage over parts
of nodes (say 2 + 2 devices of two nodes of 4) would add no value and only make packing harder; and a stage over
whole nodes keeps each tensor group of ``t | k`` consecutive devices inside one node and its replicas on the
fewest nodes. Packing stays exact: the whole-node stages take ``W`` nodes, the others must pack onto the other
``N - W`` nodes, i.e. for each ``t`` that does not divide ``k``,
``(size of the smaller stages >= t) + W * t * floor(k/t) <= N * t * floor(k/t)``, which the state machine tracks
by counting a whole-node stage as ``t * floor(k/t)`` per node for each such ``t`` (for a power-of-two ``k`` there
is no such ``t``: the devices used are still the state). :func:`place_stages` gives a spanning stage the lowest
``m`` nodes that are still empty, so the runtime sees an ordinary data stage whose devices cover whole nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from hybridplan.plan import Cluster, Parallelism
from hybridplan.errors import PlanError
from hybridplan.search.progress import Progress, ProgressCallback

__all__ = [
    "KINDS",
    "StageConfig",
    "StageChoice",
    "PlanSpace",
    "MeshPacking",
    "stage_configs",
    "place_stages",
    "too_few_layers",
    "enumerate_plans",
    "count_plans",
]

_REPORT_EVERY = 4096
"""States between two progress checks while building :class:`MeshPacking` (a check reads the clock)."""

KINDS: tuple[str, ...] = ("none", "data", "tensor", "data+tensor")
"""Stage kinds in canonical order (the rank breaks exact ties between plans, see objective.py)."""


class StageConfig(NamedTuple):
    """How one stage runs: ``kind`` ("none", "data", "tensor", "data+tensor") at ``degree`` devices; a
    "data+tensor" stage is ``degree / tensor_degree`` replicas of ``tensor_degree`` devices (0 otherwise)."""

    kind: Parallelism
    degree: int
    tensor_degree: int = 0
    zero: int = 0
    """ZeRO level of a "data" stage (0: unsharded; predict/zero.py)."""
    recompute: bool = False
    """Every layer of the stage recomputes its activations (predicted from a recompute profile:
    [Note: recompute chosen per stage] in predict/memory.py)."""

    @property
    def model_kwargs(self) -> dict[str, int]:
        """What a stage-memory model is told beyond ``(kind, degree)``: the tensor degree of a data x tensor
        stage, the ZeRO level of a sharded one, ``recompute`` of a recomputed one (the protocol in
        search/memory/objective.py), nothing else."""
        more = {"tensor_degree": self.tensor_degree} if self.kind == "data+tensor" else {}
        if self.zero:
            more["zero"] = self.zero
        if self.recompute:
            more["recompute"] = True
        return more

    @property
    def label(self) -> str:
        """E.g. ``none x1``, ``tensor x4``, ``data x2 + tensor x2``, ``data x2 ZeRO-1``, ``none x1 recompute``."""
        if self.kind == "data+tensor":
            out = f"data x{self.degree // self.tensor_degree} + tensor x{self.tensor_degree}"
        else:
            out = f"{self.kind} x{self.degree}" + (f" ZeRO-{self.zero}" if self.zero else "")
        return out + (" recompute" if self.recompute else "")


class StageChoice(NamedTuple):
    """One stage of a plan before placement: layers ``[start, stop)`` with ``space.configs[config]``."""

    start: int
    stop: int
    config: int


def stage_configs(devices_per_node: int, *, pipeline_only: bool = False, composite: bool = False, zero: bool = False,
                  recompute: bool = False, num_nodes: int = 1, cross_node: bool = False) -> tuple[StageConfig, ...]:
    """The stage configs of a node of ``devices_per_node`` devices, in canonical order.

    The order is by kind (none < data < tensor < data+tensor), then degree, then tensor degree, so that
    comparing config indices is comparing ``(kind, degree, tensor degree)``: the exact solver relies on it to
    visit candidates in canonical order. ``composite`` adds the data x tensor stages (both degrees at least 2,
    powers of two, together at most a node): the extended space; without it the space is CAPTURE's. ``zero``
    adds the data stages sharded by ZeRO-1 and ZeRO-3 after those, and ZeRO-2 last (predict/zero.py; added later,
    so the indices of the others, and the plans drawn from them, stay as they were). ``cross_node`` adds, after those, the stages over ``m`` whole nodes of a mesh of ``num_nodes``
    (``m`` = 2, 4, ... up to the nodes): data x ``m*k``, with ``composite`` data x tensor at ``m*k`` devices (tensor
    degree a power of two dividing ``k``: a tensor group stays in its node), with ``zero`` their ZeRO forms
    ([Note: stages across nodes]). ``recompute`` then repeats every config so far with activation recompute, last:
    each stage of a plan may recompute or not, and the indices of the configs without it stay as they were.

    >>> [f"{c.kind}{c.degree}" for c in stage_configs(4)]
    ['none1', 'data2', 'data4', 'tensor2', 'tensor4']
    >>> [c.label for c in stage_configs(8, composite=True)][-3:]
    ['data x2 + tensor x2', 'data x4 + tensor x2', 'data x2 + tensor x4']
    >>> [c.label for c in stage_configs(2, recompute=True)]
    ['none x1', 'data x2', 'tensor x2', 'none x1 recompute', 'data x2 recompute', 'tensor x2 recompute']
    """
    degrees = [2**a for a in range(1, devices_per_node.bit_length()) if 2**a <= devices_per_node]
    both = tuple(StageConfig("data+tensor", d * t, t) for d in degrees for t in degrees if d * t <= devices_per_node)
    k = devices_per_node
    spans = [m * k for m in (2**a for a in range(1, num_nodes.bit_length())) if m <= num_nodes] if cross_node else []
    plain = (StageConfig("none", 1),) if pipeline_only else (
        (StageConfig("none", 1),)
        + tuple(StageConfig("data", d) for d in degrees)
        + tuple(StageConfig("tensor", d) for d in degrees)
        + (tuple(sorted(both, key=lambda c: (c.degree, c.tensor_degree))) if composite else ())
        + (tuple(StageConfig("data", d, 0, z) for z in (1, 3) for d in degrees) if zero else ())
        + tuple(StageConfig("data", d) for d in spans)
        + (tuple(StageConfig("data+tensor", d, t) for d in spans for t in degrees if k % t == 0) if composite else ())
        + (tuple(StageConfig("data", d, 0, z) for z in (1, 3) for d in spans) if zero else ())
        + (tuple(StageConfig("data", d, 0, 2) for d in degrees + spans) if zero else ())  # last: older draws stay
    )
    return plain + (tuple(c._replace(recompute=True) for c in plain) if recompute else ())


class MeshPacking:
    """Which multisets of stage degrees still pack onto the mesh, as a small state machine.

    A state summarises the degrees chosen so far: the devices they use and, only when ``k`` is not a
    power of two, the sizes of the degrees ``>= t`` for the ``t`` that do not divide ``k`` ([Note:
    packing powers of two]). States are numbered ``0 .. num_states-1``; the empty multiset is
    :attr:`start`. For a power-of-two ``k`` the state number *is* the number of devices used.

    With ``max_stages`` the machine keeps only the states of plans of at most that many stages: those
    reachable in ``s`` stages that can finish in ``max_stages - s`` more. The plans are the same, the
    states can be far fewer: for ``k`` not a power of two the full machine is large (4.7 million states,
    minutes, for a single node of 1000 devices), but a model of 10 layers needs only its first 10 levels.

    Attributes:
        degrees: the distinct degrees, indexing the columns of ``next``/``prev``.
        next: ``next[r, i]`` is the state after adding a stage of ``degrees[i]`` to ``r``, or -1 when
            the result cannot pack (or, with ``max_stages``, belongs to no plan that short).
        prev: the inverse of ``next`` (adding a degree is injective), -1 where none.
        accepting: states that fill every device.
        used: devices used by each state.
        to_finish: fewest further stages that reach an accepting state (a large number if none).
    """

    def __init__(self, num_nodes: int, devices_per_node: int, degrees: Sequence[int], *,
                 max_stages: int | None = None, progress: ProgressCallback | None = None) -> None:
        """Build the machine by a breadth-first walk from the empty multiset.

        Args:
            num_nodes: N.
            devices_per_node: k.
            degrees: the stage degrees (powers of two ``<= k``, and multiples of ``k`` above it: stages over
                whole nodes, [Note: stages across nodes]).
            max_stages: keep only the states of plans of at most this many stages (``None``: all).
            progress: receives progress lines (:mod:`~hybridplan.search.progress`), for the large machines.
        """
        report = Progress.of(progress)
        self.degrees = tuple(sorted(set(degrees)))
        total = num_nodes * devices_per_node
        binding = [t for t in self.degrees if devices_per_node % t and t < devices_per_node]
        caps = [num_nodes * t * (devices_per_node // t) for t in binding]
        start_key = (0,) + (0,) * len(binding)
        index = {start_key: 0}
        keys = [start_key]
        depth = [0]  # stages on the shortest way from the start; breadth first, so never decreasing
        edges: list[list[int]] = []
        mesh = f"{num_nodes}x{devices_per_node}"
        i = 0
        while i < len(keys):
            if i % _REPORT_EVERY == 0 and report.due():
                report.update(f"mesh packing {mesh}: {i:,} of the {len(keys):,} states found so far expanded")
            key = keys[i]
            if max_stages is not None and depth[i] >= max_stages:  # no plan that short goes further
                edges.append([-1] * len(self.degrees))
                i += 1
                continue
            row = []
            for d in self.degrees:
                new = (key[0] + d,) + tuple(v + _claim(d, t, devices_per_node) for v, t in zip(key[1:], binding))
                if new[0] > total or any(v > c for v, c in zip(new[1:], caps)):
                    row.append(-1)
                    continue
                if new not in index:
                    index[new] = len(keys)
                    keys.append(new)
                    depth.append(depth[i] + 1)
                row.append(index[new])
            edges.append(row)
            i += 1
        # Number the states in key order, so that on a power-of-two mesh state r uses r devices (numpy: the
        # keys are distinct, so a lexicographic sort of their columns is their tuple order).
        if report.due():
            report.update(f"mesh packing {mesh}: numbering {len(keys):,} states")
        table = np.array(keys, dtype=np.int64).reshape(len(keys), 1 + len(binding))
        order = np.lexsort(table.T[::-1])
        rank = np.empty_like(order)
        rank[order] = np.arange(len(keys))
        moves = np.array(edges, dtype=np.int64).reshape(len(keys), len(self.degrees))[order]
        nxt = np.where(moves >= 0, rank[moves], -1)
        used = table[order, 0]
        to_finish = _fewest_to_finish(nxt, used, total)
        if max_stages is not None:
            # A state on a plan of at most max_stages stages is reached in `depth` and finished in `to_finish`
            # stages; the others go, and so do the moves to them. (States on the fewest-stage way from a kept
            # state to the end are kept, so `to_finish` of the kept states stays as computed.)
            keep = np.asarray(depth, dtype=np.int64)[order] + to_finish <= max_stages
            if not keep.all():
                renumber = np.cumsum(keep) - 1
                nxt = nxt[keep]
                nxt = np.where((nxt >= 0) & keep[nxt], renumber[nxt], -1)
                order, used, to_finish = order[keep], used[keep], to_finish[keep]
        self.keys = tuple(keys[i] for i in order.tolist())
        self.start = 0
        self.next = nxt
        self.prev = np.full_like(self.next, -1)
        for col in range(len(self.degrees)):
            ok = self.next[:, col] >= 0
            self.prev[self.next[ok, col], col] = np.nonzero(ok)[0]
        self.used = used
        self.accepting = self.used == total
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
    composite: bool = False
    """The extended space: also stages of data x tensor devices (:func:`stage_configs`)."""
    zero: bool = False
    """Also data stages sharded by ZeRO-1, ZeRO-2 and ZeRO-3 (:func:`stage_configs`)."""
    recompute: bool = False
    """Every stage config also with activation recompute (:func:`stage_configs`; the model needs a recompute
    profile to predict them)."""
    cross_node: bool = False
    """Also data (and data x tensor) stages over 2, 4, ... whole nodes ([Note: stages across nodes]); without it a
    stage never spans nodes (CAPTURE's space)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_nodes", "devices_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"plan space: {name} must be a positive integer, got {value!r}",
                                fix="a model needs at least one layer and a mesh at least 1x1 devices")
        if self.max_stages is not None and (isinstance(self.max_stages, bool) or not isinstance(self.max_stages, int)
                                            or self.max_stages < 1):
            raise PlanError(f"plan space: max_stages must be a positive integer or None, got {self.max_stages!r}")
        # Checked by arithmetic, before anything is built: the packing of a 1000x1000 mesh alone would
        # take hours (issue 9), and a space without plans should fail at once.
        need = self.min_stages
        if self.num_layers < need and self.cross_node and not self.pipeline_only:
            N, k = self.num_nodes, self.devices_per_node
            raise PlanError(f"a {self.mesh} mesh needs at least {need} stages even across nodes (a stage over 2, 4, ..."
                            f" whole nodes each, a node left over filled by powers of two) but the model has"
                            f" {self.num_layers} layers (one stage holds at least one)",
                            fix=f"use fewer devices, e.g. --cluster {1 << (N.bit_length() - 1)}x{k} (one stage over all"
                            " its nodes); or keep more layers when merging (a larger profile --merge-layers L_M)")
        if self.num_layers < need:
            raise too_few_layers(self.num_layers, self.num_nodes, self.devices_per_node, pipeline_only=self.pipeline_only)
        if self.max_stages is not None and self.max_stages < need:
            m, k, per_node = self.max_stages, self.devices_per_node, need // self.num_nodes
            if self.pipeline_only:
                fewer = f"use at most {m} devices"
            elif m >= per_node:
                fewer = f"use at most {_count(m // per_node, 'node')} of {k} devices"
            else:  # nodes of a power-of-two size need one stage each
                fewer = f"use at most {_count(m, 'node')} of {1 << (k.bit_length() - 1)} devices"
            raise PlanError(f"max_stages {self.max_stages} is below the {need} stages a {self.mesh} mesh needs",
                            fix=f"raise max_stages to at least {need}, or {fewer}")

    @classmethod
    def for_cluster(cls, cluster: Cluster, num_layers: int, *, pipeline_only: bool = False,
                    max_stages: int | None = None, composite: bool = False, zero: bool = False,
                    recompute: bool = False, cross_node: bool = False) -> PlanSpace:
        """The space of a :class:`~hybridplan.plan.cluster.Cluster`'s mesh."""
        return cls(num_layers, cluster.num_nodes, cluster.devices_per_node, pipeline_only, max_stages, composite, zero,
                   recompute, cross_node)

    @property
    def num_devices(self) -> int:
        """N x k."""
        return self.num_nodes * self.devices_per_node

    @property
    def mesh(self) -> str:
        """The mesh as ``NxK``, as ``--cluster`` takes it."""
        return f"{self.num_nodes}x{self.devices_per_node}"

    @property
    def min_stages(self) -> int:
        """The fewest stages of any plan, by arithmetic (the packing need not be built).

        Every device is used and a stage never spans nodes, so each node is filled by stages whose degrees are
        powers of two summing to ``k``; the fewest such powers are the ones bits of ``k`` (two equal powers
        could merge into one stage), e.g. 1 for k = 8, 2 for k = 6 (4 + 2), 6 for k = 1000. Pipeline-only:
        one stage per device. It equals ``packing.to_finish[packing.start]`` (tests/search/memory/test_space.py).
        """
        if self.pipeline_only:
            return self.num_devices
        if self.cross_node:  # the nodes in runs of 2, 4, ... (one stage each), a node left over filled as above
            N = self.num_nodes
            return (N >> 1).bit_count() + (N & 1) * self.devices_per_node.bit_count()
        return self.num_nodes * self.devices_per_node.bit_count()

    @property
    def max_num_stages(self) -> int:
        """The deepest pipeline possible: at most one stage per device, per layer, and ``max_stages``."""
        bound = min(self.num_devices, self.num_layers)
        return bound if self.max_stages is None else min(bound, self.max_stages)

    @cached_property
    def configs(self) -> tuple[StageConfig, ...]:
        """The stage configs, in canonical order."""
        return stage_configs(self.devices_per_node, pipeline_only=self.pipeline_only, composite=self.composite,
                             zero=self.zero, recompute=self.recompute, num_nodes=self.num_nodes,
                             cross_node=self.cross_node)

    @property
    def packing(self) -> MeshPacking:
        """The packing state machine of the mesh, built on first use (see :meth:`mesh_packing`)."""
        return self.mesh_packing()

    def mesh_packing(self, progress: ProgressCallback | None = None) -> MeshPacking:
        """The packing state machine of the mesh, built on first use and kept.

        The solvers call this first, with their ``progress``, because the build can be long where ``k`` is
        not a power of two (:class:`MeshPacking`, bounded here by :attr:`max_num_stages`); for a power-of-two
        ``k`` it takes ``N*k + 1`` states.
        """
        cached = self.__dict__.get("_packing")
        if cached is None:
            k = self.devices_per_node
            # A power-of-two k has N*k + 1 states, numbered by the devices they use: kept whole. Otherwise
            # only the states of plans of at most max_num_stages stages (the model's layers bound it).
            bound = None if k & (k - 1) == 0 else self.max_num_stages
            cached = MeshPacking(self.num_nodes, k, [c.degree for c in self.configs], max_stages=bound,
                                 progress=progress)
            object.__setattr__(self, "_packing", cached)  # a cache, not a field: equality and hash ignore it
        return cached

    def cluster(self) -> Cluster:
        """A uniform cluster of this shape (for :meth:`hybridplan.plan.Plan.validate`)."""
        return Cluster.uniform(self.num_nodes, self.devices_per_node)

    def place(self, choices: Sequence[StageChoice]) -> tuple[tuple[int, ...], ...]:
        """The devices of each stage of a plan (see :func:`place_stages`)."""
        return place_stages([self.configs[c.config].degree for c in choices], self.num_nodes, self.devices_per_node)


def too_few_layers(num_layers: int, num_nodes: int, devices_per_node: int, *, pipeline_only: bool = False) -> PlanError:
    """The error for a mesh that needs more stages than the model has layers, suggesting *smaller* meshes.

    Each suggestion is a mesh whose space has plans: fewer nodes of the same ``k``; for a ``k`` that is not a
    power of two, nodes of the largest power of two below it (one stage per node); pipeline-only, at most one
    device per layer. Keeping more layers when merging (a larger ``profile --merge-layers``) is the other way out.

    >>> print(too_few_layers(10, 1000, 1000))  # doctest: +NORMALIZE_WHITESPACE
    a 1000x1000 mesh needs at least 6000 stages (6 per node: a stage never spans nodes and its degree is a
    power of two) but the model has 10 layers (one stage holds at least one)
      fix: use fewer devices: at most 1 node of 1000, e.g. --cluster 1x1000, or --cluster 10x512 (a node of
      2^j devices needs one stage); or keep more layers when merging (a larger profile --merge-layers L_M)
    """
    N, k, L = num_nodes, devices_per_node, num_layers
    mesh = f"{N}x{k}"
    if pipeline_only:
        need, how = N * k, "one per device, pipeline-only"
        nodes, per_node = (L // k, k) if L >= k else (1, L)
        options = [f"at most {L} devices, e.g. --cluster {nodes}x{per_node}",
                   "or allow data/tensor-parallel stages (no --pipeline-only)"]
    else:
        per = k.bit_count()
        need = N * per
        how = ("one per node: a stage never spans nodes" if per == 1 else
               f"{per} per node: a stage never spans nodes and its degree is a power of two")
        options = []
        if L >= per:
            options.append(f"at most {_count(L // per, 'node')} of {k}, e.g. --cluster {L // per}x{k}")
        if per > 1:
            pow2 = 1 << (k.bit_length() - 1)
            options.append(f"{'or ' if options else ''}--cluster {min(N, L)}x{pow2} (a node of 2^j devices needs one stage)")
    return PlanError(
        f"a {mesh} mesh needs at least {need} stages ({how}) but the model has {L} layers (one stage holds at least one)",
        fix="use fewer devices: " + ", ".join(options)
        + "; or keep more layers when merging (a larger profile --merge-layers L_M)",
    )


def _fewest_to_finish(nxt: np.ndarray, used: np.ndarray, total: int) -> np.ndarray:
    """Fewest further stages from each state to a full mesh (``total + 1`` where none), states numbered in
    key order.

    A stage adds devices, so successors use more: the states are settled one level of ``used`` at a time,
    fullest first, vectorised over the level (in key order a level is a run of states).
    """
    unreachable = total + 1
    to_finish = np.where(used == total, 0, unreachable)
    levels = np.concatenate([[0], np.flatnonzero(np.diff(used)) + 1, [len(used)]])
    for a, b in zip(levels[-2::-1], levels[:0:-1]):
        row = nxt[a:b]
        via = np.where(row >= 0, to_finish[row] + 1, unreachable).min(axis=1, initial=unreachable)
        to_finish[a:b] = np.minimum(to_finish[a:b], via)
    return to_finish


def _claim(d: int, t: int, k: int) -> int:
    """What a stage of ``d`` devices takes of the mesh's room for stages of ``t`` devices ([Note: packing powers of
    two], [Note: stages across nodes]): ``d`` if it is at least ``t`` (on a node, within a node's room for them),
    nothing if smaller; a stage over ``d/k`` whole nodes takes those nodes' room, ``t*floor(k/t)`` each."""
    if d > k:
        return (d // k) * t * (k // t)
    return d if d >= t else 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def place_stages(degrees: Sequence[int], num_nodes: int, devices_per_node: int) -> tuple[tuple[int, ...], ...]:
    """Global device indices for stages of the given degrees, in pipeline order; deterministic.

    Each stage goes on the node of the previous stage if it fits there and the remaining stages still
    pack ([Note: packing powers of two]), else on the lowest-numbered node where that holds; within a
    node it takes the lowest free devices. So consecutive stages share a node where possible (their
    activations cross the fast intra-node link) and the pipeline walks the nodes in order. A stage of
    more than ``k`` devices (a multiple of ``k``: [Note: stages across nodes]) takes the lowest-numbered
    nodes that are still empty and leave the rest packable.

    Raises:
        PlanError: if the degrees do not pack onto the mesh exactly.

    >>> place_stages([1, 2, 1, 4], 2, 4)
    ((0,), (1, 2), (3,), (4, 5, 6, 7))
    >>> place_stages([2, 8, 2], 3, 4)
    ((0, 1), (4, 5, 6, 7, 8, 9, 10, 11), (2, 3))
    """
    k = devices_per_node
    if sum(degrees) != num_nodes * k or any(d < 1 or (d & (d - 1) if d <= k else d % k) for d in degrees):
        raise PlanError(f"stage degrees {list(degrees)} cannot fill a {num_nodes}x{k} mesh exactly",
                        fix=f"degrees must be powers of two up to {k}, or multiples of {k} (whole nodes), summing to"
                        f" {num_nodes * k}")
    sizes = sorted({d for d in degrees if d <= k})
    free = [k] * num_nodes
    empty = num_nodes
    whole = sum(d // k for d in degrees if d > k)  # nodes the spanning stages still need (they must be empty)
    remaining = {t: sum(d for d in degrees if t <= d <= k) for t in sizes}
    capacity = {t: num_nodes * t * (k // t) for t in sizes}  # room for stages >= t over all nodes

    def packs(empty: int, whole: int, capacity: dict[int, int], remaining: dict[int, int]) -> bool:
        """The spanning stages onto empty nodes, the others onto the rest ([Note: stages across nodes])."""
        return whole <= empty and all(remaining[t] <= capacity[t] - whole * t * (k // t) for t in sizes)

    if not packs(empty, whole, capacity, remaining):
        raise PlanError(f"stage degrees {sorted(degrees, reverse=True)} do not pack onto {num_nodes} nodes of {k} devices")
    out: list[tuple[int, ...]] = []
    current = 0
    for d in degrees:
        if d > k:  # any m empty nodes leave the same room: the lowest
            nodes = [n for n in range(num_nodes) if free[n] == k][: d // k]
            for n in nodes:
                free[n] = 0
                for t in sizes:
                    capacity[t] -= t * (k // t)
            empty -= len(nodes)
            whole -= len(nodes)
            out.append(tuple(n * k + i for n in nodes for i in range(k)))
            continue
        after = {t: remaining[t] - (d if d >= t else 0) for t in sizes}
        for n in [current] + [n for n in range(num_nodes) if n != current]:
            f = free[n]
            if f >= d and packs(empty - (f == k), whole,
                                {t: capacity[t] - t * (f // t) + t * ((f - d) // t) for t in sizes}, after):
                break
        else:  # pragma: no cover - excluded by the packing condition checked above
            raise PlanError(f"internal: cannot place a stage of degree {d}")
        first = n * k + (k - f)
        out.append(tuple(range(first, first + d)))
        for t in sizes:
            capacity[t] += t * ((f - d) // t) - t * (f // t)
        remaining = after
        empty -= f == k
        free[n] -= d
        current = n
    return tuple(out)


def enumerate_plans(space: PlanSpace,
                    keep: Callable[[StageChoice, int], bool] | None = None) -> Iterator[tuple[StageChoice, ...]]:
    """Every plan of the space, once each, as stage choices in pipeline order.

    Plans are built from the last stage to the first, so that when a stage is chosen the number of
    stages after it is known: ``keep(choice, stages_after)``, if given, can then cut every plan that
    contains the stage (CAPTURE's pruning, :mod:`~hybridplan.search.memory.exhaustive`). Partial plans that can
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
