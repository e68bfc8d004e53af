"""Plans drawn uniformly at random from a plan space, for measuring prediction error over many plans.

CAPTURE (seed 001, IV-B) scores its predictor on 500 plans "randomly sampled from the set of possible plans
that the recommender generates", leaving out plans predicted to run out of memory and pruned options. A
4x4 mesh and 18 layers hold far too many plans to enumerate, so :func:`sample_plans` draws from the
space without listing it: it counts, for every point of the search (layers left to cover, mesh packing
state, stages already placed), how many complete plans continue from there (the recurrence of
:func:`~hybridplan.search.memory.space.count_plans`, restricted by ``keep``), then walks from the last stage to the
first choosing each stage with probability proportional to the plans it leads to. Every plan that ``keep``
admits is then equally likely.

A ``keep`` that looks at the stage alone (a :class:`StageFilter`, such as "predicted to fit") is asked once per
stage, and the plans are counted per (layers left, packing state) with whole columns of the mesh's packing states at
once: on Llama-3-70B's 82 layers and 32x8 (216 stage configs, 257 packing states) the counts take seconds, where
asking ``keep`` again for every stage count had not finished in 16 minutes. The draws are the same either way.

``exhaustive=True`` instead lists every admitted plan (in :func:`~hybridplan.search.memory.space.enumerate_plans`'s
order), shuffles the list and keeps the first ``count``: the same distribution, other plans for a given seed,
and the cost of listing the space. It is how ``benchmarks/capture_accuracy`` drew the plans its results
record, so that a rerun draws the same ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hybridplan.errors import PlanError, UsageError
from hybridplan.search.memory.configs import StageChoice
from hybridplan.search.memory.space import PlanSpace

__all__ = ["StageFilter", "count_kept_plans", "sample_plans"]

Keep = Callable[[StageChoice, int], bool]
"""``keep(choice, stages_after)``: whether a stage may appear with ``stages_after`` stages behind it."""
KeepPlan = Callable[[tuple[StageChoice, ...]], bool]
"""``keep_plan(plan)``: whether a whole plan (its stage choices in pipeline order) may be drawn."""


@dataclass(frozen=True)
class StageFilter:
    """A ``keep`` that depends on the stage alone, not on how many stages follow it.

    Why a type of its own: the sampler may then ask it once per stage and count plans without the stages placed,
    which is what makes a deep model on a large mesh countable (the module's docstring).

    Example:
        >>> space, short = PlanSpace(7, 2, 2), StageFilter(lambda c: c.stop - c.start <= 2)
        >>> count_kept_plans(space, short) == count_kept_plans(space, lambda c, after: short(c, after))
        True
    """

    admits: Callable[[StageChoice], bool]

    def __call__(self, choice: StageChoice, after: int) -> bool:
        return bool(self.admits(choice))


class _Counter:
    """Plans completing a partial plan, memoised on (layers left, packing state, stages placed)."""

    def __init__(self, space: PlanSpace, keep: Keep | None) -> None:
        self.space = space
        self.keep = keep
        pk = space.packing
        self.cols = [pk.column(c.degree) for c in space.configs]
        self.count = lru_cache(maxsize=None)(self._count)

    def options(self, stop: int, state: int, placed: int) -> list[tuple[StageChoice, int]]:
        """The stages that may end at ``stop`` next, with the packing state each leads to."""
        pk = self.space.packing
        out: list[tuple[StageChoice, int]] = []
        if placed + 1 > self.space.max_num_stages:
            return out
        for start in range(stop - 1, -1, -1):
            for ci, col in enumerate(self.cols):
                nxt = int(pk.next[state, col])
                if nxt < 0:
                    continue
                choice = StageChoice(start, stop, ci)
                if self.keep is None or self.keep(choice, placed):
                    out.append((choice, nxt))
        return out

    def _count(self, stop: int, state: int, placed: int) -> int:
        if stop == 0:
            return int(bool(self.space.packing.accepting[state]))
        return sum(self.count(c.start, nxt, placed + 1) for c, nxt in self.options(stop, state, placed))


class _StageCounter:
    """:class:`_Counter`'s answers for a keep that ignores the stages placed (none, or a :class:`StageFilter`).

    ``count(stop, state, placed)`` does not depend on ``placed`` then (a stage takes a layer and a device, so the
    packing bounds the stages as :attr:`PlanSpace.max_num_stages` does), and every (stop, state) is counted bottom
    up: the plans ending at ``stop`` from ``state`` are, summed over the stage's start and the packing column of its
    config, the admitted configs of that column times the plans covering ``[0, start)`` from the state it leads to.
    """

    def __init__(self, space: PlanSpace, keep: StageFilter | None) -> None:
        self.space = space
        pk = space.packing
        self.cols = [pk.column(c.degree) for c in space.configs]
        L, C = space.num_layers, len(space.configs)
        self.admitted = np.ones((L, L + 1, C), dtype=bool)
        if keep is not None:
            for start in range(L):
                for stop in range(start + 1, L + 1):
                    for ci in range(C):
                        self.admitted[start, stop, ci] = keep.admits(StageChoice(start, stop, ci))
        per_column = np.zeros((L, L + 1, pk.next.shape[1]), dtype=np.int64)
        for ci, col in enumerate(self.cols):
            per_column[:, :, col] += self.admitted[:, :, ci]
        counts = np.zeros((L + 1, pk.next.shape[0]), dtype=object)  # Python integers: the counts pass 2**63
        counts[0] = [int(a) for a in pk.accepting]
        for stop in range(1, L + 1):
            row = np.zeros(pk.next.shape[0], dtype=object)
            for col in range(pk.next.shape[1]):
                nxt = pk.next[:, col]
                live = nxt >= 0
                for start in range(stop):
                    n = int(per_column[start, stop, col])
                    if n:
                        row[live] += n * counts[start][nxt[live]]
            counts[stop] = row
        self.counts = counts

    def options(self, stop: int, state: int, placed: int) -> list[tuple[StageChoice, int]]:
        """As :meth:`_Counter.options`, in its order."""
        pk = self.space.packing
        out: list[tuple[StageChoice, int]] = []
        for start in range(stop - 1, -1, -1):
            for ci in np.nonzero(self.admitted[start, stop])[0]:
                nxt = int(pk.next[state, self.cols[ci]])
                if nxt >= 0:
                    out.append((StageChoice(start, stop, int(ci)), nxt))
        return out

    def count(self, stop: int, state: int, placed: int) -> int:
        return int(self.counts[stop][state])


def _counter(space: PlanSpace, keep: Keep | None) -> _Counter | _StageCounter:
    if (keep is None or isinstance(keep, StageFilter)) and space.max_stages is None:
        return _StageCounter(space, keep)
    return _Counter(space, keep)


def count_kept_plans(space: PlanSpace, keep: Keep | None = None) -> int:
    """How many plans of ``space`` have every stage admitted by ``keep`` (all plans without it).

    Example:
        >>> count_kept_plans(PlanSpace(30, 1, 4, pipeline_only=True))   # mCAP's VGG11: C(29, 3)
        3654
    """
    return _counter(space, keep).count(space.num_layers, space.packing.start, 0)


def sample_plans(space: PlanSpace, count: int, *, seed: int = 0, keep: Keep | None = None,
                 keep_plan: KeepPlan | None = None, exhaustive: bool = False) -> list[tuple[StageChoice, ...]]:
    """``count`` distinct plans drawn uniformly from the plans ``keep`` and ``keep_plan`` admit (all of them, in
    random order, if there are no more than ``count``).

    Args:
        space: the plan space.
        count: how many plans.
        seed: of the random draws (same seed, same plans).
        keep: ``keep(choice, stages_after)``, e.g. "predicted to fit in device memory".
        keep_plan: ``keep_plan(plan)``, a condition on the whole plan that no stage decides alone, e.g. "some
            stage is data- or tensor-parallel". Drawn plans it refuses are set aside and the draws go on,
            so it should admit a fair share of the plans ``keep`` admits (``exhaustive=True`` filters the
            list instead).
        exhaustive: list every admitted plan in enumeration order, shuffle the list with ``seed`` and keep
            the first ``count`` (same distribution, other plans than the default draws; costs the whole
            enumeration, so for small spaces).

    Raises:
        UsageError: for a negative count.
        PlanError: if ``keep`` (or ``keep_plan``) admits no plan at all.

    Example:
        >>> plans = sample_plans(PlanSpace(6, 1, 4), 5, seed=1)
        >>> len(plans), len(set(plans)), all(p[0].start == 0 and p[-1].stop == 6 for p in plans)
        (5, 5, True)
        >>> hybrid = lambda plan: len(plan) < 4   # on 1x4, fewer than 4 stages: one is data or tensor
        >>> len(sample_plans(PlanSpace(6, 1, 4), 5, seed=1, keep_plan=hybrid, exhaustive=True))
        5
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UsageError(f"count must be a non-negative integer, got {count!r}")
    counter = _counter(space, keep)
    root = (space.num_layers, space.packing.start, 0)
    total = counter.count(*root)
    if total == 0:
        raise PlanError(f"no plan of {space.num_layers} layers on a {space.num_nodes}x{space.devices_per_node} mesh"
                        " has every stage admitted", fix="relax the filter (e.g. a larger device memory)")
    rng = random.Random(seed)
    if exhaustive or total <= count:
        plans = [p for p in _all_plans(counter, root) if keep_plan is None or keep_plan(p)]
        if not plans:
            raise _no_plan_kept(space)
        rng.shuffle(plans)
        return plans[:count]
    seen: set[tuple[StageChoice, ...]] = set()
    out: list[tuple[StageChoice, ...]] = []
    while len(out) < count and len(seen) < total:
        plan = _draw(counter, root, rng)
        if plan not in seen:
            seen.add(plan)
            if keep_plan is None or keep_plan(plan):
                out.append(plan)
    if not out:
        raise _no_plan_kept(space)
    return out


def _no_plan_kept(space: PlanSpace) -> PlanError:
    return PlanError(f"no plan of {space.num_layers} layers on a {space.num_nodes}x{space.devices_per_node} mesh"
                     " is admitted by keep_plan", fix="relax the plan filter")


def _draw(counter: _Counter | _StageCounter, root: tuple[int, int, int], rng: random.Random) -> tuple[StageChoice, ...]:
    stop, state, placed = root
    suffix: list[StageChoice] = []
    while stop > 0:
        options = [(c, nxt, counter.count(c.start, nxt, placed + 1)) for c, nxt in counter.options(stop, state, placed)]
        pick = rng.randrange(sum(w for _, _, w in options))
        for choice, nxt, weight in options:
            if pick < weight:
                break
            pick -= weight
        suffix.append(choice)
        stop, state, placed = choice.start, nxt, placed + 1
    return tuple(reversed(suffix))


def _all_plans(counter: _Counter | _StageCounter, root: tuple[int, int, int]) -> list[tuple[StageChoice, ...]]:
    """Every plan the counter admits, in :func:`~hybridplan.search.memory.space.enumerate_plans`'s order."""
    out: list[tuple[StageChoice, ...]] = []

    def walk(stop: int, state: int, placed: int, suffix: list[StageChoice]) -> None:
        if stop == 0:
            out.append(tuple(reversed(suffix)))
            return
        for choice, nxt in counter.options(stop, state, placed):
            if counter.count(choice.start, nxt, placed + 1):
                walk(choice.start, nxt, placed + 1, suffix + [choice])

    walk(*root, [])
    return out
