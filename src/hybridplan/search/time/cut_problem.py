"""One stage-cut problem and ``S(P, Q)``: the least ``sum (t + e)`` over the cuts whose every stage time (or
boundary floor) is at most ``P`` and whose every stage's gradient sync is at most ``Q``, as a shortest path over
(stage, layer) whose allowed starts form windows ([Note: bottleneck search] in search/time/bottleneck_cuts.py,
fact 1; its cost: [Note: bottleneck search cost] there), optionally within each stage's memory windows ([Note:
cutting within memory] there). The search over the caps is in :mod:`~hybridplan.search.time.bottleneck_cuts`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.search.time.stage_cuts import _check
from hybridplan.search.time.sync_costs import SyncCosts
from hybridplan.search.time.window_minima import _WindowMinima

__all__: list[str] = []


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
                 cut_floors: Sequence[np.ndarray] | None, sync: SyncCosts | None,
                 starts: Sequence[np.ndarray] | None = None) -> None:
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
        # sync: stages of equal (factor, latency) share one matrix of seconds; each is non-negative and grows with
        # the range (bytes and tensors both do), which is all the windows need ([Note: bottleneck search], fact 1)
        self.sync_kind: list[int] = []
        self.sync: list[np.ndarray] = []
        if sync is not None and any(f > 0 or lat > 0 for f, lat in sync.kinds):
            shapes = {sync.range_bytes.shape} | ({sync.range_tensors.shape} if sync.range_tensors is not None
                                                 else set())
            if (len(sync.factors) != self.k or shapes != {(n + 1, n + 1)}
                    or (sync.latencies is not None and len(sync.latencies) != self.k)):
                raise PlanError(f"sync costs need {self.k} factors (and latencies) and {n + 1} x {n + 1} range"
                                " matrices")
            if min(min(sync.factors), min(sync.latencies or (0.0,))) < 0:
                raise PlanError("sync factors and latencies must be non-negative")
            fkeys: dict[tuple[float, float], int] = {}
            for kind in sync.kinds:
                if kind not in fkeys:
                    fkeys[kind] = len(self.sync)
                    self.sync.append(sync.matrix(*kind) + below)
                self.sync_kind.append(fkeys[kind])
        self.upper = below == 0
        self._remembered: dict[tuple[str, int, float], np.ndarray] = {}  # window starts per single cap
        self.link_base: dict[tuple[int, int], np.ndarray] = {}  # e_j(a) - p_j(a) per (cost vector, link kind)
        self.floor_max = [float(fl.max(initial=-np.inf)) for fl in self.floors]  # below every cap: no mask needed
        self.ends = np.arange(n + 1)
        self.steps = max(1, int(np.ceil(np.log2(n + 1))))
        # memory windows ([Note: cutting within memory]): stage j may hold [a, i) only if a >= starts[j][i] (i:
        # none), identical ones shared
        self.mem_kind: list[int] = [0] * self.k
        self.mem: list[np.ndarray] = []
        if starts is not None:
            if len(starts) != self.k or any(np.shape(s) != (n + 1,) for s in starts):
                raise PlanError(f"memory windows need {self.k} arrays of {n + 1} starts")
            mkeys: dict[bytes, int] = {}
            for j, s in enumerate(starts):
                s = np.minimum(np.asarray(s, dtype=np.intp), self.ends)
                self.mem_kind[j] = mkeys.setdefault(s.tobytes(), len(self.mem))
                if self.mem_kind[j] == len(self.mem):
                    self.mem.append(s)

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

    def value(self, cut: tuple[int, ...], pipeline: Callable[[float, float], np.ndarray]) -> tuple[float, float]:
        """The objective ``pipeline(max u, sum (t + e)) + max sync`` of a cut, and its sum."""
        total = sum(float(self.prefix[self.kind[j]][cut[j + 1]] - self.prefix[self.kind[j]][cut[j]]) for j in range(self.k))
        total += sum(float(self.cuts[j - 1][cut[j] - 1]) for j in range(1, self.k))
        u, q = self.maxima(cut)
        return float(pipeline(u, total)) + q, total

    def balanced_cut(self) -> tuple[int, ...]:
        """Stages of about equal time on the first stage's costs: a first incumbent for the search."""
        p = self.prefix[self.kind[0]]
        cut = [0] + [int(np.searchsorted(p, p[-1] * j / self.k)) for j in range(1, self.k)] + [self.n]
        for j in range(1, self.k):  # non-empty stages
            cut[j] = max(cut[j], cut[j - 1] + 1)
        for j in range(self.k - 1, 0, -1):
            cut[j] = min(cut[j], cut[j + 1] - 1)
        return tuple(cut)

    def fits(self, cut: tuple[int, ...]) -> bool:
        """Whether every stage of the cut starts inside its memory window (always without windows)."""
        return all(cut[j] >= self.mem[self.mem_kind[j]][cut[j + 1]] for j in range(self.k)) if self.mem else True

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
        windows: dict[tuple[int, int, int], tuple[np.ndarray, _WindowMinima, np.ndarray]] = {}
        links: dict[tuple[int, int], np.ndarray] = {}
        least_cap = float(caps_p.min())

        def window(j: int) -> tuple[np.ndarray, _WindowMinima, np.ndarray]:
            """Starts ``lo`` (window ``[lo[r, i], i - 1]``), the window minima, and ``p_j`` with inf at the ends
            whose window is empty."""
            key = (self.kind[j], self.sync_kind[j] if self.sync else 0, self.mem_kind[j])
            if key not in windows:
                lo = np.maximum(lo_p[key[0]], lo_q[key[1]]) if self.sync else lo_p[key[0]]
                lo = np.maximum(lo, np.maximum(self.mem[key[2]], 1) if self.mem else 1)
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
        first = np.maximum(lo_p[self.kind[0]], lo_q[self.sync_kind[0]] if self.sync else 0)
        if self.mem:
            first = np.maximum(first, self.mem[self.mem_kind[0]])
        f = np.where(first == 0, p0, np.inf)
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
