"""CAPTURE's recommender (seed 000, Algorithm 4) and mCAP-BF (seed 004, 3.4): score every plan, keep the best.

:func:`~hybridplan.search.space.enumerate_plans` builds the plans from the last stage to the first, so
when a stage config is chosen the number of stages after it is known and its value is exact. CAPTURE's
pruning then applies as stated: a stage config whose value exceeds the peak of the best plan found so
far is skipped (a config *equal* to that peak is kept: it may still win the tie-break). The result is
the unique best plan of [Note: leximax order], the same one :func:`hybridplan.search.exact.solve_exact`
finds far faster; this solver is the reference, and fine for small spaces (see
:func:`~hybridplan.search.space.count_plans`).
"""

from __future__ import annotations

import math
import time

from hybridplan.search.objective import SearchResult, StageMemoryModel, StageTable, build_result, no_allowed_plan, plan_score
from hybridplan.search.space import PlanSpace, StageChoice, enumerate_plans

__all__ = ["solve_exhaustive"]


def solve_exhaustive(model: StageMemoryModel, space: PlanSpace, *, prune: bool = True,
                     table: StageTable | None = None) -> SearchResult:
    """The best plan by enumeration.

    Args:
        model: the stage-memory model.
        space: the plans to search.
        prune: skip stage configs above the best peak so far (CAPTURE); the answer is the same.
        table: precomputed stage values (built from ``model`` when omitted).

    Returns:
        The best plan; ``visited`` counts the complete plans scored.

    Raises:
        PlanError: if every plan contains a stage config the model does not allow.
    """
    started = time.perf_counter()
    table = StageTable.reuse(table, model, space)
    best: tuple | None = None  # (score, choices)
    peak = math.inf
    plans = pruned = 0

    def keep(choice: StageChoice, stages_after: int) -> bool:
        nonlocal pruned
        value = table.value(choice, stages_after)
        if prune and value > peak:
            pruned += 1
            return False
        return value < math.inf  # disallowed configs are never part of a plan

    for choices in enumerate_plans(space, keep):
        plans += 1
        score = plan_score(table.value, space, choices)
        if best is None or score < best[0]:
            best, peak = (score, choices), score[0][0]
    if best is None:
        raise no_allowed_plan(space)
    return build_result("exhaustive", space, table.value, best[1], visited=plans, started=started,
                        now=time.perf_counter(), stats={"pruned": pruned, "table_s": table.seconds})
