"""``hybridplan demo``: the whole loop on the local CPU runtime — profile, plan, validate a small model.

Equivalent to::

    hybridplan profile --model gpt-tiny --cluster 1x4 --global-batch-size 64 --num-microbatches 4 --db DIR/profile.sqlite
    hybridplan plan --db DIR/profile.sqlite --cluster 1x4 --out DIR/plan.json
    hybridplan validate --db DIR/profile.sqlite --plan DIR/plan.json --out DIR/validation.json

Everything is written to DIR; running it again resumes the profiling where it stopped.
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
        help="profile, plan and validate a small model on the local CPU runtime",
        description="The whole loop in one command: profile the model (gpt-tiny by default) on a 1x4 mesh of local CPU "
        "processes, search every plan for the lowest predicted peak memory, then run that plan and compare every "
        "device's measured peak with the prediction. A few minutes on a 2-core machine; running it again resumes.",
        reads="the files of an earlier demo in --dir, if any (to resume).",
        writes="--dir/profile.sqlite (the profile), --dir/plan.json (the recommended plan), --dir/validation.json "
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
    db, plan_file, val_file = out / "profile.sqlite", out / "plan.json", out / "validation.json"
    for path in (db, plan_file, val_file):
        check_output(path, "--dir")

    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.workflows.plan_memory import plan_memory
    from hybridplan.workflows.validate import validate_plan

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()

    say(f"1/3 profiling {args.model} for {cluster.shape} into {db}")
    cfg = CampaignConfig(model=args.model, cluster=cluster, global_batch_size=64, num_microbatches=4,
                         run_options={"backend": args.backend})
    with ProfileStore(db) as store:
        summary = Campaign(cfg, store, progress=say).run()
    say(f"    {summary.runs_executed} runs ({summary.runs_resumed} resumed) in {summary.seconds:.0f} s")

    say("2/3 searching every plan on the mesh for the lowest predicted peak memory")
    answer = plan_memory(db, cluster)
    plan = answer.plan
    write_output(plan_file, plan.to_json(), "--dir")
    say(f"    best plan (predicted peak {format_bytes(answer.search.peak)}), searched in {answer.search.elapsed_s:.3f} s -> {plan_file}")

    say("3/3 running the plan on the CPU runtime and comparing with the prediction")
    report = validate_plan(db, plan, progress=say, model=args.model)
    write_output(val_file, json.dumps(report.to_dict(), indent=1) + "\n", "--dir")
    print(report.table())
    print(f"\nprofile: {db}\nplan: {plan_file}\nvalidation: {val_file}\ntotal {time.perf_counter() - started:.0f} s")
    return 0 if report.run.ok else 1
