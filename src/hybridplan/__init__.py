"""hybridplan: measure, predict and minimise per-device peak memory of hybrid-parallel training plans.

Data flows one way: model + cluster -> profiling -> statistics -> prediction -> search -> plan -> runtime.
"""

from hybridplan.cluster import Cluster
from hybridplan.errors import HybridPlanError
from hybridplan.plan import Plan, StagePlan

__all__ = ["Cluster", "HybridPlanError", "Plan", "StagePlan"]
__version__ = "0.1.0"
