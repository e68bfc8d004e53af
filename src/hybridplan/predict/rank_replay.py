"""A ZeRO stage's ranks as rows of quantities: made once per span, replayed at every pipeline position.

[Note: a ZeRO stage's rows are the same at every position] A ZeRO stage's prediction (predict/zero_stage.py,
predict/composed_zero.py) is each rank's quantity vector, its ``static``, gradient and step moved to the rank's
shards and its transients set by the ZeRO rules, then replayed through the stage's actions. Everything before the
replay depends on the span, the config and the parameter shapes, not on how many stages follow; the replay is a
product with the schedule's coefficient rows for that position (profiling/schedule_memory.py ``peak_terms``;
ZeRO-2's ``zero2_terms``, whose rows carry five more columns: predict/zero2_replay.py). So a :class:`RankReplay`
holds each distinct rank's row once and each rank's index into them, and a search asking a span at each of its
positions (64 for Llama-3-70B on 32x8) pays for the rules once. The one exception is a composed ZeRO-3 stage's
first backward after two forwards or more ([Note: a first backward after several forwards] in
predict/zero3_transients.py), which holds only away from the pipeline's last position: its rows are made for
``several`` or not (:func:`several_forwards`).

A stage the profile predicts by its peak statistic alone (CAPTURE's method, a fitted degree) has no rows: its
ranks are that stage's peak at the position plus each rank's static shift (``base`` and ``offsets``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hybridplan.predict.batch_scaling import PEAK
from hybridplan.predict.zero2_replay import zero2_values
from hybridplan.profiling.schedule_memory import peak_terms

__all__ = ["RankReplay", "forwards_first", "several_forwards"]


def several_forwards(schedule: str, stages_after: int, num_microbatches: int) -> bool:
    """Whether a stage's first backward follows two forwards or more: GPipe's always (with two micro-batches or
    more), 1F1B's away from the pipeline's last stage."""
    forwards = num_microbatches if schedule == "gpipe" else min(num_microbatches, stages_after + 1)
    return forwards >= 2


def forwards_first(schedule: str, stages_after: int, num_microbatches: int) -> bool:
    """Whether a 1F1B-like stage runs every forward before its first backward, as a GPipe stage does.

    [Note: a 1F1B stage that runs every forward first] A 1F1B stage with ``num_microbatches - 1`` stages or more
    after it warms up with every micro-batch's forward: its actions are GPipe's, F..F B..B, and no later backward
    follows a forward. A ZeRO-3 backward after a forward holds the layer FSDP2 prefetched, one after a backward does
    not ([Note: a backward after a backward] in predict/zero3_transients.py), so the rules that take the profile's
    later backward off by that layer under GPipe hold there too: such a stage is predicted as under GPipe
    (predict/zero_stage.py ``zero_peaks``, predict/span_tables.py). Before, Llama-2-7B's layers [4, 7) as data x2
    ZeRO-3 recomputed with 10 stages after it in 8 micro-batches were predicted with the prefetched layer in every
    later backward, 404,766,720 bytes above the simulated device's (benchmarks/instant_planning).

    >>> forwards_first("1f1b", 7, 8), forwards_first("1f1b", 6, 8), forwards_first("gpipe", 0, 8)
    (True, False, False)
    """
    return schedule == "1f1b" and stages_after + 1 >= num_microbatches


def _distinct(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct row once (in first-seen order) and every input row's index among them: a stage's ranks
    mostly hold equal shares, and each distinct one is replayed once."""
    index: dict[bytes, int] = {}
    which = [index.setdefault(np.asarray(r, dtype=float).tobytes(), len(index)) for r in rows]
    first = {i: r for r, i in zip(rows, which)}
    width = len(rows[0]) if rows else 0
    kept = np.array([np.asarray(first[i], dtype=float) for i in range(len(index))]).reshape(len(index), width)
    return kept, np.array(which, dtype=np.intp)


@dataclass(frozen=True, eq=False)
class RankReplay:
    """What each rank of one ZeRO stage replays, whatever the position (module Note).

    ``plain`` rows (``PEAK`` wide) replay by ``peak_terms``, ``zero2`` rows (``PEAK + 5``) by ``zero2_terms``; a
    rank's peak is the larger of its two rows' where it has both (a composed ZeRO-2 stage at least its ZeRO-3
    composition). Either kind covers every rank or none.
    """

    ranks: int
    plain: np.ndarray
    plain_rank: np.ndarray
    zero2: np.ndarray
    zero2_rank: np.ndarray
    base: Callable[[int], float] | None = None
    """A stage without rows: its peak at a position (``stages_after``); each rank adds its ``offsets``."""
    offsets: tuple[float, ...] = ()

    @classmethod
    def of(cls, *, plain: Sequence[np.ndarray] = (), zero2: Sequence[np.ndarray] = ()) -> RankReplay:
        """The replay of each rank's ``plain`` row and/or ``zero2`` row (one per rank, in rank order)."""
        if plain and zero2 and len(plain) != len(zero2):
            raise ValueError(f"{len(plain)} plain rows and {len(zero2)} ZeRO-2 rows: one each per rank")
        p, pr = _distinct(plain) if plain else (np.empty((0, PEAK)), np.empty(0, dtype=np.intp))
        z, zr = _distinct(zero2) if zero2 else (np.empty((0, PEAK + 5)), np.empty(0, dtype=np.intp))
        return cls(max(len(plain), len(zero2)), p, pr, z, zr)

    @classmethod
    def positional(cls, base: Callable[[int], float], offsets: Sequence[float]) -> RankReplay:
        """Ranks at ``base(stages_after)`` plus each rank's offset (a stage predicted by its peak alone)."""
        return cls(len(offsets), np.empty((0, PEAK)), np.empty(0, dtype=np.intp), np.empty((0, PEAK + 5)),
                   np.empty(0, dtype=np.intp), base=base, offsets=tuple(offsets))

    def with_plain(self, other: RankReplay) -> RankReplay:
        """These ZeRO-2 rows with ``other``'s plain rows: each rank at the larger of both."""
        if self.plain.size or other.zero2.size or other.base is not None or self.ranks != other.ranks:
            raise ValueError("only ZeRO-2 rows and plain rows of as many ranks combine")
        return RankReplay(self.ranks, other.plain, other.plain_rank, self.zero2, self.zero2_rank)

    def peaks(self, schedule: str, stages_after: int, num_microbatches: int) -> list[float] | None:
        """Each rank's peak with ``stages_after`` stages behind it (None: the stage is not predicted there)."""
        if self.base is not None:
            base = self.base(stages_after)
            return None if not math.isfinite(base) else [base + offset for offset in self.offsets]
        plain, zero2 = self.row_peaks(schedule, stages_after, num_microbatches)
        out = np.full(self.ranks, -math.inf)
        if plain is not None:
            out = plain[self.plain_rank]
        if zero2 is not None:
            out = np.maximum(out, zero2[self.zero2_rank]) if plain is not None else zero2[self.zero2_rank]
        return out.tolist()

    def row_peaks(self, schedule: str, stages_after: int, num_microbatches: int
                  ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Each plain row's and each ZeRO-2 row's peak at the position (None: no rows of that kind)."""
        return replay_rows(self.plain, self.zero2, schedule, stages_after, num_microbatches)


def replay_rows(plain: np.ndarray, zero2: np.ndarray, schedule: str, stages_after: int, num_microbatches: int
                ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Each plain row's and each ZeRO-2 row's peak with ``stages_after`` stages behind (None: no rows of that
    kind); rows of many stages at once (predict/span_tables.py stacks a config's span classes)."""
    p = (np.max(plain @ peak_terms(schedule, stages_after, num_microbatches).T, axis=1) if len(plain) else None)
    z = zero2_values(zero2, schedule, stages_after, num_microbatches) if len(zero2) else None
    return p, z
