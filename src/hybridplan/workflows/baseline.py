"""A baseline partitioner's plan, with the predictions of memory and time that make it comparable.

The baselines (search/baselines.py: equal layers, torchgpipe's balance by time or size, DeepSpeed's by
parameters) weigh per-layer costs: measured layer times for torchgpipe-time, parameters and activation bytes
counted on fake tensors for the others. The command line (``hybridplan plan --baseline NAME``) and the
benchmarks call :func:`plan_baseline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hybridplan.errors import HybridPlanError, UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.prediction import PlanPrediction
from hybridplan.predict.time_breakdown import TimeBreakdown
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.workflows.sources import Sources

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel

__all__ = ["BaselinePlan", "plan_baseline", "baseline_costs"]


@dataclass(frozen=True)
class BaselinePlan:
    """A baseline's plan (annotated with the model, the cluster and the predictions), and the predictions."""

    name: str
    plan: Plan
    model: str
    time: TimeBreakdown | None
    prediction: PlanPrediction | None


def plan_baseline(
    name: str,
    sources: Sources,
    cluster: Cluster,
    *,
    global_batch_size: int | None = None,
    num_microbatches: int | None = None,
    schedule: str | None = None,
    stage_degree: int = 1,
    stage_parallelism: Literal["data", "tensor"] = "data",
    degree_fit: str = "log",
) -> BaselinePlan:
    """The plan baseline ``name`` gives on ``cluster`` (module docstring).

    Raises:
        UsageError: for an unknown micro-batch count, or a baseline that needs layer times none gave.
        PlanError: if the baseline's plan breaks a rule of the model or the mesh.
    """
    from hybridplan.search.baselines import baseline_plan

    profile = sources.find_time_profile()
    model = sources.model(profile)
    targets = sources.targets(global_batch_size=global_batch_size, num_microbatches=num_microbatches, schedule=schedule)
    m = targets.num_microbatches
    if not m:
        raise UsageError("the micro-batch count is unknown", fix="give --num-microbatches (or a --db whose campaign has one)")
    gbs = targets.global_batch_size
    precision = str(sources.meta.get("identity", {}).get("run_options", {}).get("precision", "fp32"))
    costs = baseline_costs(name, model, profile, cluster, gbs // m, precision=precision)
    plan = baseline_plan(name, num_layers=model.num_layers, cluster=cluster, schedule=targets.schedule,
                         global_batch_size=gbs, num_microbatches=m, layer_costs=costs, stage_degrees=stage_degree,
                         parallelism=stage_parallelism)
    plan.validate(model=model, cluster=cluster)
    predictor = sources.memory_predictor(targets, degree_fit=degree_fit)
    timed = predict_iteration_time(plan, profile, cluster) if profile is not None else None
    prediction = None
    if predictor is not None:
        try:
            prediction = predictor.predict(plan)
        except HybridPlanError as e:
            sources.warn(f"note: memory not predicted: {e.message}")
    extra: dict[str, object] = {"model": model.name, "cluster": cluster.shape}
    if timed is not None:
        extra["predicted_iteration_s"] = timed.total_s
    if prediction is not None:
        extra["predicted_peak_bytes"] = prediction.peak_memory_bytes
    return BaselinePlan(name, plan.with_extra(**extra), model.name, timed, prediction)


def baseline_costs(name: str, model: LayeredModel, profile: TimeProfile | None, cluster: Cluster, microbatch_size: int,
                   *, precision: str = "fp32") -> list[float] | None:
    """The per-layer costs baseline ``name`` weighs (search/baselines.py BASELINES); None for "equal".

    Raises:
        UsageError: for torchgpipe-time without layer times, or layer times of another layer count.
    """
    if name == "equal":
        return None
    if name == "torchgpipe-time":
        if profile is None:
            raise UsageError("torchgpipe-time weighs layers by their measured times, and no time profile was given",
                             fix="give --time-profile FILE, or a --db measured with 'hybridplan profile --time'")
        if profile.num_layers != model.num_layers:
            raise UsageError(f"the time profile has {profile.num_layers} layers, {model.name} {model.num_layers}")
        dtype = cluster.devices[0].type
        dtype = dtype if dtype in profile.device_types else profile.reference_device_type
        fwd, bwd = profile.layer_times(dtype, 1, microbatch_size)
        # torchgpipe's profile_times times each layer's forward and backward between one tick and tock
        return [float(f + b) for f, b in zip(fwd, bwd)]
    from hybridplan.profiling.layer_costs import baseline_layer_costs, measure_layer_costs

    return baseline_layer_costs(measure_layer_costs(model, precision=precision), name, microbatch_size=microbatch_size)
