"""hybridplan: measure, predict and minimise per-device peak memory of hybrid-parallel training plans.

Data flows one way: plan <- models <- runtime <- profiling <- predict <- search <- workflows <- report <- cli
(README.md, "A tour of the code"; tests/test_architecture.py keeps it so).
"""

from hybridplan.errors import HybridPlanError
from hybridplan.plan import Cluster, Plan, StagePlan

__all__ = ["Cluster", "HybridPlanError", "Plan", "StagePlan"]
__version__ = "0.1.0"
