"""Search the plan space: the memory objective (``memory/``), the time objective (``time/``), and what both share.

- :mod:`~hybridplan.search.memory`: the plan with the lowest per-device peak memory (CAPTURE, mCAP): the space,
  the objective, the exact, exhaustive and Bayesian solvers, the fewest devices that fit;
- :mod:`~hybridplan.search.time`: the fastest plans that fit in memory (AMP's search, PipeDream-2BW's planner);
- shared: :mod:`~hybridplan.search.progress` (progress lines of long searches) and
  :mod:`~hybridplan.search.baselines` (the baseline partitioners both objectives are compared with).

The memory objective's names are re-exported here (``from hybridplan.search import PlanSpace, solve_exact``).
"""

from hybridplan.search.memory import (
    FewestResult,
    MeshAttempt,
    PlacedStage,
    PlanSpace,
    SearchResult,
    StageChoice,
    StageConfig,
    StageMemoryModel,
    StageTable,
    count_plans,
    enumerate_plans,
    fewest_devices,
    solve_bayesian,
    solve_exact,
    solve_exhaustive,
)
from hybridplan.search.progress import Progress, ProgressCallback

__all__ = [
    "PlanSpace",
    "StageConfig",
    "StageChoice",
    "count_plans",
    "enumerate_plans",
    "StageMemoryModel",
    "StageTable",
    "PlacedStage",
    "SearchResult",
    "solve_exhaustive",
    "solve_exact",
    "solve_bayesian",
    "fewest_devices",
    "FewestResult",
    "MeshAttempt",
    "Progress",
    "ProgressCallback",
]
