"""``hybridplan validate``: run a plan and compare measured with predicted per-device peak memory."""

from __future__ import annotations

import argparse
import json
import sys

from hybridplan.cli.common import add_cluster, cluster_from
from hybridplan.plan import Plan
from hybridplan.predict.memory import DEGREE_FITS
from hybridplan.predict.validation import validate_plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="run a plan and compare measured with predicted peak memory")
    p.add_argument("--db", required=True, help="profile database written by 'hybridplan profile'")
    p.add_argument("--plan", required=True, help="plan JSON file")
    add_cluster(p, required=False)
    p.add_argument("--iterations", type=int, default=2, help="iterations of the run (default 2: warm-up + measured)")
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log")
    p.add_argument("--backend", choices=("real", "sim"), help="run on the real runtime or simulated devices (default: the profile's)")
    p.add_argument("--out", help="write the validation JSON here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    cluster = cluster_from(args) if args.cluster else None
    report = validate_plan(args.db, plan, cluster=cluster, iterations=args.iterations, degree_fit=args.degree_fit,
                           progress=lambda msg: print(msg, file=sys.stderr),
                           run_options={"backend": args.backend} if args.backend else None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.table())
    return 0 if report.run.ok else 1

