"""``hybridplan plan``: recommend a plan: the lowest predicted peak memory (default), the fastest predicted
iteration that fits in memory (``--objective throughput``), the frontier of both (``--objective pareto``),
or a baseline partitioner's plan (``--baseline NAME``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hybridplan.cli.common import (add_cluster, add_command, add_device, add_model, check_output, cluster_from, global_batch,
                                   microbatches, output_plan, positive_int)
from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import SCHEDULES, Cluster
from hybridplan.predict.memory import DEGREE_FITS
from hybridplan.runtime.engines import ENGINES
from hybridplan.search import MeshAttempt
from hybridplan.search.baselines import BASELINES
from hybridplan.units import format_bytes
from hybridplan.workflows.plan_memory import MODES

if TYPE_CHECKING:
    from hybridplan.predict.prediction import PlanPrediction
    from hybridplan.workflows.plan_memory import MemoryPlan


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
        reads="the profile database (--db, read only: memory statistics, layer times); without --db, the simulated "
        "profiles of --model in the cache (built there first where missing: each distinct stage simulated once on fake "
        "tensors); a layer-time JSON (--time-profile); a cluster TOML if --cluster names one.",
        writes="the plan JSON to --out (--objective pareto: the frontier); the plan and its per-device predictions to "
        "the terminal (or the plan JSON with --json).",
        examples=["hybridplan plan --model hf:llama2-7b --cluster 2x8 --device cuda --device-memory 80GiB "
                  "--global-batch-size 64 --num-microbatches 8 --precision bf16",
                  "hybridplan plan --db profile.sqlite --cluster 1x4 --device-memory 16GiB --out best.json",
                  "hybridplan plan --db profile.sqlite --cluster 4x4 --objective throughput --device-memory 40GiB",
                  "hybridplan plan --db profile.sqlite --cluster 1x4 --baseline torchgpipe-time"],
    )
    p.add_argument("--db", help="profile database written by 'hybridplan profile' (memory statistics; layer times);"
                   " without it, --model is profiled on simulated devices (cached) and the whole extended space is"
                   " searched: data x tensor stages, ZeRO-1/2/3, recompute per stage, stages across nodes")
    add_cluster(p)
    w = p.add_argument_group("without --db: a simulated profile (docs/instant-planning.md)")
    add_device(w, help="the devices simulated: cuda counts CUDA allocator blocks, the reserved peak and what CUDA holds"
               " outside the allocator")
    w.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="training precision (mixed precision keeps fp32 master weights; default fp32)")
    p.add_argument("--verify", action="store_true",
                   help="memory objective: simulate the chosen plan's distinct devices on fake tensors (the runtime's"
                   " own work, each distinct stage once) and print their peaks beside the predicted ones; exit 2 if the"
                   " simulation does not fit (a 7B plan: about a minute)")
    w.add_argument("--engine", choices=ENGINES, default="hybridplan",
                   help="whose memory the plan must fit: hybridplan's runtime (default), or Megatron-LM's (its fp32"
                   " gradient buffers simulated; only plans it runs and whose memory is modelled: 1F1B, no ZeRO, a last"
                   " stage without tensor parallelism; docs/engines.md)")
    w.add_argument("--cache-dir", metavar="DIR", help="where simulated stages and profiles are kept (default: $"
                   "HYBRIDPLAN_CACHE_DIR, else the user's cache folder; 'hybridplan cache list')")
    p.add_argument("--objective", choices=("memory", "throughput", "pareto"), default="memory",
                   help="what to minimise (default memory)")
    p.add_argument("--mode", choices=(*MODES, *THROUGHPUT_MODES),
                   help="memory: exact (default; same optimum as exhaustive), exhaustive, bayesian;"
                   " throughput/pareto: amp (default) or 2bw")
    p.add_argument("--pipeline-only", action="store_true", help="only pipeline-parallel stages (mCAP)")
    p.add_argument("--space", choices=("capture", "extended"), default="capture",
                   help="memory objective: CAPTURE's stages (none, data or tensor; default), or extended: also data x"
                   " tensor stages (predicted from the tensor scenario's statistics)")
    p.add_argument("--zero", action="store_true",
                   help="also data stages sharded by ZeRO-1 (predicted from the data scenario), ZeRO-2 and ZeRO-3"
                   " (where the profile has the data<d>-zero3 scenario: profile --zero); throughput/pareto: each data"
                   " stage may take the ZeRO level that makes it fit fastest")
    p.add_argument("--recompute-db", metavar="FILE",
                   help="a profile of the same model and cluster taken with --activation-checkpointing; every stage"
                   " may then recompute its activations (predicted from it) or not, and the plan marks the stages that"
                   " do \"recompute\": \"full\" (throughput/pareto: timed with one more forward per micro-batch)")
    p.add_argument("--allow-cross-node", action="store_true",
                   help="memory objective: also data (and, with --space extended, data x tensor) stages over 2, 4, ..."
                   " whole nodes (tensor groups stay inside a node); default: a stage never spans nodes (CAPTURE)."
                   " throughput/pareto: always so (AMP's strategies put the replicas of a stage larger than a node on"
                   " several nodes, synced over the inter-node link)")
    p.add_argument("--fewest-devices", action="store_true",
                   help="find the smallest sub-mesh on which the model fits (needs --device-memory), in the space the"
                   " other options choose (--space, --zero, --recompute-db, --allow-cross-node)")
    p.add_argument("--schedule", choices=SCHEDULES, help="target schedule (default: the profile's, else 1f1b)")
    p.add_argument("--global-batch-size", type=global_batch, help="target global batch (default: the profile's)")
    p.add_argument("--num-microbatches", type=microbatches, help="target micro-batch count (default: the profile's)")
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log", help="fit for tensor degrees above the profiled ones (a wider data stage is composed, not fitted)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bayesian mode and of annealing")
    p.add_argument("--out", help="write the plan JSON here (--objective pareto: the frontier)")
    p.add_argument("--json", action="store_true", help="print the plan JSON")
    t = p.add_argument_group("throughput, pareto and baselines")
    t.add_argument("--time-profile", metavar="FILE", help="layer-time profile JSON, or several (one per device type)"
                   " separated by commas (default: the --db's layer times)")
    add_model(t, required=False, help="without --db: the model to profile on simulated devices; with it, the model for its"
              " layer rules and baseline costs (default: the profile's zoo model; required when the profile names user"
              " code, which is imported only when you name it here)")
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
    if args.db and (args.device != "cpu" or args.precision != "fp32" or args.cache_dir):
        raise UsageError("--device/--gpu, --precision and --cache-dir choose the simulated profile, used without --db"
                         " (a profile database holds its own device type and precision)",
                         fix="drop them (with --db, --device-memory gives the devices' capacity), or drop --db")
    if not args.db and args.objective != "memory" and not args.time_profile and args.baseline:
        raise UsageError(f"--objective {args.objective} needs layer times, which a simulated profile does not measure",
                         fix="give --db FILE from 'hybridplan profile --time', or --time-profile FILE")
    _engine_options(args)  # an engine's refusals, before any work
    if args.baseline:
        return plan_throughput.baseline(args)
    if args.verify and (args.objective != "memory" or args.json):
        raise UsageError("--verify simulates the plan of the memory objective and prints a table",
                         fix="drop --verify, or use --objective memory without --json (--out still writes the plan)")
    if args.objective != "memory":
        if args.mode is not None and args.mode not in THROUGHPUT_MODES:
            raise UsageError(f"--mode {args.mode} solves the memory objective, not {args.objective!r}",
                             fix=f"use --mode {' or '.join(THROUGHPUT_MODES)} with --objective {args.objective}")
        if args.fewest_devices or args.pipeline_only or args.space != "capture":
            raise UsageError("--fewest-devices, --pipeline-only and --space apply to --objective memory (throughput and"
                             " pareto search AMP's strategies, data x tensor stages included; --zero and"
                             " --recompute-db add their per-stage options)")
        return plan_throughput.throughput(args)
    if args.mode in THROUGHPUT_MODES:
        raise UsageError(f"--mode {args.mode} plans for throughput", fix=f"add --objective throughput (or pareto), or use --mode {'/'.join(MODES)}")
    if not args.db:
        if args.model is None or args.global_batch_size is None or args.num_microbatches is None:
            raise UsageError("without --db, plan profiles the model on simulated devices and needs --model,"
                             " --global-batch-size and --num-microbatches",
                             fix="give them, or --db FILE from 'hybridplan profile'")
        if args.mode == "bayesian":
            raise UsageError("--mode bayesian searches a profile's CAPTURE space", fix="drop --mode, or give --db")
    if args.zero and args.pipeline_only:
        raise UsageError("--zero searches sharded data stages, which --pipeline-only excludes",
                         fix="drop --zero, or --pipeline-only")
    if args.allow_cross_node and args.pipeline_only:
        raise UsageError("--allow-cross-node adds data stages over whole nodes, which --pipeline-only excludes",
                         fix="drop --allow-cross-node, or --pipeline-only")
    if args.pipeline_only and args.space == "extended":
        raise UsageError("--pipeline-only and --space extended contradict each other",
                         fix="choose one: pipeline-only stages (mCAP), or the extended space of data x tensor stages")
    return _memory(args)


def _engine_options(args: argparse.Namespace) -> dict[str, object]:
    """The run options of ``--engine`` (runtime/engines.py; none for hybridplan's runtime), and what an engine
    refuses, checked before any work.

    Raises:
        UsageError: an engine whose memory is not modelled, a schedule or precision it is not modelled in, or an
            option the engine-bound search does not take.
    """
    from hybridplan.plan import Plan, StagePlan
    from hybridplan.runtime.engines import engine_run_options

    if args.engine == "hybridplan":
        return {}
    if args.engine == "torchtitan":
        raise UsageError("--engine torchtitan is not searched yet: torchtitan shards every stage with FSDP2, and the"
                         " engine-bound search keeps to unsharded stages (docs/engines.md)",
                         fix="estimate a torchtitan plan with 'hybridplan estimate-memory --plan PLAN --engine"
                         " torchtitan' (every stage \"zero\": 2 or 3), or plan for megatron or hybridplan")
    if args.db:
        raise UsageError(f"--engine {args.engine} plans from a simulated profile taken the engine's way; a profile"
                         " database holds this runtime's memory", fix="drop --db (give --model), or drop --engine")
    if args.objective != "memory" or args.baseline or args.fewest_devices or args.mode not in (None, "exact") \
            or args.zero or args.pipeline_only:
        raise UsageError(f"--engine {args.engine} searches the lowest predicted peak over the given mesh (the exact"
                         " solver, the whole space the engine runs)",
                         fix="drop --objective, --baseline, --fewest-devices, --mode, --zero and --pipeline-only")
    probe = Plan(args.schedule or "1f1b", 1, 1, (StagePlan(0, 1, "none", 1, (0,)),))
    return engine_run_options(args.engine, plan=probe, precision=args.precision)  # the engine, schedule, precision


def _memory(args: argparse.Namespace) -> int:
    from hybridplan.workflows.plan_memory import MemoryPlan, NoPlanFits, plan_memory

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    cluster = cluster_from(args)
    engine = args.engine != "hybridplan"  # Megatron-LM: its options simulated, its plans only (_engine_options)
    options = _engine_options(args)

    def search(db: str, recompute_db: str | None, whole: bool, tables: Path | None = None,
               mesh: Cluster | None = None) -> MemoryPlan:
        return plan_memory(db, mesh or cluster, schedule=args.schedule, global_batch_size=args.global_batch_size,
                           num_microbatches=args.num_microbatches, degree_fit=args.degree_fit, mode=args.mode or "exact",
                           pipeline_only=args.pipeline_only, composite=whole or args.space == "extended",
                           zero=(whole and not engine) or args.zero, recompute_db=recompute_db,
                           cross_node=whole or args.allow_cross_node, fewest=args.fewest_devices, seed=args.seed,
                           progress=say, say=say, table_cache=tables, unsplit_last_stage=engine)

    if args.db:
        answer = search(args.db, args.recompute_db, False)
    else:
        from hybridplan.workflows.simulated_profile import simulated_profiles

        if args.recompute_db:
            raise UsageError("--recompute-db names a measured profile; without --db the simulated profiles include"
                             " the recomputed one", fix="drop --recompute-db, or give --db")
        with simulated_profiles(args.model, cluster, global_batch_size=args.global_batch_size,
                                num_microbatches=args.num_microbatches, schedule=args.schedule or "1f1b",
                                precision=args.precision, device_type=args.device,
                                zero=not args.pipeline_only and not engine, recompute=True, cache_dir=args.cache_dir,
                                progress=say, run_options=options) as profiles:
            say(f"profiles ready in {profiles.seconds:.1f} s: {profiles.simulated} stage(s) and table(s) simulated,"
                f" {profiles.reused} reused")
            try:
                answer = search(str(profiles.db), str(profiles.recompute_db), not args.pipeline_only, profiles.tables)
            except NoPlanFits as e:
                if args.fewest_devices or args.pipeline_only:
                    raise
                larger = _larger_mesh(cluster, lambda mesh: search(str(profiles.db), str(profiles.recompute_db), True,
                                                                   profiles.tables, mesh), say)
                raise NoPlanFits(f"{e.message}; {larger}", fix=e.fix) from None
    if engine:
        from hybridplan.runtime.engines import engine_run_options

        engine_run_options(args.engine, plan=answer.plan, precision=args.precision)  # the search kept to its plans
        say(f"engine {args.engine}: every stage simulated with its options ({options}); only plans it runs and whose"
            " memory is modelled (1F1B, no ZeRO, a last stage without tensor parallelism; docs/engines.md)")
    for attempt in answer.tried:
        say(f"  tried {attempt.num_nodes}x{attempt.devices_per_node}: {_attempt_text(attempt)}")
    if args.fewest_devices:
        say(f"smallest mesh that fits {format_bytes(answer.cluster.memory_of(0))} per device: {answer.cluster.shape}")
    if output_plan(args, answer.plan):
        return 0
    result, cluster = answer.search, answer.cluster
    print(f"{answer.model} on {cluster.describe()}: {result.solver} search, {result.visited} visited in {result.elapsed_s:.3f} s")
    print(answer.plan.describe())
    print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
    for d in answer.prediction.devices:
        print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(cluster.memory_of(d.device)):>12}")
    print(f"predicted plan peak: {format_bytes(answer.prediction.peak_memory_bytes)}" + (f"; written to {args.out}" if args.out else ""))
    if args.verify:
        _verify(args, answer, say)
    else:
        if not args.db and any(stage.zero >= 2 for stage in answer.plan.stages):
            say("note: this plan's ZeRO-2/3 stages are composed from shorter measured spans, not simulated as they"
                " stand (per device, from 0.8% low to 11.0% high over the 3,430 devices of such stages in the"
                " Llama, Mixtral and Llama-3-70B plans of benchmarks/instant_planning); --verify simulates them")
        near = near_capacity(answer.prediction, cluster)
        if near:
            say(near)
    return 0


RESERVED_MARGIN = 0.21
"""How far below its capacity a CUDA device's predicted need may be and still not fit: what must fit (the reserved
peak and the memory outside the allocator) was predicted up to 13.77% low on a device of Llama-2-7B's 21 plans on
2x8 and up to 20.78% low on Llama-3-8B's 21 on 4x8 (benchmarks/instant_planning, "It fits"): the allocator's excess
over the tensor peak is taken from short profiled spans, and a long stage fragments it more."""


def near_capacity(prediction: PlanPrediction, cluster: Cluster) -> str | None:
    """A note where a CUDA device's predicted need is within :data:`RESERVED_MARGIN` of its capacity (the closest
    such device), else None: that call of "it fits" is the one the prediction cannot make with certainty.

    Example:
        >>> from hybridplan.predict.prediction import DevicePrediction, PlanPrediction
        >>> full = PlanPrediction([DevicePrediction(0, 0, 70 << 30, 1, reserved_peak_bytes=72 << 30,
        ...                                         overhead_bytes=1 << 30, total_bytes=73 << 30)], "quantities")
        >>> near_capacity(full, Cluster.parse("1x1", device_memory="80GiB"))[:46]
        'note: device 0 is predicted to need 73.00 GiB '
        >>> near_capacity(full, Cluster.parse("1x1", device_memory="100GiB")) is None
        True
    """
    close = [(d.needed_bytes / capacity, d) for d in prediction.devices
             if d.reserved_peak_bytes is not None and (capacity := cluster.memory_of(d.device))
             and d.needed_bytes * (1 + RESERVED_MARGIN) > capacity]
    if not close:
        return None
    share, d = max(close, key=lambda c: c[0])
    return (f"note: device {d.device} is predicted to need {format_bytes(d.needed_bytes)} of its"
            f" {format_bytes(cluster.memory_of(d.device))} ({100 * share:.1f}%): within {RESERVED_MARGIN:.0%}, what the"
            " caching allocator reserves was predicted up to 20.8% low on a device (benchmarks/instant_planning,"
            " \"It fits\"); --verify simulates the plan")


def _verify(args: argparse.Namespace, answer: MemoryPlan, say: Callable[[str], None]) -> None:
    """``--verify``: the chosen plan simulated (workflows/estimate_memory.py), beside its prediction.

    Raises:
        PlanError: if a simulated device does not fit its capacity (the prediction said it would).
    """
    from hybridplan.workflows.estimate_memory import estimate_plans

    model = args.model or answer.model
    if model is None:
        raise UsageError("--verify simulates the plan's model, which the profile does not name", fix="give --model")
    if args.db:  # the profile's training options: the plan is verified as it was predicted
        from hybridplan.profiling.database import ProfileDB

        with ProfileDB(args.db) as db:
            taken = db.run_options
        device, precision = taken.get("device_type", "cpu"), taken.get("precision", "fp32")
    else:
        device, precision = args.device or "cpu", args.precision
    say(f"verifying: simulating the chosen plan's distinct devices ({device}, {precision})")
    [estimate] = estimate_plans(model, answer.cluster, [answer.plan], progress=say,
                                run_options={"device_type": device, "precision": precision, **_engine_options(args)})
    predicted = {d.device: d for d in answer.prediction.devices}
    print(f"{'device':>6} {'predicted':>12} {'simulated':>12} {'error':>8} {'+reserved, outside':>19} {'capacity':>12}")
    over = []
    for d in estimate.devices:
        p = predicted[d.device].peak_memory_bytes
        cap = answer.cluster.memory_of(d.device)
        total = "-" if d.overhead_bytes is None else format_bytes(d.total_bytes)
        print(f"{d.device:>6} {format_bytes(p):>12} {format_bytes(d.peak_memory_bytes):>12}"
              f" {100 * (p - d.peak_memory_bytes) / d.peak_memory_bytes:>+7.2f}% {total:>19} {format_bytes(cap):>12}")
        if cap is not None and d.total_bytes > cap:
            over.append((d, cap))
    if over:
        d, cap = max(over, key=lambda dc: dc[0].total_bytes - dc[1])
        raise PlanError(f"the simulated run refutes the prediction: device {d.device} (stage {d.stage}) needs"
                        f" {format_bytes(d.total_bytes)}, more than its {format_bytes(cap)}",
                        fix="plan with less memory per device (a smaller micro-batch, --num-microbatches), or more devices")


_LARGER = (2, 4, 8)
"""How many times the nodes a mesh too small is tried with, for the error's "the smallest that fits"."""


def _larger_mesh(cluster: Cluster, search: Callable[[Cluster], MemoryPlan], say: Callable[[str], None]) -> str:
    """What the error of a mesh too small says: the smallest of 2, 4 and 8 times its nodes on which the model fits
    (the same profiles, searched again: a profile's statistics hold for any number of nodes), or that none does."""
    from hybridplan.workflows.plan_memory import NoPlanFits

    for factor in _LARGER:
        mesh = cluster.with_shape(cluster.num_nodes * factor, cluster.devices_per_node)
        say(f"the model does not fit {cluster.shape}: trying {mesh.shape}")
        try:
            answer = search(mesh)
        except NoPlanFits:
            continue
        return (f"the smallest mesh that fits is {mesh.shape} (predicted peak"
                f" {format_bytes(answer.prediction.peak_memory_bytes)}: hybridplan plan ... --cluster {mesh.shape})")
    tried = ", ".join(f"{cluster.num_nodes * f}x{cluster.devices_per_node}" for f in _LARGER)
    return f"nor does a mesh of more such nodes ({tried} tried)"


def _attempt_text(attempt: MeshAttempt) -> str:
    peak = "no plan" if attempt.peak is None else f"best peak {format_bytes(attempt.peak)}"
    return f"{peak}, {'fits' if attempt.fits else 'does not fit'} ({attempt.note})"
