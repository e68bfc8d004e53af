"""Packing stages onto the mesh: which multisets of stage degrees fill it exactly, and where each stage goes.

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
``PlanSpace(cross_node=True)`` (:mod:`~hybridplan.search.memory.space`) also lets a data (or data x tensor)
stage's replicas span nodes, as plans allow (plan/rules.py: only a tensor group must share a node). Such a stage takes ``m`` *whole* nodes, ``m`` = 2, 4, ...:
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

from collections.abc import Sequence

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.search.progress import Progress, ProgressCallback

__all__ = ["MeshPacking", "place_stages"]

_REPORT_EVERY = 4096
"""States between two progress checks while building :class:`MeshPacking` (a check reads the clock)."""


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
