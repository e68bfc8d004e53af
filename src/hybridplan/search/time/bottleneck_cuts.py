"""Cutting a layer chain into pipeline stages fast: branch and bound on the bottleneck values.

[Note: bottleneck search] The objective of :func:`~hybridplan.search.time.stage_cuts.assignment_objective`,
``g max_j u_j + sum_j (t_j + e_j)`` (``g = gas - 1``, ``u_j`` the stage time or the floor of its incoming
boundary), optionally plus the data-parallel gradient sync ``max_j c_j w_j`` (``w_j`` the gradient bytes of
stage ``j``'s layers, ``c_j`` seconds per byte of its ring all-reduce: time_model's eq. 4 term), has two max
terms that do not decompose over stages. AMP's program (stage_cuts.py) carries the max as a tolerance index
through the table, ``O(k L^2 |m|)``. Here we fix the maxima instead: for caps ``P`` (pipeline) and ``Q``
(sync), ``S(P, Q)`` = the least ``sum (t + e)`` over cuts whose every ``u_j <= P`` and ``c_j w_j <= Q``. Then

    optimum = min over (P, Q) of  g P + Q + S(P, Q),

and it suffices to try the values ``P`` and ``Q`` that some stage can take (the candidates). Three facts make
this fast:

1. ``S(P, Q)`` is a shortest path over (stage, layer) in which stage ``j`` may hold ``[a, i)`` only when
   ``a >= lo_j(i)``: layer times and bytes are non-negative, so a range's time and bytes grow with it and the
   allowed starts form a window ``[lo_j(i), i - 1]`` (boundaries whose floor exceeds ``P`` are masked). With
   ``t_j(a, i) = p_j(i) - p_j(a)`` (prefix sums), ``f_j(i) = p_j(i) + min_{a in window} (f_{j-1}(a) - p_j(a)
   + e_j(a))``: a minimum over a window, for all ``i`` in one numpy pass (``reduceat`` or a sparse table);
   the windows come from a binary search over all ends at once. ``O(k L log L)`` per evaluation (cost note
   below), and a batch of caps in one pass.
2. ``S`` is non-increasing in both caps, and the cut found at ``(P, Q)`` has its own maxima ``(P', Q') <= (P,
   Q)`` with the same sum: every ``(P'', Q'')`` with ``P' <= P'' <= P`` and ``Q' <= Q'' <= Q`` is dominated by
   ``(P', Q')``. One evaluation therefore removes a quadrant of the candidate box; more generally a known cut
   of sum ``S_c`` dominates the quadrant above its maxima in any box whose sums are all ``>= S_c``, and an
   infeasible evaluation kills the quadrant below its caps.
3. Within a box of candidates ``[P_lo, P_hi] x [Q_lo, Q_hi]`` cut out of a parent whose sum was ``S``, no
   objective is below ``g P_lo + Q_lo + S``. Boxes are searched best bound first and halved along the side over
   which that bound varies most before evaluation (a binary search on the bottleneck; with one micro-batch
   ``g`` is tiny and the sync side goes first), so the search stops as soon as the best bound left cannot beat
   the best cut found.

Before the boxes: two incumbents (the least sum without caps, whose sum bounds every sum, and stages of equal
time) bound the caps a better cut can have, so only candidates in that range are built; then a binary search
finds the least feasible ``P`` (any ``Q``) and the least feasible ``Q`` (any ``P``), below which all is dead.

The search is exact: every candidate pair is either evaluated, dominated or bounded out.

[Note: bottleneck search cost] What the search costs at worst, and why that is not ``O(k L^2)``.

*One evaluation* of ``S(P, Q)`` costs ``O(k L log L)``: the windows' starts by a binary search over all ends,
``O(L log L)`` per distinct stage cost vector and sync factor; per stage the window minima either by
``reduceat`` (``O(L w)``) or by a sparse table (``O(L log w)``), whichever is cheaper for those windows (both
give the same floats, a minimum being exact: :class:`_WindowMinima`); the traceback ``O(k w)``.

*The number of evaluations* ``E`` is at most ``1 + |C_P| |C_Q|``, with ``C_P`` the candidate bottlenecks in
``[p_floor, p_max]`` and ``C_Q`` the candidate syncs up to ``q_max`` (and 0). Proof: after the first
evaluation (no caps), the binary searches and the boxes evaluate only at pairs ``(ps[i], qs[j])`` of candidates,
through ``seen``, a cache keyed by the pair, so no pair is evaluated twice; and the search ends, since a popped
box is either dropped or evaluated at its top corner ``(ph, qh)``, and the boxes it leaves (``P < ps[pu]`` or
``Q < qs[qu]``, with ``pu <= ph`` and ``qu <= qh``) lie inside it without that corner. Without a sync term
(``|C_Q| = 1``) the search stops after :data:`SWEEP_AFTER` evaluations and computes ``S(P)`` of every
candidate ``P`` left, ascending, in batches of caps (one numpy pass per stage for the batch,
:meth:`_Problem.sums`; batches past ``g P + least sum >= best`` are skipped, and each batch's best cap is
evaluated for its cut): again each candidate at most once, with numpy instead of Python setting the pace.
``|C_P| <= L + D L (L + 1) / 2`` with ``D`` the distinct (stage cost vector, boundary floors) pairs of stages
1 .. k-1 (stage 0 only holds prefixes), and ``|C_Q| <= 1 + F L (L + 1) / 2`` with ``F`` the distinct sync
factors. So the whole search costs, at worst, ``O(D k L^3 log L)`` without a sync term (``O(k L^3 log L)`` on
one device type) and ``O(D F k L^5 log L)`` with one; on the plan search's inputs ``E`` is about 20.

*Why not* ``O(k L^2)``. The tied-corners family (tests/search/time/test_bottleneck_cuts.py,
benchmarks/search_time/worst_case.py) makes ``Theta(L^2)`` cuts tie up to noise: layer times about 1 (all range
sums distinct), three or more stages, and boundary costs ``e_0(m) = g p(m)`` and ``e_1(m') = g (p(L) - p(m'))``
that pay back ``g`` times the middle stage's time ``p(m') - p(m)``, so that every cut whose middle stage is the
slowest costs ``g p(L)`` plus the noise. Each is the least-sum cut for the caps from its own bottleneck ``B_c``
up to the next one, so an evaluation reveals one of them, and the bound the other evaluations give it (``g B_c +
S(B_next)``, ``g (B_next - B_c)`` below ``g p(L)``) cannot exclude it: a search that learns ``S`` by evaluating
it must evaluate at a cap of each, ``Omega(L^2)`` evaluations reading ``Theta(k L)`` table entries each,
``Omega(k L^3)``, which the search reaches up to the ``log L``. A second tie on the sync, on other stages,
multiplies the corners (``Theta(L^4)``: the ``|C_P| |C_Q|`` above). The programs that do not evaluate cap by cap
are no cheaper at worst: AMP's carries the tolerance, ``O(k L^2 |C_P|) = O(k L^4)`` (no sync); one carrying the
Pareto set of (bottleneck, sum) per (stage, end) holds ``Theta(L)`` labels per state on this family and up to
``|C_P|`` in general, ``O(k L^2 |C_P|)`` as well. benchmarks/search_time (worst case) measures both searches
on these families; the search stays exact on every one (the tests against AMP's program and brute force).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.search.time.stage_cuts import _SINGLE_MICROBATCH_WEIGHT, Assignment, _check, assignment_objective

__all__ = ["SyncCosts", "bottleneck_assignment", "bottleneck_min_max", "range_sums"]


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


SPARSE_TABLE_FACTOR = 4.0
"""Window minima use a sparse table once the windows' total width exceeds this factor times its ``L log w``
cost (both give the same floats, a minimum being exact): a choice of speed, not of result. The worst-case
benchmark (benchmarks/search_time/worst_case.py) sets it to infinity to time the reduceat-only evaluation."""


class _WindowMinima:
    """The minimum of ``h[r, lo[r, i] : i]`` for every row ``r`` and end ``i``, for any ``h`` of ``rows x (L + 2)``
    (windows fixed, values not); the starts are non-decreasing in ``i``. A row is one cap (one evaluation of
    ``S``): rows are flattened into one array, which no window crosses.

    Two ways, the cheaper chosen once per set of windows: ``np.minimum.reduceat`` over the ``[lo_i, i)`` pairs,
    ``O(sum of widths)`` (``O(L w)`` per row); or a sparse table, ``O(L log w)`` per row: level ``s`` holds
    the minima of the ``2^s`` values from each position, and a window of width ``d`` is the minimum of two
    overlapping blocks of ``2^floor(log2 d)``. An empty window (``lo >= i``) gives some value of ``h``;
    callers add inf."""

    def __init__(self, lo: np.ndarray) -> None:
        rows, ends = lo.shape[0], lo.shape[1]
        stride = ends + 1
        end = np.arange(ends)[None, :]
        width = np.maximum(end - lo, 1)
        offset = (np.arange(rows) * stride)[:, None]
        self.levels = int(width.max()).bit_length()  # levels 0 .. floor(log2 w)
        self.sparse = float(width.sum()) > SPARSE_TABLE_FACTOR * width.size * (self.levels + 2)
        if self.sparse:
            level = np.frexp(width)[1] - 1  # floor(log2 d), exact: frexp reads the exponent
            self.level, self.left, self.right = level, lo + offset, np.maximum(end - (1 << level), lo) + offset
        else:
            self.pairs = np.empty((rows, 2 * ends), dtype=np.intp)
            self.pairs[:, 0::2], self.pairs[:, 1::2] = lo + offset, end + offset
            self.pairs = self.pairs.ravel()
        self.shape = lo.shape

    def __call__(self, h: np.ndarray) -> np.ndarray:
        flat = h.ravel()
        if not self.sparse:
            # every window's minimum in one pass, the in-between results dropped
            return np.minimum.reduceat(flat, self.pairs)[0::2].reshape(self.shape)
        table = np.full((self.levels, len(flat)), np.inf)
        table[0] = flat
        for s in range(1, self.levels):
            half = 1 << (s - 1)
            np.minimum(table[s - 1, : len(flat) - half], table[s - 1, half:], out=table[s, : len(flat) - half])
        return np.minimum(table[self.level, self.left], table[self.level, self.right])


@functools.lru_cache(maxsize=8)
def _not_a_range(n: int) -> np.ndarray:
    """``(n + 1) x (n + 1)``: -inf where ``a >= b`` (no range ``[a, b)``), 0 elsewhere; added to a matrix of
    range values so that no search takes those entries."""
    out = np.zeros((n + 1, n + 1))
    out[np.tril_indices(n + 1)] = -np.inf
    out.flags.writeable = False
    return out


class _Problem:
    """The fixed data of one cut problem: windows and sums per evaluation of ``S(P, Q)``."""

    def __init__(self, stage_costs: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray],
                 cut_floors: Sequence[np.ndarray] | None, sync: SyncCosts | None) -> None:
        self.k, self.n = _check(stage_costs, cut_costs)
        n = self.n
        below = _not_a_range(n)
        # distinct stage cost vectors (identical devices share one), their prefix sums and range times
        self.kind: list[int] = []
        keys: dict[bytes, int] = {}
        self.prefix: list[np.ndarray] = []
        self.seg: list[np.ndarray] = []
        for c in stage_costs:
            c = np.asarray(c, dtype=float)
            if (c < 0).any() or not np.isfinite(c).all():
                raise PlanError("layer times must be finite and non-negative")
            key = c.tobytes()
            if key not in keys:
                keys[key] = len(self.prefix)
                p = np.concatenate(([0.0], np.cumsum(c)))
                self.prefix.append(p)
                self.seg.append(p[None, :] - p[:, None] + below)
            self.kind.append(keys[key])
        self.cuts = [np.asarray(e, dtype=float)[: n - 1] for e in cut_costs]
        self.floors = ([np.zeros(n - 1) for _ in cut_costs] if cut_floors is None
                       else [np.asarray(f, dtype=float)[: n - 1] for f in cut_floors])
        # boundaries with the same costs and floors (links of the same kind) share their arrays per evaluation
        link_keys: dict[bytes, int] = {}
        self.link_kind = [0] + [link_keys.setdefault(e.tobytes() + fl.tobytes(), len(link_keys))
                                for e, fl in zip(self.cuts, self.floors)]
        # sync: distinct factors share one matrix of seconds
        self.sync_kind: list[int] = []
        self.sync: list[np.ndarray] = []
        if sync is not None and any(f > 0 for f in sync.factors):
            if len(sync.factors) != self.k or sync.range_bytes.shape != (n + 1, n + 1):
                raise PlanError(f"sync costs need {self.k} factors and a {n + 1} x {n + 1} range matrix")
            fkeys: dict[float, int] = {}
            for f in sync.factors:
                if f not in fkeys:
                    fkeys[f] = len(self.sync)
                    self.sync.append(f * sync.range_bytes + below)
                self.sync_kind.append(fkeys[f])
        self.upper = below == 0
        self._remembered: dict[tuple[str, int, float], np.ndarray] = {}  # window starts per single cap
        self.link_base: dict[tuple[int, int], np.ndarray] = {}  # e_j(a) - p_j(a) per (cost vector, link kind)
        self.floor_max = [float(fl.max(initial=-np.inf)) for fl in self.floors]  # below every cap: no mask needed
        self.ends = np.arange(n + 1)
        self.steps = max(1, int(np.ceil(np.log2(n + 1))))

    def candidates(self, p_range: tuple[float, float], q_max: float) -> tuple[np.ndarray, np.ndarray]:
        """Every value in ``p_range`` a stage's ``u`` can take, and every sync seconds up to ``q_max`` (sorted,
        without repeats)."""
        low, high = p_range
        values = [self.seg[self.kind[0]][0, 1:]]
        seen: set[tuple[int, bytes]] = set()
        for j in range(1, self.k):
            key = (self.kind[j], self.floors[j - 1].tobytes())
            if key in seen:
                continue
            seen.add(key)
            floor = np.concatenate(([np.inf], self.floors[j - 1], [np.inf]))  # a = 0 and a = L start no stage j >= 1
            u = np.maximum(self.seg[self.kind[j]], floor[:, None])
            values.append(u[(u >= low) & (u <= high) & (u < np.inf) & self.upper])
        ps = np.concatenate(values)
        qs = np.concatenate([[0.0]] + [s[(s <= q_max) & self.upper] for s in self.sync])
        return np.unique(ps[(ps >= low) & (ps <= high)]), np.unique(qs)

    def _starts(self, key: tuple[str, int], ranges: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """:meth:`_first_starts`, remembered for single caps: the boxes evaluate one cap of ``P`` with many of
        ``Q`` and the reverse, and the windows of a cap do not change (at most 4096 kept, then forgotten)."""
        if len(caps) != 1:
            return self._first_starts(ranges, caps)
        entry = (key[0], key[1], float(caps[0]))
        if entry not in self._remembered:
            if len(self._remembered) >= 4096:
                self._remembered.clear()
            self._remembered[entry] = self._first_starts(ranges, caps)
        return self._remembered[entry]

    def _first_starts(self, ranges: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """For every cap (row) and end ``i``, the first start ``a`` with ``ranges[a, i] <= cap``: a binary search
        over all ends at once. A range's time or bytes shrink as its start moves right (non-negative layer costs;
        cumulative sums and differences of floats keep that order), so the allowed starts are ``[a, i - 1]``
        (``ranges[i, i]`` is -inf: the search ends at ``i`` at the latest)."""
        lo = np.zeros((len(caps), self.n + 1), dtype=np.intp)
        hi = np.empty_like(lo)
        hi[:] = self.ends
        flat, column, cap = ranges.ravel(), self.ends, caps[:, None]
        for _ in range(self.steps):
            mid = (lo + hi) >> 1
            ok = flat[mid * (self.n + 1) + column] <= cap
            np.copyto(hi, mid, where=ok)
            np.copyto(lo, mid + 1, where=~ok)
        return hi

    def value(self, cut: tuple[int, ...], g: float) -> tuple[float, float]:
        """The objective ``g max u + max sync + sum (t + e)`` of a cut, and its sum."""
        total = sum(float(self.prefix[self.kind[j]][cut[j + 1]] - self.prefix[self.kind[j]][cut[j]]) for j in range(self.k))
        total += sum(float(self.cuts[j - 1][cut[j] - 1]) for j in range(1, self.k))
        u, q = self.maxima(cut)
        return g * u + q + total, total

    def balanced_cut(self) -> tuple[int, ...]:
        """Stages of about equal time on the first stage's costs: a first incumbent for the search."""
        p = self.prefix[self.kind[0]]
        cut = [0] + [int(np.searchsorted(p, p[-1] * j / self.k)) for j in range(1, self.k)] + [self.n]
        for j in range(1, self.k):  # non-empty stages
            cut[j] = max(cut[j], cut[j - 1] + 1)
        for j in range(self.k - 1, 0, -1):
            cut[j] = min(cut[j], cut[j + 1] - 1)
        return tuple(cut)

    def bottleneck_floor(self) -> float:
        """A lower bound of any cut's ``max u``: some stage holds each layer, and the stages share the sum."""
        least = np.min([np.diff(p) for p in self.prefix], axis=0)
        return max(float(least.max()), float(least.sum()) / self.k)

    def evaluate(self, cap_p: float, cap_q: float) -> tuple[float, tuple[int, ...] | None]:
        """``S(P, Q)`` and a cut reaching it (None where no cut fits the caps)."""
        n = self.n
        totals, fs, window, link = self._paths(np.array([cap_p]), cap_q, keep=True)
        total = float(totals[0])
        if not np.isfinite(total):
            return total, None
        bounds = [n]
        for j in range(self.k - 1, 0, -1):
            i = bounds[-1]
            lo = int(window(j)[0][0, i])
            bounds.append(lo + int(np.argmin(fs[j - 1][0, lo:i] + link(j)[0, lo - 1 : i - 1])))
        bounds.append(0)
        return total, tuple(reversed(bounds))

    def sums(self, caps_p: np.ndarray, cap_q: float) -> np.ndarray:
        """``S(P, cap_q)`` for every ``P`` in ``caps_p`` at once (inf where no cut fits): the shortest paths of
        :meth:`evaluate`, one row per cap, without the cuts."""
        return self._paths(caps_p, cap_q, keep=False)[0]

    def _paths(self, caps_p: np.ndarray, cap_q: float, keep: bool) -> tuple[
            np.ndarray, list[np.ndarray], Callable[[int], tuple[np.ndarray, _WindowMinima, np.ndarray]],
            Callable[[int], np.ndarray]]:
        """The least sums at the end of the chain for every cap ``P`` (row), and (``keep``) every stage's table
        with the windows and links, for the traceback."""
        n, rows = self.n, len(caps_p)
        lo_p = [self._starts(("p", i), s, caps_p) for i, s in enumerate(self.seg)]
        lo_q = [self._starts(("q", i), s, np.array([cap_q])) for i, s in enumerate(self.sync)]
        windows: dict[tuple[int, int], tuple[np.ndarray, _WindowMinima, np.ndarray]] = {}
        links: dict[tuple[int, int], np.ndarray] = {}
        least_cap = float(caps_p.min())

        def window(j: int) -> tuple[np.ndarray, _WindowMinima, np.ndarray]:
            """Starts ``lo`` (window ``[lo[r, i], i - 1]``), the window minima, and ``p_j`` with inf at the ends
            whose window is empty."""
            key = (self.kind[j], self.sync_kind[j] if self.sync else 0)
            if key not in windows:
                lo = np.maximum(lo_p[key[0]], lo_q[key[1]]) if self.sync else lo_p[key[0]]
                lo = np.maximum(lo, 1)
                windows[key] = (lo, _WindowMinima(lo), np.where(lo >= self.ends, np.inf, self.prefix[key[0]]))
            return windows[key]

        def link(j: int) -> np.ndarray:
            """What a start ``a`` adds before stage ``j``'s own time: ``e(a) - p_j(a)``, inf where the floor of the
            boundary exceeds the cap."""
            key = (self.kind[j], self.link_kind[j])
            if key not in links:
                if key not in self.link_base:
                    self.link_base[key] = self.cuts[j - 1] - self.prefix[key[0]][1:n]
                links[key] = (self.link_base[key][None, :] if self.floor_max[j - 1] <= least_cap
                              else np.where(self.floors[j - 1][None, :] <= caps_p[:, None], self.link_base[key], np.inf))
            return links[key]

        p0 = self.prefix[self.kind[0]]
        f = np.where(np.maximum(lo_p[self.kind[0]], lo_q[self.sync_kind[0]] if self.sync else 0) == 0, p0, np.inf)
        f[:, 0] = np.inf
        fs = []
        h = np.full((rows, n + 2), np.inf)  # h[a]: a stage starting at layer a; h[0], h[n], h[n + 1] stay inf
        for j in range(1, self.k):
            np.add(f[:, 1:n], link(j), out=h[:, 1:n])
            _, minima, p = window(j)
            if keep:
                fs.append(f)
            f = minima(h) + p
        return f[:, n], fs, window, link

    def maxima(self, b: tuple[int, ...]) -> tuple[float, float]:
        """The cut's own ``max u`` and ``max sync`` (the same floats the candidates hold)."""
        u = max([float(self.seg[self.kind[j]][b[j], b[j + 1]]) for j in range(self.k)]
                + [float(self.floors[j - 1][b[j] - 1]) for j in range(1, self.k)])
        q = max((float(self.sync[self.sync_kind[j]][b[j], b[j + 1]]) for j in range(self.k)), default=0.0) if self.sync else 0.0
        return u, max(q, 0.0)


SWEEP_AFTER = 64
"""Evaluations of the box search after which a search without sync sweeps the candidates left instead (module
note): about three times what the search needs on the plan search's cases (benchmarks/search_time: about 20
per cut), so that the sweep only takes over where corners are many. A choice of speed, not of result: both
are exact. The worst-case benchmark sets it to infinity to time the box search alone."""

_SWEEP_ELEMENTS = 1 << 18
"""Caps per sweep batch times ``L + 2``: a batch's arrays of about 2 MB each (the sparse table ``log w`` of
them), small against memory and large enough that numpy, not Python, sets the pace."""


class _KnownCuts:
    """The cuts found, as the indices of their maxima ``(pu, qu)`` and their sums: what shrinks a box (module
    note, fact 2). Arrays that grow by doubling, so that shrinking a box is one numpy pass, not a Python loop
    over every cut found (thousands on the adversarial inputs)."""

    def __init__(self) -> None:
        self.size = 0
        self.p, self.q, self.sums = np.zeros(16, dtype=np.intp), np.zeros(16, dtype=np.intp), np.zeros(16)

    def add(self, pu: int, qu: int, total: float) -> None:
        if self.size == len(self.p):
            self.p = np.concatenate((self.p, np.zeros_like(self.p)))
            self.q = np.concatenate((self.q, np.zeros_like(self.q)))
            self.sums = np.concatenate((self.sums, np.zeros_like(self.sums)))
        self.p[self.size], self.q[self.size], self.sums[self.size] = pu, qu, total
        self.size += 1

    def shrink(self, pl: int, ph: int, ql: int, qh: int, total: float) -> tuple[int, int]:
        """The box's top corner once every known cut of sum ``<= total`` has removed what it dominates: ``P >=
        its pu`` where it spans the box's whole ``Q`` side (``qu <= ql``), and likewise ``Q >= qu``."""
        p, q = self.p[: self.size], self.q[: self.size]
        cheaper = self.sums[: self.size] <= total
        ph = min(ph, int(p[cheaper & (q <= ql)].min(initial=ph + 1)) - 1)
        qh = min(qh, int(q[cheaper & (p <= pl)].min(initial=qh + 1)) - 1)
        return ph, qh


def _sweep(problem: _Problem, caps: np.ndarray, g: float, least_sum: float, best_value: float,
           best_cut: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
    """The best cut among the incumbent and those of ``S(P)`` for every cap ``P`` in ``caps`` (sorted) with
    ``g P + least_sum < best_value``: ``S`` of a batch of caps at once (:meth:`_Problem.sums`), then the cut of
    the batch's best cap, which becomes the incumbent and prunes the later batches."""
    rows = max(1, _SWEEP_ELEMENTS // (problem.n + 2))
    for start in range(0, len(caps), rows):
        batch = caps[start : start + rows]
        batch = batch[g * batch + least_sum < best_value]  # sorted: an empty batch ends the sweep
        if len(batch) == 0:
            break
        values = g * batch + problem.sums(batch, 0.0)
        r = int(np.argmin(values))
        if values[r] < best_value:
            total, cut = problem.evaluate(float(batch[r]), 0.0)
            if cut is not None and problem.value(cut, g)[0] < best_value:
                best_value, best_cut = problem.value(cut, g)[0], cut
    return best_value, best_cut


def bottleneck_assignment(
    stage_costs: Sequence[np.ndarray],
    cut_costs: Sequence[np.ndarray],
    num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None,
    sync: SyncCosts | None = None,
) -> Assignment:
    """The boundaries minimising :func:`~hybridplan.search.time.stage_cuts.assignment_objective` (the
    optimum of :func:`~hybridplan.search.time.stage_cuts.amp_layer_assignment`), plus ``sync.seconds`` when
    ``sync`` is given, by branch and bound on the bottleneck values (module note).

    Args: as :func:`~hybridplan.search.time.stage_cuts.amp_layer_assignment`; ``sync``: the data-parallel
    gradient all-reduce per stage (:class:`SyncCosts`), so that the cut minimises the whole predicted
    iteration time of the time model (eq. 4), not only its pipeline term.

    Raises:
        PlanError: for more stages than layers, mismatched vector lengths or negative layer times.

    Example:
        >>> a = bottleneck_assignment([np.array([1., 1., 2.])] * 2, [np.zeros(3)], num_microbatches=4)
        >>> a.boundaries, a.objective     # stages {0, 1} and {2}: 3 * 2 + 4
        ((0, 2, 3), 10.0)
    """
    problem = _Problem(stage_costs, cut_costs, cut_floors, sync)
    if cut_floors is not None:
        _check(stage_costs, cut_floors)
    g = float(num_microbatches - 1) or _SINGLE_MICROBATCH_WEIGHT
    # incumbents: the least sum without caps (its sum bounds every sum), and balanced stages
    least_sum, first = problem.evaluate(np.inf, np.inf)
    if first is None:
        raise PlanError("no cut of the layers into stages has a finite time",
                        fix="check the stage and boundary costs: they must be finite")
    best_cut = first
    best_value = problem.value(best_cut, g)[0]
    balanced = problem.balanced_cut()
    if problem.value(balanced, g)[0] < best_value:
        best_value, best_cut = problem.value(balanced, g)[0], balanced
    # a better cut has g P + Q + S < best with S >= least_sum: only caps in these ranges can matter
    # (the slack covers rounding of the sums, so that the optimum's own maxima stay inside)
    slack = 1e-9 * (abs(best_value) + abs(least_sum))
    p_floor = problem.bottleneck_floor() * (1 - 1e-9)
    p_max = (best_value - least_sum + slack) / g
    q_max = best_value - least_sum - g * p_floor + slack
    ps, qs = problem.candidates((p_floor, p_max), q_max)
    if len(ps) == 0:
        ps = np.array([np.inf])  # unreachable: the incumbent's own bottleneck is in range
    # boxes of candidate indices [pl, ph] x [ql, qh], keyed by a lower bound of every objective inside
    # (the sum of the cut that left the box: a lower bound of every sum inside)
    boxes: list[tuple[float, int, int, int, int, int, float]] = [
        (-np.inf, 0, 0, len(ps) - 1, 0, len(qs) - 1, least_sum)]
    serial = 1
    # dead: (pi, qi) such that no cut fits caps P <= ps[pi] and Q <= qs[qi]
    known = _KnownCuts()

    def learn(cut: tuple[int, ...], total: float) -> tuple[int, int]:
        """Keep a cut found: as the incumbent if it is the best, and (always) for its dominance."""
        nonlocal best_value, best_cut
        value = problem.value(cut, g)[0]
        if value < best_value:
            best_value, best_cut = value, cut
        u, q = problem.maxima(cut)
        pu, qu = int(np.searchsorted(ps, u, side="left")), int(np.searchsorted(qs, q, side="left"))
        known.add(pu, qu, total)
        return pu, qu

    for cut in {best_cut, balanced}:
        learn(cut, problem.value(cut, g)[1])
    seen: dict[tuple[int, int], tuple[float, tuple[int, ...] | None]] = {}

    def least_feasible(count: int, caps: Callable[[int], tuple[int, int]]) -> int:
        """Binary search for the first index whose caps some cut fits (``count`` when none does)."""
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if caps(mid) not in seen:
                seen[caps(mid)] = problem.evaluate(float(ps[caps(mid)[0]]), float(qs[caps(mid)[1]]))
            total, cut = seen[caps(mid)]
            if cut is None:
                lo = mid + 1
            else:
                learn(cut, total)
                hi = mid
        return lo

    # the least feasible bottleneck with any sync, and the least feasible sync with any bottleneck: everything
    # below either is dead, which spares the search one evaluation per box along those edges
    first_p = least_feasible(len(ps), lambda i: (i, len(qs) - 1))
    first_q = least_feasible(len(qs), lambda i: (len(ps) - 1, i))
    dead: list[tuple[int, int]] = [(first_p - 1, len(qs) - 1), (len(ps) - 1, first_q - 1)]
    while boxes:
        if not problem.sync and len(seen) > SWEEP_AFTER:
            # many corners (module note, worst case): every candidate left, in batches, instead of the boxes
            best_value, best_cut = _sweep(problem, ps[first_p:], g, least_sum, best_value, best_cut)
            break
        bound, _, pl, ph, ql, qh, total = heapq.heappop(boxes)
        if bound >= best_value:
            break
        # A known cut of sum S_c <= total (every sum in the box is >= total) beats every cap pair above its own
        # maxima; what earlier evaluations found infeasible lies below a dead corner. Both shrink the box.
        ph, qh = known.shrink(pl, ph, ql, qh, total)
        ql = max([ql] + [qi + 1 for pi, qi in dead if pi >= ph])
        pl = max([pl] + [pi + 1 for pi, qi in dead if qi >= qh])
        if pl > ph or ql > qh or g * float(ps[pl]) + float(qs[ql]) + total >= best_value:
            continue
        if (ph, qh) not in seen:
            seen[ph, qh] = problem.evaluate(float(ps[ph]), float(qs[qh]))
        total, found = seen[ph, qh]
        if found is None:
            # no cut fits the box's largest caps, so none fits any smaller caps
            dead = [(pi, qi) for pi, qi in dead if not (pi <= ph and qi <= qh)] + [(ph, qh)]
            continue
        # what the cut does not dominate: P below its own u, or Q below its own q
        pu, qu = learn(found, total)
        pu, qu = min(pu, ph), min(qu, qh)  # u <= ps[ph] as the caps hold (clamped: progress even so)
        rest = []
        if pu > pl:
            rest.append((pl, pu - 1, ql, qh))
        if qu > ql:
            rest.append((max(pu, pl), ph, ql, qu - 1))
        for a, b, c, d in rest:
            halves = [(a, b, c, d)]
            # halve the side along which the bound varies most (with one micro-batch, g is tiny: Q first)
            if b > a and (d == c or g * float(ps[b] - ps[a]) >= float(qs[d] - qs[c])):
                mid = (a + b) // 2
                halves = [(a, mid, c, d), (mid + 1, b, c, d)]
            elif d > c:
                mid = (c + d) // 2
                halves = [(a, b, c, mid), (a, b, mid + 1, d)]
            for a2, b2, c2, d2 in halves:
                low = g * float(ps[a2]) + float(qs[c2]) + total
                if low < best_value:
                    heapq.heappush(boxes, (low, serial, a2, b2, c2, d2, total))
                    serial += 1
    objective = assignment_objective(best_cut, stage_costs, cut_costs, num_microbatches, cut_floors)
    if sync is not None:
        objective += sync.seconds(best_cut)
    return Assignment(best_cut, objective)


def bottleneck_min_max(
    stage_costs: Sequence[np.ndarray], cut_floors: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray] | None = None
) -> Assignment:
    """The cut of :func:`~hybridplan.search.time.stage_cuts.min_max_assignment` (the least steady-state period
    ``P = max(max_j t_j, max_j floor_j)``, of a pipeline that never flushes; among the cuts reaching it, the least
    ``sum t + sum e``) by the same windows: a binary search for the least candidate ``P`` some cut fits, then
    ``S(P, inf)``. ``objective`` of the result is ``P``.

    Example:
        >>> ones = np.ones(4)
        >>> bottleneck_min_max([ones, ones], [np.array([0.0, 5.0, 0.0])], [np.array([0.0, 0.0, 1.0])]).boundaries
        (0, 1, 4)
    """
    _check(stage_costs, cut_floors)
    problem = _Problem(stage_costs, cut_floors if cut_costs is None else cut_costs, cut_floors, None)
    ps, _ = problem.candidates((0.0, np.inf), 0.0)
    lo, hi = 0, len(ps) - 1  # the largest candidate fits: every stage and floor is at most it
    while lo < hi:
        mid = (lo + hi) // 2
        if problem.evaluate(float(ps[mid]), np.inf)[1] is None:
            lo = mid + 1
        else:
            hi = mid
    _, cut = problem.evaluate(float(ps[lo]), np.inf)
    if cut is None:
        raise PlanError("no cut of the layers into stages has a finite period",
                        fix="check the stage and boundary costs: they must be finite")
    return Assignment(cut, problem.maxima(cut)[0])
