"""The memory objective: the plan with the lowest per-device peak memory (CAPTURE, mCAP).

A tour, in the order data flows:

- :mod:`~hybridplan.search.memory.configs`: the stage configs (how one stage may run);
- :mod:`~hybridplan.search.memory.packing`: which stage degrees pack onto the mesh, and where each stage goes;
- :mod:`~hybridplan.search.memory.space`: the plans (the space's options, enumeration and counting);
- :mod:`~hybridplan.search.memory.objective`: the stage-memory model the predictor provides, the score of a plan
  (leximax with a canonical tie-break) and the :class:`SearchResult` every solver returns;
- the solvers: :func:`solve_exhaustive` (CAPTURE / mCAP-BF, the reference), :func:`solve_exact` (dynamic
  programming, same answer, fast), :func:`solve_bayesian` (mCAP-BO);
- :func:`fewest_devices`: the smallest mesh on which the model fits;
- :mod:`~hybridplan.search.memory.synthetic`: stand-in memory models for tests and benchmarks.
"""

from hybridplan.search.memory.bayesian import solve_bayesian
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.exhaustive import solve_exhaustive
from hybridplan.search.memory.fewest import FewestResult, MeshAttempt, fewest_devices
from hybridplan.search.memory.objective import PlacedStage, SearchResult, StageMemoryModel, StageTable
from hybridplan.search.memory.configs import StageChoice, StageConfig
from hybridplan.search.memory.space import PlanSpace, count_plans, enumerate_plans

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
]
