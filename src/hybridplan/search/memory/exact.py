"""A fast exact solver: the same unique best plan as the exhaustive one, by dynamic programming.

A plan, read from its last stage to its first, is a path through states ``(s, j, r)``: the suffix
covers layers ``[s, L)``, ``j`` counts its stages (capped at ``H-1``, the horizon beyond which a stage's
value no longer depends on its position; exact up to ``max_stages`` when that bound is set), and ``r``
is the packing state of its degrees (the devices used, when ``k`` is a power of two; see
:class:`~hybridplan.search.memory.packing.MeshPacking`). Prepending stage ``[s', s)`` with config ``c`` costs
``values[c, j, s', s]`` on ``degree(c)`` devices. Because [Note: leximax order] survives adding the same
devices to both sides, and the canonical order survives prepending the same stages, every state has one
best suffix, and the best plan is made of best suffixes. Three passes over a numpy table:

1. *bottleneck*: ``B[s, j, r]``, the lowest possible peak of a suffix in that state (min-max, vectorised
   over the stage's far end and the packing states); the optimal peak ``T`` is ``min_j B[0, j, full]``;
2. *useful states*: the states on some plan whose every stage is ``<= T`` (top-down from the full
   states), the only ones the optimum can pass through;
3. *leximax*: over useful states only, the best suffix as a run-length key tuple, built from the
   children's keys by one insertion, compared by Python's tuple order; exact ties by canonical order.
   Candidates are first screened, vectorised, by the first few pairs of their keys, so that Python
   builds and compares full keys for a few per state only.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import NamedTuple

import numpy as np

from hybridplan.search.memory.objective import SearchResult, StageMemoryModel, StageTable, build_result, no_allowed_plan
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.memory.configs import StageChoice
from hybridplan.search.memory.space import PlanSpace

__all__ = ["solve_exact"]

State = tuple[int, int, int]

PREFIX = 4
"""(value, count) pairs of a key compared vectorised before the full keys: with 4, about 2% of the
candidates of the 32x8, 200-layer benchmark need a full comparison (1 pair: all, 2: 9%, 8: 1.7%)."""


def solve_exact(model: StageMemoryModel, space: PlanSpace, *, table: StageTable | None = None,
                progress: ProgressCallback | None = None) -> SearchResult:
    """The best plan of the space ([Note: leximax order], then canonical order), by dynamic programming.

    Args:
        model: the stage-memory model.
        space: the plans to search.
        table: precomputed stage values (built from ``model`` when omitted).
        progress: receives a line now and then on a long search, e.g. ``"exact search: pass 3/3 (best
            plan), layer 120/200, 14.0 s"`` (:mod:`~hybridplan.search.progress`); ``None``: silent.

    Returns:
        The best plan; ``visited`` counts the useful states of pass 3.

    Raises:
        PlanError: if every plan contains a stage config the model does not allow.
    """
    started = time.perf_counter()
    report = Progress.of(progress)
    space.mesh_packing(report.within("exact search"))
    table = StageTable.reuse(table, model, space, progress=report.within("exact search"))
    solver = _Solver(space, table, report)
    t0 = time.perf_counter()
    peak = solver.bottleneck()
    t1 = time.perf_counter()
    useful = solver.useful(peak)
    t2 = time.perf_counter()
    choices, candidates = solver.leximax(peak, useful)
    stats = {"table_s": table.seconds, "bottleneck_s": t1 - t0, "useful_s": t2 - t1,
             "leximax_s": time.perf_counter() - t2, "state_space": int(np.prod(useful.shape)),
             "candidates": candidates, "full_compares": solver.survivors}
    return build_result("exact", space, table.value, choices, visited=int(useful.sum()), started=started,
                        now=time.perf_counter(), stats=stats)


class _Solver:
    """The three passes, sharing the table and the position/packing transitions."""

    def __init__(self, space: PlanSpace, table: StageTable, progress: Progress) -> None:
        self.space, self.values, self.progress = space, table.values, progress
        self.L, self.H = space.num_layers, table.horizon
        self.bounded = space.max_stages is not None
        self.P = space.max_num_stages + 1 if self.bounded else self.H
        pk = self.pk = space.packing
        self.accepting = np.nonzero(pk.accepting)[0]
        # Per config: child packing states ``src`` that can take its degree, and the parents ``dst``.
        self.moves = []
        for ci, cfg in enumerate(space.configs):
            col = pk.column(cfg.degree)
            src = np.nonzero(pk.next[:, col] >= 0)[0]
            self.moves.append((ci, cfg.degree, src, pk.next[src, col]))
        # Position transitions: (child j, parent j, the table's position index).
        self.steps = [(j, j + 1 if self.bounded else min(j + 1, self.P - 1), min(j, self.H - 1))
                      for j in range(self.P) if not (self.bounded and j + 1 >= self.P)]
        self.step_parent = np.array([jn for _, jn, _ in self.steps], dtype=np.intp)
        self.step_pos = np.array([pos for _, _, pos in self.steps], dtype=np.intp)
        self.ptr: dict[State, tuple[int, int, int, int]] = {}  # best suffix: state -> (s, config, child j, r)
        self.survivors = 0  # candidates compared by full key in pass 3

    def upper_bound(self) -> float:
        """The lowest peak of the *uniform* plans (one config everywhere, layers split evenly), or inf.

        The optimal peak is at most this, so pass 1 may skip every stage above it: on large meshes that
        leaves a few stage lengths per config instead of all of them.
        """
        L, V, pk, best = self.L, self.values, self.pk, np.inf
        for ci, degree, _, _ in self.moves:
            stages = self.space.num_devices // degree
            if self.space.num_devices % degree or stages > self.space.max_num_stages:
                continue
            state, col = pk.start, pk.column(degree)
            for _ in range(stages):
                state = int(pk.next[state, col]) if state >= 0 else -1
            if state < 0 or not pk.accepting[state]:
                continue
            cuts = [L * i // stages for i in range(stages + 1)]
            peak = max(V[ci, min(stages - 1 - i, self.H - 1), cuts[i], cuts[i + 1]] for i in range(stages))
            best = min(best, float(peak))
        return best

    def bottleneck(self) -> float:
        """Pass 1: fill ``self.B`` (stages above :meth:`upper_bound` skipped) and return the optimal peak."""
        L, V = self.L, self.values
        bound = self.upper_bound()
        B = self.B = np.full((L + 1, self.P, self.pk.num_states), np.inf)
        B[L, 0, self.pk.start] = -np.inf
        for sp in range(L - 1, -1, -1):
            if self.progress.due():
                self.progress.update(f"exact search: pass 1/3 (lowest peak), layer {L - sp}/{L}")
            for ci, _, src, dst in self.moves:
                if src.size == 0:
                    continue
                # A power-of-two mesh moves every state up by the degree: slices, not gathers.
                contiguous = src[-1] - src[0] + 1 == src.size and dst[-1] - dst[0] + 1 == dst.size
                spans = V[ci, :, sp, sp + 1:]  # every position's stages from sp, compared once
                allowed: np.ndarray = np.less_equal(spans, bound) if bound < np.inf else np.less(spans, np.inf)
                some = np.asarray(allowed.any(axis=1))
                for step in np.nonzero(some[self.step_pos])[0].tolist():  # the steps with a stage to take
                    j, jn, pos = self.steps[step]
                    vals = spans[pos]
                    rows = np.nonzero(allowed[pos])[0]
                    if contiguous:
                        child = B[sp + 1 + rows, j, src[0]:src[-1] + 1]
                        cand = np.maximum(vals[rows, None], child).min(axis=0)
                        target = B[sp, jn, dst[0]:dst[-1] + 1]
                        np.minimum(target, cand, out=target)
                    else:
                        child = B[sp + 1 + rows[:, None], j, src[None, :]]
                        cand = np.maximum(vals[rows, None], child).min(axis=0)
                        B[sp, jn, dst] = np.minimum(B[sp, jn, dst], cand)
        peak = float(B[0][:, self.accepting].min())
        if peak == np.inf:
            raise no_allowed_plan(self.space)
        return peak

    def useful(self, peak: float) -> np.ndarray:
        """Pass 2: states on some plan with every stage ``<= peak``, top-down from the full mesh."""
        L, V, B = self.L, self.values, self.B
        U = np.zeros(B.shape, dtype=bool)
        U[0][:, self.accepting] = B[0][:, self.accepting] <= peak
        for sp in range(L):
            if self.progress.due():
                self.progress.update(f"exact search: pass 2/3 (useful states), layer {sp + 1}/{L}")
            for ci, _, src, dst in self.moves:
                live = U[sp][:, dst].any(axis=1)  # per position: U[sp] is final here (the loop writes layers after sp)
                if not live.any():
                    continue
                for j, jn, pos in self.steps:
                    if not live[jn]:
                        continue
                    parent = U[sp, jn, dst]
                    rows = np.nonzero(V[ci, pos, sp, sp + 1:] <= peak)[0]
                    if rows.size == 0:
                        continue
                    idx = (sp + 1 + rows[:, None], j, src[parent][None, :])
                    U[idx] |= B[idx] <= peak
        return U

    def leximax(self, peak: float, U: np.ndarray) -> tuple[tuple[StageChoice, ...], int]:
        """Pass 3: the best suffix of every useful state; returns the best plan and the candidates tried.

        A state ``(s, j, r)`` is stored under layer ``s`` as ``j * R + r`` with its key and the negated
        values of the key in ascending order (to find by bisection where a new value goes). Each layer's
        candidates are first ranked by the first ``PREFIX`` pairs of their keys, vectorised
        (:class:`_Prefixes`); only those tied with the best prefix of their target get their full key
        built and compared in Python, typically one or two per state.
        """
        L, V, pk, R = self.L, self.values, self.pk, self.pk.num_states
        store: list[dict[int, tuple[tuple, tuple]]] = [{} for _ in range(L + 1)]
        store[L][pk.start] = ((), ())
        # Keys of states at layer s are needed down to the lowest first layer of a stage ending at s.
        reach = np.asarray((V <= peak).any(axis=(0, 1)))
        release: dict[int, list[int]] = {}
        span = 1
        for s in range(1, L + 1):
            if reach[:, s].any():
                low = int(np.argmax(reach[:, s]))
                release.setdefault(low, []).append(s)
                span = max(span, s - low)
        prefixes = _Prefixes(span + 1, self.P * R)
        candidates = 0
        for sp in range(L - 1, -1, -1):
            if self.progress.due():
                self.progress.update(f"exact search: pass 3/3 (best plan), layer {L - sp}/{L}")
            cand = self._layer_candidates(sp, U, peak)
            if cand is not None:
                candidates += cand.end.size
                nv, nc, complete = prefixes.insert(cand, R)
                tied = _lowest([nv[:, k // 2] if k % 2 == 0 else nc[:, k // 2] for k in range(2 * PREFIX)],
                               cand.target, prefixes.states)
                # Targets whose tied keys fit in the prefix have equal keys: only the canonically first
                # stage (s, config) can win there; ties on it (child positions) go to the full comparison.
                partial = np.zeros(prefixes.states, dtype=bool)
                partial[cand.target[tied & ~complete]] = True
                exact = tied & partial[cand.target]
                first = _lowest([cand.end, cand.config], cand.target, prefixes.states, tied & ~exact)
                chosen = np.nonzero(exact | first)[0]
                self.survivors += chosen.size
                best = self._full_compare(cand, chosen, store, R)
                prefixes.clear(sp)
                for t, (key, s, ci, j, r, i, merged, v, row) in best.items():
                    self.ptr[(sp, t // R, t % R)] = (s, ci, j, r)
                    cn = store[s][j * R + r][1]
                    store[sp][t] = (key, cn if merged else cn[:i] + (-v,) + cn[i:])
                    prefixes.put(sp, t, nv[row], nc[row], len(key) // 2)
            for s in release.get(sp, ()):
                store[s] = {}
        tops = [(0, j, int(r)) for j in range(self.P) for r in self.accepting if j * R + int(r) in store[0]]
        top = tops[0]
        for other in tops[1:]:
            a, b = store[0][other[1] * R + other[2]][0], store[0][top[1] * R + top[2]][0]
            if a < b or (a == b and self._chain(other) < self._chain(top)):
                top = other
        return self._choices(top), candidates

    def _layer_candidates(self, sp: int, U: np.ndarray, peak: float) -> _Candidates | None:
        """Every stage ``[sp, s)`` and config from a useful child to a useful parent, as arrays."""
        R, V = self.pk.num_states, self.values
        blocks = []
        for ci, degree, src, dst in self.moves:
            parents = U[sp][:, dst]  # every position's useful parents, asked once
            spans = V[ci, :, sp, sp + 1:]
            fits: np.ndarray = np.less_equal(spans, peak)
            live = np.asarray(parents.any(axis=1))[self.step_parent] & np.asarray(fits.any(axis=1))[self.step_pos]
            for step in np.nonzero(live)[0].tolist():
                j, jn, pos = self.steps[step]
                parent = parents[jn]
                vals = spans[pos]
                rows = np.nonzero(fits[pos])[0]
                srcs, dsts = src[parent], dst[parent]
                hit_rows, hit_cols = np.nonzero(U[sp + 1 + rows[:, None], j, srcs[None, :]])
                if hit_rows.size:
                    n = hit_rows.size
                    blocks.append((rows[hit_rows] + sp + 1, vals[rows[hit_rows]], np.full(n, degree),
                                   np.full(n, ci), np.full(n, j), srcs[hit_cols], dsts[hit_cols] + jn * R))
        if not blocks:
            return None
        return _Candidates(*(np.concatenate(part) for part in zip(*blocks)))

    def _full_compare(self, cand: _Candidates, chosen: np.ndarray, store: list[dict[int, tuple[tuple, tuple]]],
                      R: int) -> dict[int, tuple]:
        """The best of the chosen candidates per target by full key, then canonical order.

        Returns per target ``(key, s, config, child j, child r, insert position, merged, value, row)``.
        """
        best: dict[int, tuple] = {}
        for s, v, degree, ci, j, r, t, row in zip(
            cand.end[chosen].tolist(), cand.value[chosen].tolist(), cand.degree[chosen].tolist(),
            cand.config[chosen].tolist(), cand.child_j[chosen].tolist(), cand.child_r[chosen].tolist(),
            cand.target[chosen].tolist(), chosen.tolist(),
        ):
            ck, cn = store[s][j * R + r]
            i = bisect_left(cn, -v)
            merged = i < len(cn) and cn[i] == -v
            if merged:
                key = ck[: 2 * i] + (v, ck[2 * i + 1] + degree) + ck[2 * i + 2:]
            else:
                key = ck[: 2 * i] + (v, degree) + ck[2 * i:]
            cur = best.get(t)
            if cur is None or key < cur[0] or (key == cur[0] and self._earlier((s, ci, j, r), cur[1:5])):
                best[t] = (key, s, ci, j, r, i, merged, v, row)
        return best

    def _earlier(self, candidate: tuple[int, int, int, int], incumbent: tuple[int, int, int, int]) -> bool:
        """Canonical order of two suffixes ``(s, config, child j, child r)`` of one state with equal keys:
        by the first stage ``(s, config)``, then by the children's suffixes."""
        s, ci, j, r = candidate
        s2, ci2, j2, r2 = incumbent
        if (s, ci) != (s2, ci2):
            return (s, ci) < (s2, ci2)
        return self._chain((s, j, r)) < self._chain((s2, j2, r2))

    def _chain(self, state: State) -> list[tuple[int, int]]:
        """The canonical key (per stage: stop, config) of a state's best suffix."""
        out = []
        while state[0] < self.L:
            s, ci, j, r = self.ptr[state]
            out.append((s, ci))
            state = (s, j, r)
        return out

    def _choices(self, state: State) -> tuple[StageChoice, ...]:
        out = []
        while state[0] < self.L:
            s, ci, j, r = self.ptr[state]
            out.append(StageChoice(state[0], s, ci))
            state = (s, j, r)
        return tuple(out)


class _Candidates(NamedTuple):
    """The candidate stages of one layer ``sp``, one entry each: ``[sp, end)`` with ``config`` from the
    child state ``(end, child_j, child_r)`` to the parent state ``(sp, target // R, target % R)``."""

    end: np.ndarray
    value: np.ndarray
    degree: np.ndarray
    config: np.ndarray
    child_j: np.ndarray
    child_r: np.ndarray
    target: np.ndarray


class _Prefixes:
    """The first ``PREFIX`` (value, count) pairs of the best key of every state, for the live layers.

    A ring buffer over layers (layer ``s`` in slot ``s % width``, ``width`` exceeding the longest useful
    stage). Unused pairs are ``(-inf, 0)``; they never decide a comparison between the keys of plans on
    equally many devices (equal leading pairs imply equal device counts so far).
    """

    def __init__(self, width: int, states: int) -> None:
        self.width, self.states = width, states
        self.values = np.full((width * states, PREFIX), -np.inf)
        self.counts = np.zeros((width * states, PREFIX), dtype=np.int64)
        self.pairs = np.zeros(width * states, dtype=np.int64)

    def insert(self, cand: _Candidates, R: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each candidate's prefix (its child's with ``(value, degree)`` inserted), and whether its whole
        key fits in the prefix."""
        K, n = PREFIX, cand.end.size
        flat = (cand.end % self.width) * self.states + cand.child_j * R + cand.child_r
        cv, cc = self.values.take(flat, axis=0), self.counts.take(flat, axis=0)
        v = cand.value
        at = (cv > v[:, None]).sum(axis=1)
        at_k = np.minimum(at, K - 1)
        merged = (at < K) & (cv[np.arange(n), at_k] == v)
        cols = np.arange(K)[None, :]
        here, keep = cols == at[:, None], merged[:, None] | (cols < at[:, None])
        shifted_v = np.concatenate([np.full((n, 1), -np.inf), cv[:, :-1]], axis=1)
        shifted_c = np.concatenate([np.zeros((n, 1), dtype=np.int64), cc[:, :-1]], axis=1)
        nv = np.where(here, v[:, None], np.where(keep, cv, shifted_v))
        added = np.where(merged, cc[np.arange(n), at_k], 0) + cand.degree
        nc = np.where(here, added[:, None], np.where(keep, cc, shifted_c))
        return nv, nc, self.pairs.take(flat) + ~merged <= K

    def clear(self, layer: int) -> None:
        """Empty the slot that ``layer`` takes over from an earlier, no longer needed layer."""
        part = slice((layer % self.width) * self.states, (layer % self.width + 1) * self.states)
        self.values[part], self.counts[part], self.pairs[part] = -np.inf, 0, 0

    def put(self, layer: int, state: int, values: np.ndarray, counts: np.ndarray, pairs: int) -> None:
        """Record the prefix and pair count of a state's best key."""
        at = (layer % self.width) * self.states + state
        self.values[at], self.counts[at], self.pairs[at] = values, counts, pairs


def _lowest(columns: list[np.ndarray], groups: np.ndarray, num_groups: int,
            mask: np.ndarray | None = None) -> np.ndarray:
    """The entries (within ``mask``) lexicographically lowest in ``columns`` among their group."""
    keep = np.ones(groups.size, dtype=bool) if mask is None else mask.copy()
    for col in columns:
        high = np.inf if col.dtype.kind == "f" else np.iinfo(col.dtype).max
        masked = np.where(keep, col, high)
        low = np.full(num_groups, high, dtype=col.dtype)
        np.minimum.at(low, groups, masked)
        keep &= masked == low[groups]
    return keep
