"""``hybridplan estimate``: the predicted iteration time of a plan and its parts per stage (AMP's cost model,
predict/time_model.py), and its predicted per-device peak memory when the database has memory statistics."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hybridplan.cli.common import add_cluster, add_command, cluster_from
from hybridplan.errors import ProfileError
from hybridplan.plan import Plan
from hybridplan.predict.memory import DEGREE_FITS
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.units import format_bytes
from hybridplan.workflows.sources import Sources, Targets


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "estimate",
        help="predict a plan's iteration time (per stage) and, with memory statistics, its per-device peak memory",
        description="Predict the seconds per iteration of PLAN with AMP's cost model: per stage, the forward, backward "
        "and tensor-parallel seconds of one micro-batch, the pipeline transfer to the next stage and the data-parallel "
        "gradient all-reduce; then the pipeline and the iteration. Layer times come from --time-profile or the "
        "--db's layer times (hybridplan profile --time); device speeds and bandwidths from the cluster. With a --db "
        "that holds memory statistics, also the per-device peak memory against the devices' capacity.",
        reads="the plan JSON (--plan); a layer-time JSON (--time-profile) and/or the profile database (--db, read "
        "only); a cluster TOML if --cluster names one.",
        writes="a table to the terminal (or JSON with --json). No files.",
        examples=["hybridplan estimate --db profile.sqlite --cluster 1x4 --plan plan.json",
                  "hybridplan estimate --time-profile times.json --cluster cluster.toml --plan plan.json --json"],
    )
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--time-profile", metavar="FILE", help="layer-time profile JSON, or several (one per device type)"
                   " separated by commas (default: the --db's layer times)")
    p.add_argument("--db", help="profile database: layer times and/or memory statistics")
    add_cluster(p)
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log", help="memory: fit for degrees above the profiled ones")
    p.add_argument("--blocking-p2p", action="store_true", help="model blocking sends instead of AMP's overlap (section 6.1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    cluster = cluster_from(args)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    with Sources.open(args.db, time_profile=args.time_profile, warn=say) as sources:
        profile = sources.time_profile()
        plan.validate(num_layers=profile.num_layers, cluster=cluster)
        time = predict_iteration_time(plan, profile, cluster, overlap_p2p=not args.blocking_p2p)
        targets = Targets(plan.global_batch_size, plan.num_microbatches, plan.schedule)
        predictor = sources.memory_predictor(targets, degree_fit=args.degree_fit)
    memory: dict[str, Any] | None = None
    memory_error = None
    if predictor is not None:
        try:
            memory = predictor.predict(plan).to_dict()
        except ProfileError as e:
            memory_error = e.message
    if args.json:
        out = {"plan": plan.to_dict(), "cluster": cluster.shape, "time_profile": profile.source, "time": time.to_dict(),
               "samples_per_s": plan.global_batch_size / time.total_s if time.total_s > 0 else None,
               "memory": memory, "memory_error": memory_error}
        print(json.dumps(out, indent=1))
        return 0
    print(plan.describe())
    print(f"on {cluster.describe()}; layer times: {profile.source or profile.model}")
    print(time.table())
    if profile.links is None and cluster.intra_node_latency is None and cluster.inter_node_latency is None:
        print("(no per-message latency: the time profile has no measured links and the cluster gives none; alpha = 0)")
    if time.total_s > 0:
        print(f"throughput: {plan.global_batch_size / time.total_s:.1f} samples/s")
    if memory is not None:
        print(f"{'device':>6} {'stage':>5} {'predicted peak':>15} {'capacity':>12}")
        for d in memory["devices"]:
            capacity = cluster.memory_of(d["device"])
            over = "" if capacity is None or d["peak_memory_bytes"] <= capacity else "  over capacity"
            print(f"{d['device']:>6} {d['stage']:>5} {format_bytes(d['peak_memory_bytes']):>15} {format_bytes(capacity):>12}{over}")
        print(f"predicted plan peak: {format_bytes(memory['peak_memory_bytes'])}")
    elif memory_error is not None:
        print(f"memory: not predicted: {memory_error}")
    return 0
