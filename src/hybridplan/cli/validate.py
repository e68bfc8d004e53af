"""``hybridplan validate``: run a plan and compare measured with predicted per-device peak memory."""

from __future__ import annotations

import argparse
import json
import sys

from hybridplan.cli.common import (
    add_cluster,
    add_command,
    add_model,
    add_share_gpu,
    check_output,
    cluster_from,
    positive_int,
    write_output,
)
from hybridplan.errors import UsageError
from hybridplan.plan import Plan
from hybridplan.predict.memory import DEGREE_FITS


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "validate",
        help="run a plan and compare measured with predicted peak memory",
        description="Predict every device's peak memory of PLAN from the profile database, run the plan with the "
        "profiled model and training settings (real processes, or simulated devices if the profile was simulated), "
        "and print predicted against measured peaks per device with the relative error. Exit code 1 if the run "
        "ended with 'oom' or 'failed'.",
        reads="the profile database (--db, read only), the plan JSON (--plan), a cluster TOML if --cluster names one.",
        writes="the validation JSON to --out (plan, status, per-device predicted and measured peaks, errors); a table "
        "to the terminal (or the JSON with --json).",
        examples=["hybridplan validate --db profile.sqlite --plan best.json --out v.json",
                  "hybridplan validate --db mlp.sqlite --plan plan.json --model mypkg.models:mlp   # a user model"],
    )
    p.add_argument("--db", required=True, help="profile database written by 'hybridplan profile'")
    p.add_argument("--plan", required=True, help="plan JSON file")
    add_model(p, required=False, help="the model to run (default: the profiled zoo model); required when the profile"
              " names user code (module:function), which is imported only when you name it here")
    add_cluster(p, required=False)
    p.add_argument("--iterations", type=positive_int, default=2, help="iterations of the run (default 2: warm-up + measured)")
    p.add_argument("--recompute-db", help="a profile of the same model and cluster taken with"
                   " --activation-checkpointing: predicts the stages the plan marks \"recompute\": \"full\"")
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log", help="fit for tensor degrees above the profiled ones (a wider data stage is composed, not fitted)")
    p.add_argument("--backend", choices=("real", "sim"), help="run on the real runtime or simulated devices (default: the profile's)")
    add_share_gpu(p)
    p.add_argument("--out", help="write the validation JSON here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.workflows.validate import validate_plan

    check_output(args.out, "--out")
    if args.device_memory and not args.cluster:
        raise UsageError("--device-memory sets the capacity of the --cluster's devices, and no --cluster was given",
                         fix="add --cluster NxK (the plan's mesh), or drop --device-memory to use the profiled capacity")
    plan = Plan.load(args.plan)
    cluster = cluster_from(args) if args.cluster else None
    report = validate_plan(args.db, plan, cluster=cluster, iterations=args.iterations, degree_fit=args.degree_fit,
                           progress=lambda msg: print(msg, file=sys.stderr),
                           run_options=_run_options(args), model=args.model,
                           recompute_db=args.recompute_db)
    text = json.dumps(report.to_dict(), indent=1)
    print(text if args.json else report.table())
    if args.out:
        write_output(args.out, text + "\n", "--out")
    return 0 if report.run.ok else 1


def _run_options(args: argparse.Namespace) -> dict | None:
    """The run settings the command line overrides in the profile's (None: none)."""
    options = {**({"backend": args.backend} if args.backend else {}), **({"share_gpu": True} if args.share_gpu else {})}
    return options or None
