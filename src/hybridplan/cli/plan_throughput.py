"""``hybridplan plan --objective throughput|pareto`` and ``hybridplan plan --baseline NAME`` (cli/plan.py parses;
the work is workflows/plan_throughput.py and workflows/baseline.py): print what they answer."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hybridplan.cli.common import cluster_from, output_plan, write_output
from hybridplan.errors import UsageError
from hybridplan.units import format_bytes
from hybridplan.workflows.sources import Sources

if TYPE_CHECKING:
    from hybridplan.workflows.plan_throughput import ThroughputPlans

__all__ = ["throughput", "baseline"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def throughput(args: argparse.Namespace) -> int:
    """``--objective throughput`` or ``pareto`` (workflows/plan_throughput.py); without ``--db`` or
    ``--time-profile``, on simulated memory profiles and estimated layer times (:func:`_estimated`)."""
    from hybridplan.workflows.plan_throughput import plan_throughput

    if not args.db and not args.time_profile:
        return _estimated(args)
    cluster = cluster_from(args)
    with Sources.open(args.db, time_profile=args.time_profile, model=args.model, warn=_say) as sources:
        answer = plan_throughput(sources, cluster, objective=args.objective, mode=args.mode or "amp",
                                 global_batch_size=args.global_batch_size, num_microbatches=args.num_microbatches,
                                 schedule=args.schedule, placement=args.placement, seed=args.seed,
                                 degree_fit=args.degree_fit, progress=_say, zero=args.zero,
                                 recompute_db=args.recompute_db)
    if args.objective == "pareto":
        return _print_pareto(args, answer)
    return _print_best(args, answer)


def _estimated(args: argparse.Namespace) -> int:
    """No measured profile: memory from the simulated profiles, as ``plan --objective memory`` without ``--db``
    builds them (workflows/simulated_profile.py), searched over the whole extended space (ZeRO and recompute per
    stage); layer times ESTIMATED from FLOP and byte counts at the GPU's peak rates (profiling/estimated_times.py),
    and said so in the output.

    Raises:
        UsageError: a missing model or batch, ``--recompute-db``, or devices of no known peak rate (CPU devices, a
            CUDA device of no named GPU): before anything is simulated.
    """
    from hybridplan.models.zoo import resolve_model
    from hybridplan.profiling.estimated_times import estimated_time_profile, peak_rates
    from hybridplan.profiling.stage_memo import StageMemo
    from hybridplan.search.time.throughput import divisors
    from hybridplan.workflows.plan_throughput import plan_throughput
    from hybridplan.workflows.simulated_profile import default_cache_dir, simulated_profiles

    if args.model is None or args.global_batch_size is None or args.num_microbatches is None:
        raise UsageError(f"--objective {args.objective} without --db estimates layer times and simulates memory, and"
                         " needs --model, --global-batch-size and --num-microbatches",
                         fix="give them, or --db FILE from 'hybridplan profile --time'")
    if args.recompute_db:
        raise UsageError("--recompute-db names a measured profile; without --db the simulated profiles include the"
                         " recomputed one", fix="drop --recompute-db, or give --db")
    cluster = cluster_from(args)
    peak_rates(cluster, args.precision)  # no peak rate (CPU devices): refused before anything is simulated
    model = resolve_model(args.model)
    with simulated_profiles(args.model, cluster, global_batch_size=args.global_batch_size,
                            num_microbatches=args.num_microbatches, schedule=args.schedule or "1f1b",
                            precision=args.precision, device_type=args.device, zero=True, recompute=True,
                            cache_dir=args.cache_dir, progress=_say) as profiles:
        _say(f"profiles ready in {profiles.seconds:.1f} s: {profiles.simulated} stage(s) and table(s) simulated,"
             f" {profiles.reused} reused")
        root = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
        memo = StageMemo(root / "stages", on_unusable=_say) if profiles.cached else StageMemo()
        times = estimated_time_profile(model, cluster, precision=args.precision,
                                       micro_batch_sizes=divisors(args.global_batch_size), memo=memo, progress=_say)
        two_bw = args.mode == "2bw"  # PipeDream-2BW's planner has no per-stage ZeRO or recompute
        with Sources.open(profiles.db, model=args.model, warn=_say, given_time_profile=times.profile) as sources:
            answer = plan_throughput(sources, cluster, objective=args.objective, mode=args.mode or "amp",
                                     global_batch_size=args.global_batch_size, num_microbatches=args.num_microbatches,
                                     schedule=args.schedule, placement=args.placement, seed=args.seed,
                                     degree_fit=args.degree_fit, progress=_say, zero=not two_bw,
                                     recompute_db=None if two_bw else profiles.recompute_db, table_cache=profiles.tables)
    print(times.describe(), file=sys.stderr if args.json else sys.stdout)
    if args.objective == "pareto":
        return _print_pareto(args, answer)
    return _print_best(args, answer)


def _print_best(args: argparse.Namespace, answer: ThroughputPlans) -> int:
    best = answer.best
    if output_plan(args, best.plan):
        return 0
    print(f"{'#':>3} {'time ms':>10} {'samples/s':>10} {'peak memory':>12}  plan")
    for i, r in enumerate(answer.candidates[: args.top]):
        print(f"{i + 1:>3} {r.seconds * 1e3:>10.2f} {r.samples_per_s:>10.1f} {format_bytes(r.peak):>12}  {r.label}")
    print(f"fastest plan ({best.label}):")
    print(best.plan.describe())
    print(best.time.table())
    if best.seconds != best.time.total_s:
        print(f"with the forward pass recomputed in the backward: {best.seconds * 1e3:.1f} ms per iteration")
    prediction = answer.feasibility.prediction(best.plan)
    if prediction is not None:
        print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
        for d in prediction.devices:
            print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(answer.cluster.memory_of(d.device)):>12}")
    if args.out:
        print(f"written to {args.out}")
    return 0


def _print_pareto(args: argparse.Namespace, answer: ThroughputPlans) -> int:
    frontier = answer.candidates
    data = {"objective": "pareto", "model": answer.profile.model, "cluster": answer.cluster.shape, "frontier": [
        {"label": r.label, "predicted_peak_bytes": int(round(r.peak or 0.0)), "predicted_iteration_s": r.seconds,
         "samples_per_s": r.samples_per_s, "plan": r.plan.to_dict()} for r in frontier]}
    if args.out:
        write_output(args.out, json.dumps(data, indent=1) + "\n", "--out")
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"Pareto frontier of predicted peak memory and iteration time ({len(frontier)} of {answer.feasible} feasible plans):")
    print(f"{'#':>3} {'peak memory':>12} {'time ms':>10} {'samples/s':>10}  plan")
    for i, r in enumerate(frontier):
        print(f"{i + 1:>3} {format_bytes(r.peak):>12} {r.seconds * 1e3:>10.2f} {r.samples_per_s:>10.1f}  {r.label}")
    if args.out:
        print(f"frontier written to {args.out}")
    return 0


def baseline(args: argparse.Namespace) -> int:
    """``--baseline NAME``: the baseline's plan on the cluster, with its predicted memory and time."""
    from hybridplan.workflows.baseline import plan_baseline

    cluster = cluster_from(args)
    with Sources.open(args.db, time_profile=args.time_profile, model=args.model, warn=_say) as sources:
        answer = plan_baseline(args.baseline, sources, cluster, global_batch_size=args.global_batch_size,
                               num_microbatches=args.num_microbatches, schedule=args.schedule,
                               stage_degree=args.stage_degree, stage_parallelism=args.stage_parallelism,
                               degree_fit=args.degree_fit)
    if output_plan(args, answer.plan):
        return 0
    print(f"baseline {args.baseline}: {answer.model} on {cluster.describe()}")
    print(answer.plan.describe())
    if answer.time is not None:
        print(answer.time.table())
    if answer.prediction is not None:
        print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
        for d in answer.prediction.devices:
            print(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>15} {format_bytes(cluster.memory_of(d.device)):>12}")
        print(f"predicted plan peak: {format_bytes(answer.prediction.peak_memory_bytes)}")
    if args.out:
        print(f"written to {args.out}")
    return 0
