"""CAPTURE's recommender (seed 000, Algorithm 4) and mCAP-BF (seed 004, 3.4): score every plan, keep the best.

:func:`~hybridplan.search.memory.space.enumerate_plans` builds the plans from the last stage to the first, so
when a stage config is chosen the number of stages after it is known and its value is exact. CAPTURE's
pruning then applies as stated: a stage config whose value exceeds the peak of the best plan found so
far is skipped (a config *equal* to that peak is kept: it may still win the tie-break). The result is
the unique best plan of [Note: leximax order], the same one :func:`hybridplan.search.memory.exact.solve_exact`
finds far faster; this solver is the reference, and fine for small spaces (see
:func:`~hybridplan.search.memory.space.count_plans`).
"""

from __future__ import annotations

import math
import time

from hybridplan.search.memory.objective import SearchResult, StageMemoryModel, StageTable, build_result, no_allowed_plan, plan_score
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.memory.configs import StageChoice
from hybridplan.search.memory.space import PlanSpace, enumerate_plans

__all__ = ["solve_exhaustive"]

_REPORT_EVERY = 1024
"""Stage choices between two progress checks inside the enumeration (a check reads the clock)."""


def solve_exhaustive(model: StageMemoryModel, space: PlanSpace, *, prune: bool = True,
                     table: StageTable | None = None, progress: ProgressCallback | None = None) -> SearchResult:
    """The best plan by enumeration.

    Args:
        model: the stage-memory model.
        space: the plans to search.
        prune: skip stage configs above the best peak so far (CAPTURE); the answer is the same.
        table: precomputed stage values (built from ``model`` when omitted).
        progress: receives a line now and then on a long search, e.g. ``"exhaustive search: 120,000 plans
            scored, 3,400 stage configs pruned, best peak 467.5, 3.0 s"`` (:mod:`~hybridplan.search.progress`); ``None``: silent.

    Returns:
        The best plan; ``visited`` counts the complete plans scored.

    Raises:
        PlanError: if every plan contains a stage config the model does not allow.
    """
    started = time.perf_counter()
    report = Progress.of(progress)
    space.mesh_packing(report.within("exhaustive search"))
    table = StageTable.reuse(table, model, space, progress=report.within("exhaustive search"))
    best: tuple | None = None  # (score, choices)
    peak = math.inf
    plans = pruned = tried = 0

    def status() -> str:
        return f"exhaustive search: {plans:,} plans scored, {pruned:,} stage configs pruned, best peak {peak:.6g}"

    def keep(choice: StageChoice, stages_after: int) -> bool:
        nonlocal pruned, tried
        tried += 1
        if tried % _REPORT_EVERY == 0 and report.due():  # pruning may skip many stages between two plans
            report.update(status())
        value = table.value(choice, stages_after)
        if prune and value > peak:
            pruned += 1
            return False
        return value < math.inf  # disallowed configs are never part of a plan

    for choices in enumerate_plans(space, keep):
        plans += 1
        if report.due():
            report.update(status())
        score = plan_score(table.value, space, choices)
        if best is None or score < best[0]:
            best, peak = (score, choices), score[0][0]
    if best is None:
        raise no_allowed_plan(space)
    return build_result("exhaustive", space, table.value, best[1], visited=plans, started=started,
                        now=time.perf_counter(), stats={"pruned": pruned, "table_s": table.seconds})
