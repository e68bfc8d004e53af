"""The fastest plans that fit in memory, and the frontier of memory against time.

Throughput: AMP's search over (pp, dp, tp, mbs) (search/time/throughput.py) or, with ``mode="2bw"``,
PipeDream-2BW's planner over (w, d, b, r) (search/time/pipedream_2bw.py), both keeping only plans the model can run
whose every device's predicted peak fits its memory (search/time/feasibility.py; predictions from the memory
statistics of the profile database; in AMP mode a strategy whose fastest cut does not fit is cut again within the
ranges of layers each stage can hold: search/time/bottleneck_cuts.py's [Note: cutting within memory]). Pareto:
the frontier of predicted peak memory against predicted iteration time over those plans, and, with memory statistics, the memory-minimal plan of the CAPTURE search
(its lowest-memory end). The command line (``hybridplan plan --objective throughput|pareto``) and the
benchmarks call :func:`plan_throughput`.

The extended space (issue 11): AMP's strategies include its dp x tp stages, and a stage larger than a node puts
its data replicas on several nodes (its tensor groups stay inside one, so every strategy's stages are kept when
their tensor groups are; the time model syncs such a stage over the inter-node link). With ``zero`` every data
stage may also be ZeRO-1, 2 or 3 sharded, with ``recompute_db`` every stage may recompute its activations: per
stage, the fastest options that fit (search/time/stage_options.py), predicted by the memory predictor with its
ZeRO rules (predict/zero_stage.py: ZeRO-1 from the data scenario, ZeRO-2 and ZeRO-3 from ``profile --zero``'s) and the
recompute profile ([Note: recompute chosen per
stage]), timed by the time model's terms ([Note: ZeRO and recompute in time]).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hybridplan.errors import HybridPlanError, UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_breakdown import TimeBreakdown
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.search.progress import ProgressCallback
from hybridplan.search.time.stage_options import options_label
from hybridplan.search.time.strategy_cut import CutAlgorithm
from hybridplan.search.time.throughput import pareto_frontier
from hybridplan.workflows.sources import Sources
from hybridplan.workflows.table_cache import feasibility_memo

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel
    from hybridplan.search.time.feasibility import Feasibility

__all__ = ["Candidate", "ThroughputPlans", "plan_throughput", "fits_at_target"]


@dataclass(frozen=True)
class Candidate:
    """One plan of the answer: what it is, its predicted time and peak."""

    label: str
    plan: Plan
    """Annotated with the model, the cluster, the predicted seconds and peak."""
    time: TimeBreakdown
    peak: float | None
    seconds: float
    """Predicted seconds per iteration (the breakdown's total, or the 2BW planner's, which counts recomputation)."""

    @property
    def samples_per_s(self) -> float:
        return self.plan.global_batch_size / self.seconds if self.seconds > 0 else math.inf


@dataclass(frozen=True)
class ThroughputPlans:
    """The candidates (fastest first; for "pareto" the frontier by increasing memory) and how they were found."""

    objective: Literal["throughput", "pareto"]
    candidates: tuple[Candidate, ...]
    feasible: int
    """Plans that fit (the Pareto frontier is drawn from these)."""
    what: str
    """The planner, e.g. "AMP search (megatron placement, schedule 1f1b)"."""
    evaluated: int
    seconds: float
    feasibility: Feasibility
    profile: TimeProfile
    cluster: Cluster
    global_batch_size: int

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


def plan_throughput(
    sources: Sources,
    cluster: Cluster,
    *,
    objective: Literal["throughput", "pareto"] = "throughput",
    mode: Literal["amp", "2bw"] = "amp",
    global_batch_size: int | None = None,
    num_microbatches: int | None = None,
    schedule: str | None = None,
    placement: Literal["megatron", "anneal"] = "megatron",
    seed: int = 0,
    degree_fit: str = "log",
    progress: ProgressCallback | None = None,
    cuts: CutAlgorithm = "bottleneck",
    zero: bool = False,
    recompute_db: str | Path | None = None,
    table_cache: Path | None = None,
) -> ThroughputPlans:
    """The fastest feasible plans, or their memory/time frontier (module docstring). ``cuts``: how the AMP
    search cuts stages (search/time/throughput.py ``CutAlgorithm``; "amp", the slow reference, for benchmarks).
    ``zero``: data stages may be ZeRO-1/2/3 sharded; ``recompute_db``: a profile of the same model taken with
    ``--activation-checkpointing``, so that every stage may recompute (predicted from it); both per stage, AMP
    mode only. ``table_cache``: a folder keeping the feasibility check's stage matrices and peaks for these
    profiles (workflows/table_cache.py ``feasibility_memo``).

    Raises:
        UsageError: for contradictory options, a missing time profile, or when no plan is feasible.
        ProfileError: for a profile that names user code without ``--model`` (models/profiled.py).
    """
    if (zero or recompute_db is not None) and mode == "2bw":
        raise UsageError("--zero and --recompute-db choose per-stage options of AMP's plans, not PipeDream-2BW's"
                         " (its planner has its own recompute r; the runtime shards no 2BW stage)",
                         fix="drop --mode 2bw, or --zero / --recompute-db")
    if recompute_db is not None and (sources.db is None or not sources.db.has_memory):
        raise UsageError("--recompute-db predicts the recomputed stages beside a profile's memory statistics, and"
                         " there are none", fix="give --db, the memory profile taken without recompute")
    profile = sources.time_profile()
    if recompute_db is not None and sources.meta.get("time_identity", {}).get("activation_checkpointing"):
        raise UsageError("the layer times were measured with activation checkpointing: their backward already holds"
                         " a recomputation, so the plain stages could not be timed",
                         fix="time the model without --activation-checkpointing (profile --time), or drop --recompute-db")
    targets = sources.targets(global_batch_size=global_batch_size, num_microbatches=num_microbatches, schedule=schedule)
    if zero and targets.schedule == "2bw":
        raise UsageError("--zero with the 2bw schedule: the runtime shards no PipeDream-2BW stage (its stale weight"
                         " version is a second whole copy)", fix="use --schedule 1f1b or gpipe, or drop --zero")
    if mode == "2bw":
        if schedule not in (None, "2bw"):
            raise UsageError(f"--mode 2bw plans PipeDream-2BW, whose schedule is '2bw', not {schedule!r}", fix="drop --schedule")
        targets = replace(targets, schedule="2bw")
    fit = _feasibility(sources, cluster, targets, degree_fit, recompute_db)
    if objective == "pareto" and fit.predictor is None:
        raise UsageError("the Pareto objective needs memory predictions", fix="give --db with memory statistics ('hybridplan profile')")
    gbs = targets.global_batch_size
    dbs = [] if sources.db is None else [Path(sources.db.path)] + ([Path(recompute_db)] if recompute_db else [])
    identity = {"targets": [targets.schedule, gbs, targets.num_microbatches], "degree_fit": degree_fit,
                "cluster": cluster.describe(), "capacities": [cluster.memory_of(d) for d in range(cluster.num_devices)],
                "model": sources.given_model, "recompute": recompute_db is not None}
    with feasibility_memo(fit, table_cache if dbs else None, dbs=dbs, options=identity):
        return _searched(sources, cluster, fit, profile, targets, objective=objective, mode=mode,
                         placement=placement, seed=seed, progress=progress, cuts=cuts, zero=zero,
                         recompute_db=recompute_db)


def _searched(sources: Sources, cluster: Cluster, fit: Feasibility, profile: TimeProfile, targets: Any, *,
              objective: Literal["throughput", "pareto"], mode: Literal["amp", "2bw"], placement: Literal["megatron", "anneal"],
              seed: int, progress: ProgressCallback | None, cuts: CutAlgorithm, zero: bool,
              recompute_db: str | Path | None) -> ThroughputPlans:
    """:func:`plan_throughput`'s search, with its feasibility check ``fit``."""
    from hybridplan.search.time.pipedream_2bw import plan_pipedream_2bw
    from hybridplan.search.time.throughput import search_throughput

    gbs = targets.global_batch_size
    rows: list[Candidate] = []
    started = time.perf_counter()
    if mode == "2bw":
        found = plan_pipedream_2bw(profile, cluster, gbs, memory_ok=fit, progress=progress)
        for c in found:
            label = f"2bw w={c.replicas} d={c.stages} b={c.micro_batch_size} r={int(c.recompute)} m={c.num_microbatches}"
            rows.append(Candidate(label, c.plan, predict_iteration_time(c.plan, profile, cluster), None, c.iteration_s))
        what, evaluated = "PipeDream-2BW planner", len(found) + fit.rejected
    else:
        result = search_throughput(profile, cluster, gbs, memory_ok=fit, placement=placement, seed=seed,
                                   node_local_stages=True, schedule=targets.schedule, composite=True, progress=progress,
                                   cuts=cuts, zero_levels=(1, 2, 3) if zero else (),
                                   recompute=recompute_db is not None, stage_peaks=fit.stage_peaks,
                                   stage_windows=fit.stage_windows,
                                   # with stage options each strategy gives the fastest plan under every memory
                                   # threshold for the frontier; without, every plan is a row, as before
                                   objective="pareto" if objective == "pareto" and (zero or recompute_db) else "time",
                                   peak_memory=fit.peak_memory)
        for t in result.candidates:
            label = (f"pp={t.pipeline_degree} dp={t.data_degree} tp={t.tensor_degree} mbs={t.micro_batch_size}"
                     + options_label(t.plan))
            rows.append(Candidate(label, t.plan, t.predicted, None, t.iteration_s))
        what, evaluated = f"AMP search ({placement} placement, schedule {targets.schedule})", result.evaluated
        if zero or recompute_db is not None:
            unfit = result.rejected_by_memory - fit.rejected  # strategies where no choice of stage options fits
            what += f" with per-stage {' and '.join(w for w, on in (('ZeRO', zero), ('recompute', recompute_db)) if on)}"
            if unfit:
                what += f" ({unfit} strategies with no choice of stage options that fits)"
    seconds = time.perf_counter() - started
    if fit.predictor is not None:
        rows = [replace(r, peak=fit.peak_memory(r.plan)) for r in rows]
    if objective == "pareto" and fit.predictor is not None:
        rows += _memory_optimal(sources, fit.predictor, cluster, profile, fit, zero=zero,
                                recompute=recompute_db is not None)
    sources.warn(f"{profile.model} on {cluster.describe()}, global batch {gbs}: {what}, {evaluated} plans evaluated"
                 f" in {seconds:.3f} s; {fit.summary()}")
    for kind, reason in fit.reasons.items():
        sources.warn(f"  e.g. {kind.replace('_', ' ')}: {reason}")
    if not rows:
        raise UsageError(f"no feasible plan: {what}; {fit.summary()}",
                         fix="use more devices, a smaller global batch, or larger --device-memory")
    rows = [replace(r, plan=_annotated(r, cluster, profile)) for r in rows]
    if objective == "pareto":
        chosen = [rows[i] for i in pareto_frontier([(float(r.peak or 0.0), r.seconds) for r in rows])]
    else:
        chosen = sorted(rows, key=lambda r: r.seconds)
    return ThroughputPlans(objective, tuple(chosen), len(rows), what, evaluated, seconds, fit, profile, cluster, gbs)


def _feasibility(sources: Sources, cluster: Cluster, targets: Any, degree_fit: str,
                 recompute_db: str | Path | None = None) -> Feasibility:
    from hybridplan.search.time.feasibility import Feasibility

    # The search varies the micro-batch count; the predictor re-targets itself per plan (MemoryPredictor.predict).
    predictor = sources.memory_predictor(targets, degree_fit=degree_fit, recompute_db=recompute_db)
    if predictor is None:
        sources.warn("note: no memory statistics (--db): plans are not checked against device memory")
    recompute = bool(sources.meta.get("identity", {}).get("run_options", {}).get("activation_checkpointing", False))
    return Feasibility(cluster, predictor, sources.optional_model(), recompute_profiled=recompute)


def _memory_optimal(sources: Sources, predictor: MemoryPredictor, cluster: Cluster, profile: TimeProfile,
                    fit: Feasibility, *, zero: bool = False, recompute: bool = False) -> list[Candidate]:
    """The CAPTURE search's memory-minimal plan, as a Pareto candidate (where the time profile can time it); with
    ``zero`` or ``recompute``, the memory search's over the extended space (data x tensor stages, ZeRO-1/3, per-stage
    recompute, stages over whole nodes), as the throughput side searches it."""
    from hybridplan.search import PlanSpace, StageMemoryModel, solve_exact

    merged = sources.db.merge_groups if sources.db is not None else None
    view = predictor.on_units(merged) if merged else None
    model: StageMemoryModel = view if view is not None else predictor
    try:
        L = view.num_layers if view is not None else predictor.num_layers
        extended = zero or recompute
        result = solve_exact(model, PlanSpace.for_cluster(cluster, L, composite=extended, zero=zero, recompute=recompute,
                                                          cross_node=extended))
        plan = result.to_plan(schedule=predictor.schedule, global_batch_size=predictor.global_batch_size,
                              num_microbatches=predictor.num_microbatches)
        plan = view.to_original(plan) if view is not None else plan
        if not fit(plan):
            return []
        timed = predict_iteration_time(plan, profile, cluster)
        label = "memory-minimal (extended space)" if extended else "memory-minimal (CAPTURE)"
        return [Candidate(label, plan, timed, fit.peak_memory(plan), timed.total_s)]
    except HybridPlanError as e:
        sources.warn(f"note: the memory-minimal plan is left out: {e.message}")
        return []


def _annotated(row: Candidate, cluster: Cluster, profile: TimeProfile) -> Plan:
    extra: dict[str, Any] = {"model": profile.model, "cluster": cluster.shape, "predicted_iteration_s": row.seconds}
    if row.peak is not None:
        extra["predicted_peak_bytes"] = int(round(row.peak))
    return row.plan.with_extra(**extra)


def fits_at_target(predictor: MemoryPredictor, model: LayeredModel, cluster: Cluster,
                   capacity: int) -> Callable[[Plan], bool]:
    """The ``memory_ok`` of a throughput search that keeps the target's micro-batch count (as Alpa's benchmark
    fixes it; the FLOP time model, linear in samples, would always pick the smallest micro-batches) and only
    plans the model can run whose predicted peak fits ``capacity``."""

    def fits(plan: Plan) -> bool:
        if plan.num_microbatches != predictor.num_microbatches:
            return False
        try:
            plan.validate(model=model, cluster=cluster)
            return predictor.predict(plan).peak_memory_bytes <= capacity
        except HybridPlanError:
            return False

    return fits
