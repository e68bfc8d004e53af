"""``hybridplan plan``: recommend a plan: the lowest predicted peak memory (default), the fastest predicted
iteration that fits in memory (``--objective throughput``), the frontier of both (``--objective pareto``),
or a baseline partitioner's plan (``--baseline NAME``)."""

from __future__ import annotations

import argparse
import sys

from hybridplan.cli.common import add_cluster, add_command, add_model, check_output, cluster_from, note_scaling, output_plan, positive_int
from hybridplan.cluster import Cluster
from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import SCHEDULES
from hybridplan.predict.memory import DEGREE_FITS, MemoryPredictor, PlanPrediction
from hybridplan.profiling.store import ProfileStore
from hybridplan.search import MeshAttempt, PlanSpace, fewest_devices, solve_bayesian, solve_exact, solve_exhaustive
from hybridplan.search.baselines import BASELINES
from hybridplan.units import format_bytes

MODES = {"exact": solve_exact, "exhaustive": solve_exhaustive, "bayesian": solve_bayesian}
"""Solvers of the memory objective."""

THROUGHPUT_MODES = ("amp", "2bw")
"""Planners of the throughput and Pareto objectives: AMP's search over (pp, dp, tp, mbs), or PipeDream-2BW's
over (w, d, b, r)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "plan",
        help="recommend a plan: lowest predicted peak memory, fastest predicted iteration, or their trade-off",
        description="--objective memory (default): search every partitioning and parallelization plan on the mesh "
        "(CAPTURE) for the lowest predicted per-device peak memory, ties broken by dropping the highest device and "
        "comparing the rest; the schedule, global batch and micro-batch count stay fixed (the profile's, or "
        "--schedule / --global-batch-size / --num-microbatches). With --device-memory, a plan that does not fit is "
        "an error (exit code 2) naming the device and by how much. --objective throughput: the fastest predicted "
        "iteration (AMP's cost model and search, or PipeDream-2BW's planner with --mode 2bw) among plans whose every "
        "device's predicted peak fits its memory. --objective pareto: the frontier of predicted peak memory against "
        "iteration time. --baseline NAME: the plan a baseline partitioner gives, with its predictions.",
        reads="the profile database (--db, read only: memory statistics, layer times); a layer-time JSON "
        "(--time-profile); a cluster TOML if --cluster names one.",
        writes="the plan JSON to --out (--objective pareto: the frontier); the plan and its per-device predictions to "
        "the terminal (or the plan JSON with --json).",
        examples=["hybridplan plan --db profile.sqlite --cluster 1x4 --device-memory 16GiB --out best.json",
                  "hybridplan plan --db profile.sqlite --cluster 4x4 --objective throughput --device-memory 40GiB",
                  "hybridplan plan --db profile.sqlite --cluster 1x4 --baseline torchgpipe-time"],
    )
    p.add_argument("--db", help="profile database written by 'hybridplan profile' (memory statistics; layer times)")
    add_cluster(p)
    p.add_argument("--objective", choices=("memory", "throughput", "pareto"), default="memory",
                   help="what to minimise (default memory)")
    p.add_argument("--mode", choices=(*MODES, *THROUGHPUT_MODES),
                   help="memory: exact (default; same optimum as exhaustive), exhaustive, bayesian;"
                   " throughput/pareto: amp (default) or 2bw")
    p.add_argument("--pipeline-only", action="store_true", help="only pipeline-parallel stages (mCAP)")
    p.add_argument("--fewest-devices", action="store_true", help="find the smallest sub-mesh on which the model fits (needs --device-memory)")
    p.add_argument("--schedule", choices=SCHEDULES, help="target schedule (default: the profile's, else 1f1b)")
    p.add_argument("--global-batch-size", type=positive_int, help="target global batch (default: the profile's)")
    p.add_argument("--num-microbatches", type=positive_int, help="target micro-batch count (default: the profile's)")
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log", help="fit for degrees above the profiled ones")
    p.add_argument("--seed", type=int, default=0, help="seed of the bayesian mode and of annealing")
    p.add_argument("--out", help="write the plan JSON here (--objective pareto: the frontier)")
    p.add_argument("--json", action="store_true", help="print the plan JSON")
    t = p.add_argument_group("throughput, pareto and baselines")
    t.add_argument("--time-profile", metavar="FILE", help="layer-time profile JSON (default: the --db's layer times)")
    add_model(t, required=False, help="the model, for its layer rules and baseline costs (default: the profile's zoo "
              "model; required when the profile names user code, which is imported only when you name it here)")
    t.add_argument("--placement", choices=("megatron", "anneal"), default="megatron",
                   help="amp mode: Megatron's rank placement (default), or also simulated annealing of the best few")
    t.add_argument("--top", type=positive_int, default=10, help="candidates to list (default 10)")
    t.add_argument("--baseline", choices=tuple(BASELINES), help="the plan of a baseline partitioner: " + "; ".join(
        f"{k}: {v}" for k, v in BASELINES.items()))
    t.add_argument("--stage-degree", type=positive_int, default=1, help="--baseline: devices per stage (default 1)")
    t.add_argument("--stage-parallelism", choices=("data", "tensor"), default="data",
                   help="--baseline: kind of the stages with --stage-degree > 1 (default data)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.cli import plan_throughput

    check_output(args.out, "--out")
    if args.baseline:
        return plan_throughput.baseline(args)
    if args.objective != "memory":
        if args.mode is not None and args.mode not in THROUGHPUT_MODES:
            raise UsageError(f"--mode {args.mode} solves the memory objective, not {args.objective!r}",
                             fix=f"use --mode {' or '.join(THROUGHPUT_MODES)} with --objective {args.objective}")
        if args.fewest_devices or args.pipeline_only:
            raise UsageError("--fewest-devices and --pipeline-only apply to --objective memory")
        return plan_throughput.throughput(args)
    if args.mode in THROUGHPUT_MODES:
        raise UsageError(f"--mode {args.mode} plans for throughput", fix=f"add --objective throughput (or pareto), or use --mode {'/'.join(MODES)}")
    if not args.db:
        raise UsageError("--objective memory needs a profile database", fix="give --db FILE from 'hybridplan profile'")
    return _memory(args)


def _memory(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    predictor = MemoryPredictor.from_db(
        args.db, schedule=args.schedule, global_batch_size=args.global_batch_size,
        num_microbatches=args.num_microbatches, degree_fit=args.degree_fit,
    )
    note_scaling(predictor)
    with ProfileStore(args.db, create=False) as store:
        model_name = store.get_meta("model")
        merged = store.get_meta("merge_groups")
    # With merged layers (profile --merge-layers) the search runs on them and maps the plan back.
    model = predictor.on_units(merged) if merged else predictor
    L = model.num_layers
    print(f"searching plans of {L} {'merged ' if merged else ''}layers on {cluster.describe()} for the lowest predicted"
          f" peak memory; {_held_fixed(predictor)}", file=sys.stderr)
    if args.fewest_devices:
        capacity = cluster.memory_of(0)
        if capacity is None:
            raise UsageError("--fewest-devices needs a device capacity", fix="give --device-memory, e.g. 40GiB")
        found = fewest_devices(model, cluster, L, capacity=capacity, pipeline_only=args.pipeline_only)
        for attempt in found.tried:
            print(f"  tried {attempt.num_nodes}x{attempt.devices_per_node}: {_attempt_text(attempt)}", file=sys.stderr)
        result, cluster = found.result, found.cluster
        print(f"smallest mesh that fits {format_bytes(capacity)} per device: {cluster.shape}", file=sys.stderr)
    else:
        space = PlanSpace.for_cluster(cluster, L, pipeline_only=args.pipeline_only)
        mode = args.mode or "exact"
        solver = MODES[mode]
        result = solver(model, space, seed=args.seed) if mode == "bayesian" else solver(model, space)
    plan = result.to_plan(
        schedule=predictor.schedule, global_batch_size=predictor.global_batch_size, num_microbatches=predictor.num_microbatches
    )
    if merged:
        plan = model.to_original(plan)
    plan = type(plan).from_dict({**plan.to_dict(), "model": model_name, "cluster": cluster.shape,
                                 "predicted_peak_bytes": int(round(result.peak))})
    prediction = predictor.predict(plan)
    _check_fits(prediction, cluster, predictor, exhaustive=args.mode in (None, "exact", "exhaustive"))
    if output_plan(args, plan):
        return 0
    print(f"{model_name} on {cluster.describe()}: {result.solver} search, {result.visited} visited in {result.elapsed_s:.3f} s")
    print(plan.describe())
    print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
    for d in prediction.devices:
        print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(cluster.memory_of(d.device)):>12}")
    print(f"predicted plan peak: {format_bytes(prediction.peak_memory_bytes)}" + (f"; written to {args.out}" if args.out else ""))
    return 0


def _held_fixed(predictor: MemoryPredictor) -> str:
    """What the memory search does not vary, and how to vary it (issue: users took it for the lowest possible)."""
    return (f"held fixed: schedule {predictor.schedule}, global batch {predictor.global_batch_size} in"
            f" {predictor.num_microbatches} micro-batches of {predictor.microbatch_size} (other values: --schedule,"
            " --num-microbatches; --objective pareto also varies the micro-batch count)")


def _check_fits(prediction: PlanPrediction, cluster: Cluster, predictor: MemoryPredictor, *, exhaustive: bool) -> None:
    """Refuse to present a plan as the answer if a device's predicted peak exceeds its capacity.

    Raises:
        PlanError: naming every device over its capacity, by how much, and what would lower the peak.
    """
    over = [(d, cluster.memory_of(d.device)) for d in prediction.devices
            if cluster.memory_of(d.device) is not None and d.peak_memory_bytes > cluster.memory_of(d.device)]
    if not over:
        return
    worst, capacity = max(over, key=lambda dc: dc[0].peak_memory_bytes - dc[1])
    uniform = len({cluster.memory_of(i) for i in range(cluster.num_devices)}) == 1
    claim = ("so no plan of this search fits" if exhaustive and uniform else
             "(this search does not weigh per-device capacities: --objective throughput keeps only plans that fit)"
             if not uniform else "(the bayesian search may miss lower plans: try --mode exact)")
    raise PlanError(
        f"the lowest-memory plan does not fit: device {worst.device} (stage {worst.stage}) needs"
        f" {format_bytes(worst.peak_memory_bytes)}, {format_bytes(worst.peak_memory_bytes - capacity)} more than its"
        f" {format_bytes(capacity)}" + (f", and {len(over) - 1} more device(s) exceed theirs" if len(over) > 1 else "")
        + f"; {claim}",
        fix=_remedies(predictor),
    )


def _remedies(predictor: MemoryPredictor) -> str:
    B, m = predictor.global_batch_size, predictor.num_microbatches
    more = next((c for c in range(m + 1, B + 1) if B % c == 0), None)
    smaller = (f"smaller micro-batches (e.g. --num-microbatches {more}: {B // more} samples each instead of {B // m}), "
               if more is not None else "")
    return (smaller + "activation checkpointing (profile with --activation-checkpointing), more or larger devices, or"
            " --objective pareto to see plans that trade time for memory")


def _attempt_text(attempt: MeshAttempt) -> str:
    peak = "no plan" if attempt.peak is None else f"best peak {format_bytes(attempt.peak)}"
    return f"{peak}, {'fits' if attempt.fits else 'does not fit'} ({attempt.note})"
