"""Search the plan space for the plan with the lowest per-device peak memory (CAPTURE, mCAP).

A tour, in the order data flows:

- :mod:`~hybridplan.search.space`: the plans (stage configs, packing onto the mesh, placement, enumeration);
- :mod:`~hybridplan.search.objective`: the stage-memory model the predictor provides, the score of a plan
  (leximax with a canonical tie-break) and the :class:`SearchResult` every solver returns;
- the solvers: :func:`solve_exhaustive` (CAPTURE / mCAP-BF, the reference), :func:`solve_exact` (dynamic
  programming, same answer, fast), :func:`solve_bayesian` (mCAP-BO);
- :func:`fewest_devices`: the smallest mesh on which the model fits;
- :mod:`~hybridplan.search.synthetic`: stand-in memory models for tests and benchmarks.
"""

from hybridplan.search.bayesian import solve_bayesian
from hybridplan.search.exact import solve_exact
from hybridplan.search.exhaustive import solve_exhaustive
from hybridplan.search.fewest import FewestResult, MeshAttempt, fewest_devices
from hybridplan.search.objective import PlacedStage, SearchResult, StageMemoryModel, StageTable
from hybridplan.search.space import PlanSpace, StageChoice, StageConfig, count_plans, enumerate_plans

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
