"""``hybridplan plan --objective throughput|pareto`` and ``hybridplan plan --baseline NAME`` (cli/plan.py parses).

Throughput: AMP's search over (pp, dp, tp, mbs) (search/throughput.py) or, with ``--mode 2bw``, PipeDream-2BW's
planner over (w, d, b, r) (search/pipedream_2bw.py), both keeping only plans the model can run whose every
device's predicted peak fits its memory (search/feasibility.py; predictions from the --db's memory
statistics). Pareto: the frontier of predicted peak memory against predicted iteration time over those plans,
and, with memory statistics, the memory-minimal plan of the CAPTURE search (its lowest-memory end).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybridplan.cli.common import (
    cluster_from,
    find_time_profile,
    load_memory_predictor,
    load_time_profile,
    note_scaling,
    output_plan,
    profile_meta,
    write_output,
)
from hybridplan.cluster import Cluster
from hybridplan.errors import HybridPlanError, UsageError
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import TimeBreakdown, predict_iteration_time
from hybridplan.predict.time_profile import TimeProfile
from hybridplan.search.throughput import pareto_frontier
from hybridplan.units import format_bytes

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel
    from hybridplan.search.feasibility import Feasibility

__all__ = ["throughput", "baseline"]


@dataclass(frozen=True)
class _Row:
    """One plan of the answer: what it is, its predicted time and peak."""

    label: str
    plan: Plan
    time: TimeBreakdown
    peak: float | None
    seconds: float
    """Predicted seconds per iteration (the breakdown's total, or the 2BW planner's, which counts recomputation)."""

    @property
    def samples_per_s(self) -> float:
        return self.plan.global_batch_size / self.seconds if self.seconds > 0 else math.inf


def _targets(args: argparse.Namespace, meta: dict[str, Any]) -> tuple[int, int | None, str]:
    gbs = args.global_batch_size or meta.get("global_batch_size")
    if not gbs:
        raise UsageError("the global batch size is unknown", fix="give --global-batch-size (or a --db whose campaign has one)")
    if gbs < 1:
        raise UsageError(f"--global-batch-size must be positive, got {gbs}")
    m = args.num_microbatches or meta.get("num_microbatches")
    return int(gbs), m, args.schedule or meta.get("schedule") or "1f1b"


def _model_name(args: argparse.Namespace, meta: dict[str, Any], profile: TimeProfile | None = None) -> str | None:
    """The model the plans are for: --model, else the one the profile records if it is a zoo model
    ([Note: a file is data] in models/names.py: a profile naming user code needs --model)."""
    from hybridplan.models.profiled import model_for_profile, recorded_fingerprint

    if meta.get("model") is not None:
        return model_for_profile(meta["model"], args.model, source=f"profile database {args.db!r}",
                                 fingerprint=recorded_fingerprint(meta.get("identity", {})))
    recorded = meta.get("time_identity", {}).get("model") or (profile.model if profile is not None else None)
    source = f"profile database {args.db!r}" if meta.get("time_identity") else f"time profile {args.time_profile!r}"
    return model_for_profile(recorded, args.model, source=source)


def _optional_model(args: argparse.Namespace, meta: dict[str, Any], profile: TimeProfile | None) -> LayeredModel | None:
    """The model whose layer rules plans must follow, if known (an imported third-party profile has none)."""
    name = _model_name(args, meta, profile)
    if name is None:
        return None
    from hybridplan.models.zoo import get_model

    return get_model(name)


def _required_model(args: argparse.Namespace, meta: dict[str, Any], profile: TimeProfile | None) -> LayeredModel:
    name = _model_name(args, meta, profile)
    if name is None:
        raise UsageError("the model is unknown (the profile names none from the zoo)",
                         fix="give --model (zoo name or module:function)")
    from hybridplan.models.zoo import get_model

    return get_model(name)


def _feasibility(args: argparse.Namespace, cluster: Cluster, meta: dict[str, Any], model: LayeredModel | None,
                 schedule: str, gbs: int, m: int | None) -> Feasibility:
    from hybridplan.search.feasibility import Feasibility

    # The search varies the micro-batch count; the predictor re-targets itself per plan (MemoryPredictor.predict).
    predictor = load_memory_predictor(args.db, schedule=schedule, global_batch_size=gbs,
                                      num_microbatches=m if m and gbs % m == 0 else 1, degree_fit=args.degree_fit)
    if predictor is None:
        print("note: no memory statistics (--db): plans are not checked against device memory", file=sys.stderr)
    else:
        note_scaling(predictor)
    recompute = bool(meta.get("identity", {}).get("run_options", {}).get("activation_checkpointing", False))
    return Feasibility(cluster, predictor, model, recompute_profiled=recompute)


def throughput(args: argparse.Namespace) -> int:
    """``--objective throughput`` or ``pareto`` (module docstring)."""
    from hybridplan.search.pipedream_2bw import plan_pipedream_2bw
    from hybridplan.search.throughput import search_throughput

    cluster = cluster_from(args)
    meta = profile_meta(args.db)
    profile = load_time_profile(args.time_profile, args.db)
    gbs, m, schedule = _targets(args, meta)
    if args.mode == "2bw":
        if args.schedule not in (None, "2bw"):
            raise UsageError(f"--mode 2bw plans PipeDream-2BW, whose schedule is '2bw', not {args.schedule!r}", fix="drop --schedule")
        schedule = "2bw"
    fit = _feasibility(args, cluster, meta, _optional_model(args, meta, None), schedule, gbs, m)
    if args.objective == "pareto" and fit.predictor is None:
        raise UsageError("the Pareto objective needs memory predictions", fix="give --db with memory statistics ('hybridplan profile')")
    rows: list[_Row] = []
    started = time.perf_counter()
    if args.mode == "2bw":
        candidates = plan_pipedream_2bw(profile, cluster, gbs, memory_ok=fit)
        for c in candidates:
            label = f"2bw w={c.replicas} d={c.stages} b={c.micro_batch_size} r={int(c.recompute)} m={c.num_microbatches}"
            rows.append(_Row(label, c.plan, predict_iteration_time(c.plan, profile, cluster), None, c.iteration_s))
        what, evaluated = "PipeDream-2BW planner", len(candidates) + fit.rejected
    else:
        result = search_throughput(profile, cluster, gbs, memory_ok=fit, placement=args.placement, seed=args.seed,
                                   node_local_stages=True, schedule=schedule)
        for c in result.candidates:
            label = f"pp={c.pipeline_degree} dp={c.data_degree} tp={c.tensor_degree} mbs={c.micro_batch_size}"
            rows.append(_Row(label, c.plan, c.predicted, None, c.iteration_s))
        what, evaluated = f"AMP search ({args.placement} placement, schedule {schedule})", result.evaluated
    seconds = time.perf_counter() - started
    if fit.predictor is not None:
        rows = [_Row(r.label, r.plan, r.time, fit.peak_memory(r.plan), r.seconds) for r in rows]
    if args.objective == "pareto" and fit.predictor is not None:
        rows += _memory_optimal(args, fit.predictor, cluster, profile, fit)
    print(f"{profile.model} on {cluster.describe()}, global batch {gbs}: {what}, {evaluated} plans evaluated"
          f" in {seconds:.3f} s; {fit.summary()}", file=sys.stderr)
    for kind, reason in fit.reasons.items():
        print(f"  e.g. {kind.replace('_', ' ')}: {reason}", file=sys.stderr)
    if not rows:
        raise UsageError(f"no feasible plan: {fit.summary()}",
                         fix="use more devices, a smaller global batch, or larger --device-memory")
    if args.objective == "pareto":
        return _print_pareto(args, rows, profile, cluster)
    rows.sort(key=lambda r: r.seconds)
    return _print_best(args, rows, profile, cluster, fit)


def _memory_optimal(args: argparse.Namespace, predictor: MemoryPredictor, cluster: Cluster, profile: TimeProfile,
                    fit: Feasibility) -> list[_Row]:
    """The CAPTURE search's memory-minimal plan, as a Pareto candidate (where the time profile can time it)."""
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.search import PlanSpace, solve_exact

    with ProfileStore(args.db, create=False) as store:
        merged = store.get_meta("merge_groups")
    model = predictor.on_units(merged) if merged else predictor
    try:
        result = solve_exact(model, PlanSpace.for_cluster(cluster, model.num_layers))
        plan = result.to_plan(schedule=predictor.schedule, global_batch_size=predictor.global_batch_size,
                              num_microbatches=predictor.num_microbatches)
        plan = model.to_original(plan) if merged else plan
        if not fit(plan):
            return []
        timed = predict_iteration_time(plan, profile, cluster)
        return [_Row("memory-minimal (CAPTURE)", plan, timed, fit.peak_memory(plan), timed.total_s)]
    except HybridPlanError as e:
        print(f"note: the memory-minimal plan is left out: {e.message}", file=sys.stderr)
        return []


def _annotated(plan: Plan, row: _Row, cluster: Cluster, profile: TimeProfile) -> Plan:
    extra: dict[str, Any] = {"model": profile.model, "cluster": cluster.shape, "predicted_iteration_s": row.seconds}
    if row.peak is not None:
        extra["predicted_peak_bytes"] = int(round(row.peak))
    return Plan.from_dict({**plan.to_dict(), **extra})


def _print_best(args: argparse.Namespace, rows: list[_Row], profile: TimeProfile, cluster: Cluster, fit: Feasibility) -> int:
    best = rows[0]
    plan = _annotated(best.plan, best, cluster, profile)
    if output_plan(args, plan):
        return 0
    print(f"{'#':>3} {'time ms':>10} {'samples/s':>10} {'peak memory':>12}  plan")
    for i, r in enumerate(rows[: args.top]):
        print(f"{i + 1:>3} {r.seconds * 1e3:>10.2f} {r.samples_per_s:>10.1f} {format_bytes(r.peak):>12}  {r.label}")
    print(f"fastest plan ({best.label}):")
    print(plan.describe())
    print(best.time.table())
    if best.seconds != best.time.total_s:
        print(f"with the forward pass recomputed in the backward: {best.seconds * 1e3:.1f} ms per iteration")
    prediction = fit.prediction(best.plan)
    if prediction is not None:
        print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
        for d in prediction.devices:
            print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(cluster.memory_of(d.device)):>12}")
    if args.out:
        print(f"written to {args.out}")
    return 0


def _print_pareto(args: argparse.Namespace, rows: list[_Row], profile: TimeProfile, cluster: Cluster) -> int:
    keep = pareto_frontier([(float(r.peak or 0.0), r.seconds) for r in rows])
    frontier = [rows[i] for i in keep]
    data = {"objective": "pareto", "model": profile.model, "cluster": cluster.shape, "frontier": [
        {"label": r.label, "predicted_peak_bytes": int(round(r.peak or 0.0)), "predicted_iteration_s": r.seconds,
         "samples_per_s": r.samples_per_s, "plan": _annotated(r.plan, r, cluster, profile).to_dict()} for r in frontier]}
    if args.out:
        write_output(args.out, json.dumps(data, indent=1) + "\n", "--out")
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"Pareto frontier of predicted peak memory and iteration time ({len(frontier)} of {len(rows)} feasible plans):")
    print(f"{'#':>3} {'peak memory':>12} {'time ms':>10} {'samples/s':>10}  plan")
    for i, r in enumerate(frontier):
        print(f"{i + 1:>3} {format_bytes(r.peak):>12} {r.seconds * 1e3:>10.2f} {r.samples_per_s:>10.1f}  {r.label}")
    if args.out:
        print(f"frontier written to {args.out}")
    return 0


def baseline(args: argparse.Namespace) -> int:
    """``--baseline NAME``: the baseline's plan on the cluster, with its predicted memory and time."""
    from hybridplan.search.baselines import baseline_plan

    cluster = cluster_from(args)
    meta = profile_meta(args.db)
    profile = find_time_profile(args.time_profile, args.db)
    model = _required_model(args, meta, profile)
    gbs, m, schedule = _targets(args, meta)
    if not m:
        raise UsageError("the micro-batch count is unknown", fix="give --num-microbatches (or a --db whose campaign has one)")
    costs = _baseline_costs(args.baseline, model, profile, cluster, gbs // m, meta)
    plan = baseline_plan(args.baseline, num_layers=model.num_layers, cluster=cluster, schedule=schedule,
                         global_batch_size=gbs, num_microbatches=m, layer_costs=costs, stage_degrees=args.stage_degree,
                         parallelism=args.stage_parallelism)
    plan.validate(model=model, cluster=cluster)
    predictor = load_memory_predictor(args.db, schedule=schedule, global_batch_size=gbs, num_microbatches=m,
                                      degree_fit=args.degree_fit)
    if predictor is not None:
        note_scaling(predictor)
    timed = predict_iteration_time(plan, profile, cluster) if profile is not None else None
    prediction = None
    if predictor is not None:
        try:
            prediction = predictor.predict(plan)
        except HybridPlanError as e:
            print(f"note: memory not predicted: {e.message}", file=sys.stderr)
    extra: dict[str, Any] = {"model": model.name, "cluster": cluster.shape}
    if timed is not None:
        extra["predicted_iteration_s"] = timed.total_s
    if prediction is not None:
        extra["predicted_peak_bytes"] = prediction.peak_memory_bytes
    plan = Plan.from_dict({**plan.to_dict(), **extra})
    if output_plan(args, plan):
        return 0
    print(f"baseline {args.baseline}: {model.name} on {cluster.describe()}")
    print(plan.describe())
    if timed is not None:
        print(timed.table())
    if prediction is not None:
        print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
        for d in prediction.devices:
            print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(cluster.memory_of(d.device)):>12}")
        print(f"predicted plan peak: {format_bytes(prediction.peak_memory_bytes)}")
    if args.out:
        print(f"written to {args.out}")
    return 0


def _baseline_costs(name: str, model: LayeredModel, profile: TimeProfile | None, cluster: Cluster, microbatch_size: int,
                    meta: dict[str, Any]) -> list[float] | None:
    """The per-layer costs the baseline weighs (search/baselines.py BASELINES)."""
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
    from hybridplan.experiments.layer_costs import baseline_layer_costs, measure_layer_costs

    precision = meta.get("identity", {}).get("run_options", {}).get("precision", "fp32")
    return baseline_layer_costs(measure_layer_costs(model, precision=precision), name, microbatch_size=microbatch_size)
