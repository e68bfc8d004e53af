"""``hybridplan demo``: the whole loop on the local CPU runtime — a first answer in seconds, then profile, plan and
validate a small model.

Equivalent to::

    hybridplan estimate-memory --model gpt-tiny --cluster 1x4 --global-batch-size 64 --num-microbatches 4 --top 1 --out DIR/estimate.json
    hybridplan profile --model gpt-tiny --cluster 1x4 --global-batch-size 64 --num-microbatches 4 --db DIR/profile.sqlite
    hybridplan plan --db DIR/profile.sqlite --cluster 1x4 --out DIR/plan.json
    hybridplan validate --db DIR/profile.sqlite --plan DIR/plan.json --out DIR/validation.json

The first step simulates the uniform plans on fake tensors (workflows/estimate_memory.py: no profile, seconds) so
that a user has an answer before the minutes of profiling; the profile then gives the measured answer, over every
plan of the mesh, and the run checks it. Everything is written to DIR; running it again resumes the profiling
where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hybridplan.cli.common import add_command, check_output, model_name, write_output
from hybridplan.plan.cluster import Cluster
from hybridplan.errors import UsageError
from hybridplan.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "demo",
        help="estimate, then profile, plan and validate a small model on the local CPU runtime",
        description="The whole loop in one command: a first answer in seconds (the uniform plans simulated on fake "
        "tensors, no profile), then profile the model (gpt-tiny by default) on a 1x4 mesh of local CPU "
        "processes, search every plan for the lowest predicted peak memory, then run that plan and compare every "
        "device's measured peak with the prediction. A few minutes on a 2-core machine; running it again resumes.",
        reads="the files of an earlier demo in --dir, if any (to resume).",
        writes="--dir/estimate.json (the first answer: the uniform plan of the lowest simulated peak), --dir/profile.sqlite (the profile), --dir/plan.json (the recommended plan), --dir/validation.json "
        "(predicted against measured); progress and the comparison table to the terminal.",
        examples=["hybridplan demo", "hybridplan demo --dir /tmp/demo --backend sim"],
    )
    p.add_argument("--dir", default="hybridplan-demo", help="where to write the profile, plan and validation")
    p.add_argument("--model", default="gpt-tiny", type=model_name, help="model (default gpt-tiny)")
    p.add_argument("--cluster", default="1x4", help="mesh (default 1x4: four CPU processes)")
    p.add_argument("--backend", choices=("real", "sim"), default="real", help="profile on the real runtime (default) or simulated devices")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    cluster = Cluster.parse(args.cluster)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--dir {str(out)!r} cannot be made: {e.strerror or e}", fix="choose a folder you can write to") from None
    est_file, db, plan_file, val_file = out / "estimate.json", out / "profile.sqlite", out / "plan.json", out / "validation.json"
    for path in (est_file, db, plan_file, val_file):
        check_output(path, "--dir")

    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.workflows.estimate_memory import DIFFERS_FROM_PROFILE, candidate_plans, estimate_plans
    from hybridplan.workflows.plan_memory import plan_memory
    from hybridplan.workflows.validate import validate_plan

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()

    say(f"1/4 a first answer without a profile: simulating the uniform plans of {args.model} on {cluster.shape}")
    candidates = candidate_plans(args.model, cluster, global_batch_size=64, num_microbatches=4)
    estimates = estimate_plans(args.model, cluster, candidates, progress=lambda msg: say(f"    {msg}"))
    first = min(estimates, key=lambda e: e.peak_memory_bytes)
    write_output(est_file, json.dumps(first.to_dict(), indent=1) + "\n", "--dir")
    print(first.table(cluster))
    print(f"({DIFFERS_FROM_PROFILE})")
    say(f"    first answer after {time.perf_counter() - started:.0f} s: {first.plan.describe()} -> {est_file}")

    say(f"2/4 profiling {args.model} for {cluster.shape} into {db}")
    cfg = CampaignConfig(model=args.model, cluster=cluster, global_batch_size=64, num_microbatches=4,
                         run_options={"backend": args.backend})
    with ProfileStore(db) as store:
        summary = Campaign(cfg, store, progress=say).run()
    say(f"    {summary.runs_executed} runs ({summary.runs_resumed} resumed) in {summary.seconds:.0f} s")

    say("3/4 searching every plan on the mesh for the lowest predicted peak memory")
    answer = plan_memory(db, cluster)
    plan = answer.plan
    write_output(plan_file, plan.to_json(), "--dir")
    say(f"    best plan (predicted peak {format_bytes(answer.search.peak)}), searched in {answer.search.elapsed_s:.3f} s -> {plan_file}")

    say("4/4 running the plan on the CPU runtime and comparing with the prediction")
    report = validate_plan(db, plan, progress=say, model=args.model)
    write_output(val_file, json.dumps(report.to_dict(), indent=1) + "\n", "--dir")
    print(report.table())
    print(f"\nfirst answer (uniform plans, simulated): peak {format_bytes(first.peak_memory_bytes)}; measured answer (every "
          f"plan, from the profile): predicted peak {format_bytes(answer.search.peak)}")
    print(f"estimate: {est_file}\nprofile: {db}\nplan: {plan_file}\nvalidation: {val_file}\n"
          f"total {time.perf_counter() - started:.0f} s")
    return 0 if report.run.ok else 1
