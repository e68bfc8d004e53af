"""The memory/time front of a model: every strategy of the throughput search, priced by both models.

The throughput search (:func:`~hybridplan.search.time.throughput.search_throughput`) enumerates AMP's uniform
strategies and predicts their iteration time; the memory predictor prices the same plans in peak bytes.
The plans no other plan beats on both are the Pareto front the report draws, with the user's own plans
(e.g. the memory-optimal one) marked on it. A strategy the memory profile cannot predict (a parallel
degree or batch split it was not profiled for) has no memory coordinate and is left out, counted.
"""

from __future__ import annotations

from collections.abc import Mapping

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import HybridPlanError
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.report.data import ParetoPoint, ParetoView
from hybridplan.search.time.throughput import pareto_frontier, search_throughput

__all__ = ["memory_time_front", "plan_point", "plan_label"]


def plan_label(plan: Plan) -> str:
    """A short label: ``[0,7) data4 | [7,13) none1 | ...``."""
    return " | ".join(f"[{s.start},{s.stop}) {s.kind}{s.degree}" for s in plan.stages)


def plan_point(plan: Plan, predictor: MemoryPredictor, profile: TimeProfile, cluster: Cluster, label: str) -> ParetoPoint:
    """``plan`` priced by both models.

    Raises:
        ProfileError, PlanError: if either model cannot price the plan.
    """
    peak = predictor.predict(plan).peak_memory_bytes
    return ParetoPoint(float(peak), predict_iteration_time(plan, profile, cluster).total_s, label, False, plan.to_dict())


def memory_time_front(predictor: MemoryPredictor, profile: TimeProfile, cluster: Cluster, *, title: str,
                      node_local_stages: bool = True, marks: Mapping[str, Plan] | None = None) -> tuple[ParetoView, int]:
    """Every strategy of the throughput search on ``cluster`` at the predictor's global batch and schedule, as
    (predicted peak, predicted time) points with the frontier flagged; ``marks`` priced the same way.

    Returns:
        The view and how many strategies the memory profile could not price.
    """
    result = search_throughput(profile, cluster, predictor.global_batch_size, schedule=predictor.schedule,
                               node_local_stages=node_local_stages)
    points: list[ParetoPoint] = []
    unpriced = 0
    for c in result.candidates:
        try:
            peak = predictor.predict(c.plan).peak_memory_bytes
        except HybridPlanError:
            unpriced += 1
            continue
        label = f"pp{c.pipeline_degree} dp{c.data_degree} tp{c.tensor_degree} mbs{c.micro_batch_size}"
        points.append(ParetoPoint(float(peak), c.iteration_s, label, False, c.plan.to_dict()))
    keep = set(pareto_frontier([(p.peak_memory_bytes, p.iteration_s) for p in points]))
    points = [ParetoPoint(p.peak_memory_bytes, p.iteration_s, p.label, i in keep, p.plan) for i, p in enumerate(points)]
    marked = tuple(plan_point(plan, predictor, profile, cluster, name) for name, plan in (marks or {}).items())
    return ParetoView(title, tuple(points), marked), unpriced
