"""``hybridplan estimate-memory``: the per-device peak of a plan, or of the best few plans, from simulated devices
in one go: no profiling campaign (workflows/estimate_memory.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from hybridplan.cli.common import (add_cluster, add_command, add_device, add_model, check_output, cluster_from, global_batch,
                                   microbatches, positive_int, write_output)
from hybridplan.errors import UsageError
from hybridplan.plan import SCHEDULES, Plan
from hybridplan.runtime.engines import ENGINES, engine_run_options, not_modelled


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "estimate-memory",
        help="estimate the per-device peak memory of a plan (or the best plans) in one go, without a profile",
        description="Simulate every distinct stage of PLAN once on fake tensors (the runtime's real work, every "
        "tensor counted, no device memory needed) and print each device's peak; with --device cuda in CUDA "
        "allocator terms plus the estimated CUDA context and NCCL memory. Without --plan, simulate the uniform "
        "pipeline x data x tensor plans of the cluster (equal layers per stage) and print the --top with the lowest "
        "peak. The estimate counts exactly what hybridplan's runtime allocates; a measured profile ('hybridplan "
        "profile', then 'predict' or 'validate') remains the way to certainty on real devices. --engine megatron "
        "or torchtitan simulates the runtime holding memory as that engine does where it can (Megatron-LM's fp32 "
        "gradient buffers, torchtitan's FSDP2 in fp32 reductions, both engines' fused Adam and loss on vocabulary "
        "shards) and refuses what it cannot yet (docs/engines.md).",
        reads="the plan JSON (--plan), a cluster TOML if --cluster names one, the --cache file if it exists.",
        writes="a table to the terminal (or JSON with --json); --out: the best plan's JSON; --cache: the simulated "
        "stages (to reuse). Progress on stderr.",
        examples=["hybridplan estimate-memory --model gpt-tiny --cluster 1x4 --plan plan.json",
                  "hybridplan estimate-memory --model gpt3-1.3b --cluster 2x8 --global-batch-size 1024 "
                  "--num-microbatches 64 --top 3 --device cuda --precision bf16 --device-memory 80GB --out best.json"],
    )
    add_model(p)
    add_cluster(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--plan", help="plan JSON file (default: search the uniform plans)")
    which.add_argument("--top", type=positive_int, help="without --plan: how many of the lowest plans to print (default 3)")
    p.add_argument("--global-batch-size", type=global_batch, help="without --plan: the global batch")
    p.add_argument("--num-microbatches", type=microbatches, help="without --plan: the micro-batch count")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="without --plan: the schedule (default 1f1b)")
    add_device(p, help="cuda: peaks in CUDA allocator terms, plus the memory outside tensors")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="training precision")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute every layer's activations")
    p.add_argument("--engine", choices=ENGINES, default="hybridplan",
                   help="whose memory: hybridplan's runtime (default), or the runtime holding it as the engine a plan"
                   " is exported to does (megatron: fp32 gradient buffers; torchtitan: FSDP2 plans, fp32 reductions); what"
                   " is not modelled yet is refused (docs/engines.md)")
    p.add_argument("--cache", metavar="FILE", help="keep the simulated stages in this JSON file and reuse them")
    p.add_argument("--out", help="write the plan of the lowest estimate here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")
    check_output(args.cache, "--cache")
    cluster = cluster_from(args)
    plan = Plan.load(args.plan) if args.plan else None
    if plan is not None:
        for option, value, planned in (("--global-batch-size", args.global_batch_size, plan.global_batch_size),
                                       ("--num-microbatches", args.num_microbatches, plan.num_microbatches)):
            if value is not None and value != planned:
                raise UsageError(f"{option} {value} differs from the plan's {planned}",
                                 fix=f"drop {option} (the plan gives it) or change the plan")
        engine_run_options(args.engine, plan=plan, precision=args.precision, model=args.model)  # refused before any work
    elif args.global_batch_size is None or args.num_microbatches is None:
        raise UsageError("without --plan, estimate-memory searches plans and needs --global-batch-size and"
                         " --num-microbatches", fix="give both, or give --plan")
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    from hybridplan.workflows.estimate_memory import (DIFFERS_FROM_PROFILE, candidate_plans, engine_candidates,
                                                      estimate_plans)

    started = time.perf_counter()
    if plan is None:
        plans = candidate_plans(args.model, cluster, global_batch_size=args.global_batch_size,
                                num_microbatches=args.num_microbatches, schedule=args.schedule)
        plans = _modelled(args, plans, engine_candidates(args.engine, plans, precision=args.precision, model=args.model),
                          say)
        say(f"estimating {len(plans)} uniform plan(s) of {args.model} on {cluster.describe()}")
    else:
        plans = [plan]
    options = {"device_type": args.device, "precision": args.precision,
               "activation_checkpointing": args.activation_checkpointing}
    estimates = estimate_plans(args.model, cluster, plans, run_options=options, engine=args.engine, cache=args.cache,
                               progress=say)
    ranked = sorted(estimates, key=lambda e: e.peak_memory_bytes)[: args.top or 3] if plan is None else estimates
    seconds = time.perf_counter() - started
    engine = {} if args.engine == "hybridplan" else {"engine": args.engine}  # hybridplan's output as it always was
    if args.out:
        write_output(args.out, ranked[0].plan.with_extra(model=args.model, cluster=cluster.shape,
                                                         estimated_peak_bytes=ranked[0].peak_memory_bytes,
                                                         **engine).to_json(), "--out")
    if args.json:
        print(json.dumps({"estimates": [e.to_dict() for e in ranked], "seconds": seconds, **engine,
                          "note": DIFFERS_FROM_PROFILE}, indent=1))
        return 0
    if engine:
        held = ", ".join(f"{k}={v!r}" for k, v in
                         engine_run_options(args.engine, plan=ranked[0].plan, precision=args.precision,
                                            model=args.model).items())
        print(f"engine: {args.engine}: hybridplan's runtime run with {held} to hold memory as {args.engine} does;"
              f" not modelled: {'; '.join(not_modelled(args.engine))} (docs/engines.md)")
    for i, e in enumerate(ranked):
        if plan is None:
            print(f"\n#{i + 1} of {len(estimates)}" + ("" if e.fits(cluster) else " (does not fit)"))
        print(e.table(cluster))
    print(f"\n{seconds:.1f} s. {DIFFERS_FROM_PROFILE}")
    return 0


def _modelled(args: argparse.Namespace, plans: list[Plan], split: tuple[list[Plan], list[tuple[Plan, UsageError]]],
              say: Callable[[str], None]) -> list[Plan]:
    """The candidate plans whose memory under ``--engine`` is modelled; a note for each other, or the reason when
    none is left."""
    kept, refused = split
    for p, e in refused:
        grid = f"pipeline {p.num_stages} x data {p.stages[0].data_degree} x tensor {p.stages[0].tensor_degree}"
        say(f"note: skipped the uniform plan {grid}: not modelled for --engine {args.engine}: {e.message}")
    if not kept:
        reason = refused[0][1]
        raise UsageError(f"no uniform plan of {args.model} is modelled for --engine {args.engine}: {reason.message}",
                         fix=reason.fix)
    return kept
