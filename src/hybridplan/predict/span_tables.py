"""Every span's predicted stage memory at once: what the exact memory search asks a predictor for.

The search needs ``stage_memory`` of every ``[start, stop)`` for each stage config and schedule position
(``L^2/2`` spans; search/memory/objective.py), so instead of composing span by span this builds the whole
``[start, stop]`` table from the predictor's scaled span tables in one array expression, with the same routes as
:meth:`~hybridplan.predict.memory.MemoryPredictor.stage_memory`: the recompute profile for a recomputed stage, the
ZeRO rules (predict/zero_stage.py) span by span on the spans the unsharded source predicts, a data x tensor stage
as its tensor replica, a data stage wider than the profiled ones as the largest profiled one at a smaller batch,
an unprofiled tensor degree by the degree fit, else the schedule's replay of the scaled quantities. It takes the
predictor rather than living in it, so that memory.py keeps the span-by-span composition.

[Note: identical spans predict alike] The ZeRO rules run span by span (a partition of the span's parameters, the
gathered shards of its layers), ``L^2/2`` spans for each stage config: minutes for a real model in the whole
extended space. Where the profile records its layers' classes (``layer_classes``: a simulated campaign whose
neighbour chains are one layer long, profiling/campaign.py), every statistic of layer ``l`` comes from spans of
``l`` and ``l-1`` measured by their signatures (``M_i(l)`` from ``[l, l+1)``, ``M_a(l)`` from ``[l-1, l+1)``
and ``[l-1, l)``, profiling/stage_memo.py), and the parameter shapes of a layer are its signature's; so a span's
prediction is a function of its layers' signatures, whether it starts the model and whether it ends it, and
each such class is predicted once. (tests/predict/test_span_classes.py compares every table with the
span-by-span one.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from hybridplan.predict.batch_scaling import PEAK
from hybridplan.predict.rank_replay import RankReplay, forwards_first, replay_rows, several_forwards
from hybridplan.predict.zero_stage import depends_on_forwards, kept_replay
from hybridplan.profiling.schedule_memory import peak_terms

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["stage_memory_matrix"]


def stage_memory_matrix(predictor: MemoryPredictor, kind: str, degree: int, stages_after: int, num_layers: int, *,
                        tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
    """``[start, stop]`` -> ``predictor.stage_memory`` for every span at once (``inf`` where not predictable)."""
    L = num_layers
    out = np.full((L, L + 1), math.inf)
    if recompute and not predictor.recompute:
        if predictor.recomputed is None:
            return out
        return predictor.recomputed.stage_memory_matrix(kind, degree, stages_after, L,
                                                        tensor_degree=tensor_degree, zero=zero)
    if zero and forwards_first(predictor.schedule, stages_after, predictor.num_microbatches):
        # [Note: a 1F1B stage that runs every forward first] in predict/rank_replay.py
        return predictor.retargeted(schedule="gpipe").stage_memory_matrix(kind, degree, stages_after, L,
                                                                          tensor_degree=tensor_degree, zero=zero)
    if zero:
        source = kind if kind == "data+tensor" else predictor._zero_source(kind, zero)
        if source is None or predictor.zero_layout is None:
            return out
        base = predictor.stage_memory_matrix(source, degree, stages_after, L, tensor_degree=tensor_degree)
        finite = np.isfinite(base)
        several = (depends_on_forwards(predictor, kind, zero)  # else the same rows at every position
                   and several_forwards(predictor.schedule, stages_after, predictor.num_microbatches))
        classes = predictor.kept(("zero classes", kind, degree, tensor_degree, zero, several, L, finite.tobytes()),
                                 lambda: _ZeroClasses(predictor, L, finite, kind, degree, tensor_degree, zero, several))
        return classes.matrix(predictor, stages_after, out)
    if kind == "data+tensor":
        replica = predictor._replica(degree, tensor_degree)
        return out if replica is None else replica.stage_memory_matrix("tensor", tensor_degree, stages_after, L)
    if kind in ("data", "data-zero3") and degree > 1 and predictor.microbatch_size % degree:
        return out
    wider = None if (kind, degree) in predictor.stats else predictor._wider_data(kind, degree)
    if wider is not None:  # [Note: a data stage wider than the profiled ones]
        return wider[0].stage_memory_matrix(kind, wider[1], stages_after, L)
    if degree != 1 and (kind, degree) not in predictor.stats:
        degrees = predictor.profiled_degrees(kind)
        if len(degrees) < 2 or (kind == "data-zero3" and degree > degrees[-1]):  # see predict/plan_checks.py
            return out
        d1, d2 = degrees[-2], degrees[-1]
        p1 = predictor.stage_memory_matrix(kind, d1, stages_after, L)
        p2 = predictor.stage_memory_matrix(kind, d2, stages_after, L)
        with np.errstate(invalid="ignore"):
            if predictor.degree_fit == "log":
                fitted = p1 + (p2 - p1) * math.log(degree / d1) / math.log(d2 / d1)
            else:
                beta = (p1 - p2) / (1 / d1 - 1 / d2)
                fitted = p2 - beta / d2 + beta / degree
        return np.where(np.isfinite(p1) & np.isfinite(p2), fitted, math.inf)
    table = predictor._scaled_table(kind, degree)
    if table is None:
        return out
    if predictor.method == "capture":
        values = table[..., PEAK]
    else:
        values = np.max(table[..., :PEAK] @ peak_terms(predictor.schedule, stages_after, predictor.num_microbatches).T, axis=-1)
    return np.where(np.isnan(values), math.inf, values)


class _ZeroClasses:
    """One ZeRO config's span classes, each class's ranks as rows (predict/rank_replay.py), stacked: the matrix
    at a position is two products and a maximum per class ([Note: a ZeRO stage's rows are the same at every
    position] in predict/rank_replay.py), where asking each class at each position took the Llama-3-70B on 32x8
    search's stage table most of its minute."""

    def __init__(self, predictor: MemoryPredictor, L: int, finite: np.ndarray, kind: str, degree: int,
                 tensor_degree: int, zero: int, several: bool) -> None:
        plain: list[np.ndarray] = []
        zero2: list[np.ndarray] = []
        self.plain_starts: list[int] = []  # where each class's rows start in the stacks, and which class
        self.plain_class: list[int] = []
        self.zero2_starts: list[int] = []
        self.zero2_class: list[int] = []
        self.positional: list[tuple[int, RankReplay]] = []  # classes predicted by a peak statistic alone
        spans: list[tuple[np.ndarray, np.ndarray]] = []
        for rows, cols in _span_classes(predictor, L):
            where = finite[rows, cols]
            if not where.any():
                continue
            first = int(np.argmax(where))  # the class's first predictable span stands for all of it
            replay = kept_replay(predictor, int(rows[first]), int(cols[first]), kind, zero, degree, tensor_degree,
                                 several)
            if replay is None:
                continue  # not predicted: inf
            c = len(spans)
            spans.append((rows[where], cols[where]))
            if replay.base is not None:
                self.positional.append((c, replay))
            for stack, starts, owner, part in ((plain, self.plain_starts, self.plain_class, replay.plain),
                                               (zero2, self.zero2_starts, self.zero2_class, replay.zero2)):
                if len(part):
                    starts.append(sum(len(block) for block in stack))
                    owner.append(c)
                    stack.append(part)
        self.plain = np.concatenate(plain) if plain else np.empty((0, PEAK))
        self.zero2 = np.concatenate(zero2) if zero2 else np.empty((0, PEAK + 5))
        self.classes = len(spans)
        self.rows = np.concatenate([r for r, _ in spans]) if spans else np.empty(0, dtype=np.intp)
        self.cols = np.concatenate([c for _, c in spans]) if spans else np.empty(0, dtype=np.intp)
        self.owner = np.repeat(np.arange(len(spans)), [len(r) for r, _ in spans])

    def matrix(self, predictor: MemoryPredictor, stages_after: int, out: np.ndarray) -> np.ndarray:
        """``out`` with every predicted span's value at ``stages_after``: its class's largest rank."""
        value = np.full(self.classes, -math.inf)
        schedule, m = predictor.schedule, predictor.num_microbatches
        plain, zero2 = replay_rows(self.plain, self.zero2, schedule, stages_after, m)
        for peaks, starts, owner in ((plain, self.plain_starts, self.plain_class),
                                     (zero2, self.zero2_starts, self.zero2_class)):
            if peaks is not None:
                value[owner] = np.maximum(value[owner], np.maximum.reduceat(peaks, starts))
        for c, replay in self.positional:
            ranks = replay.peaks(schedule, stages_after, m)
            value[c] = math.inf if ranks is None else max(ranks)
        out[self.rows, self.cols] = value[self.owner]
        return out


def _span_classes(predictor: MemoryPredictor, L: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The spans ``[start, stop)`` of ``L`` layers grouped by class ([Note: identical spans predict alike]): each
    group's starts and stops, in the order of the spans; one span a group where the profile records no layer
    classes. Grouped once per predictor (every config and position of a search asks it)."""
    def grouped() -> list[tuple[np.ndarray, np.ndarray]]:
        classes = predictor.layer_classes if predictor.layer_classes is not None and len(predictor.layer_classes) == L else None
        groups: dict[object, tuple[list[int], list[int]]] = {}
        for a in range(L):
            for b in range(a + 1, L + 1):
                group = groups.setdefault((tuple(classes[a:b]), a == 0, b == L) if classes is not None else (a, b),
                                          ([], []))
                group[0].append(a)
                group[1].append(b)
        return [(np.array(rows), np.array(cols)) for rows, cols in groups.values()]

    groups: list[tuple[np.ndarray, np.ndarray]] = predictor.kept(("span classes", L), grouped)
    return groups
