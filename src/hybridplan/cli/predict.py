"""``hybridplan predict``: predicted per-device peak memory of a plan, from a profile."""

from __future__ import annotations

import argparse
import json

from hybridplan.cli.common import add_command, note_scaling
from hybridplan.plan import Plan
from hybridplan.predict.memory import DEGREE_FITS, MemoryPredictor
from hybridplan.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "predict",
        help="predict per-device peak memory of a plan from a profile",
        description="Predict the peak memory of every device of PLAN from the profile database's per-layer "
        "statistics, at the plan's schedule, global batch and micro-batch count (scaled from the profiled batch "
        "sizes; a target far beyond them is warned about). Runs nothing: answers in about a second.",
        reads="the profile database (--db, read only) and the plan JSON (--plan).",
        writes="a table to the terminal: per device its stage, micro-batches in flight and predicted peak (or the "
        "prediction as JSON with --json). No files.",
        examples=["hybridplan predict --db profile.sqlite --plan plan.json",
                  "hybridplan predict --db profile.sqlite --plan plan.json --method capture --json"],
    )
    p.add_argument("--db", required=True, help="profile database written by 'hybridplan profile'")
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--recompute-db", help="a profile of the same model and cluster taken with"
                   " --activation-checkpointing: predicts the stages the plan marks \"recompute\": \"full\"")
    p.add_argument("--degree-fit", choices=DEGREE_FITS, default="log", help="fit for tensor degrees above the profiled ones (a wider data stage is composed, not fitted)")
    p.add_argument("--method", choices=("quantities", "capture"), default="quantities",
                   help="quantities: schedule-aware (default); capture: seed 000's peak statistics")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    plan = Plan.load(args.plan)
    predictor = MemoryPredictor.from_db(
        args.db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
        num_microbatches=plan.num_microbatches, degree_fit=args.degree_fit, method=args.method,
        recompute_db=args.recompute_db,
    )
    note_scaling(predictor)
    prediction = predictor.predict(plan)
    if args.json:
        print(json.dumps(prediction.to_dict(), indent=1))
        return 0
    print(plan.describe())
    # CUDA profiles: the tensor peak, the allocator's reserved peak, the memory outside the allocator and their total
    # (reserved + outside; tensor + outside, a lower bound, from a profile without reserved gaps: predict/prediction.py
    # [Note: predicting a CUDA device])
    cuda = predictor.device_type == "cuda"
    exact = all(d.reserved_peak_bytes is not None for d in prediction.devices)
    print(f"{'device':>6} {'stage':>5} {'in-flight':>9} {'predicted peak':>15}"
          + (f" {'reserved':>12} {'outside':>12} {'total' if exact else 'total (min)':>12}" if cuda else ""))
    for d in prediction.devices:
        reserved = "-" if d.reserved_peak_bytes is None else format_bytes(d.reserved_peak_bytes)
        print(f"{d.device:>6} {d.stage:>5} {d.in_flight:>9} {format_bytes(d.peak_memory_bytes):>15}"
              + (f" {reserved:>12} {format_bytes(d.overhead_bytes):>12} {format_bytes(d.total_bytes):>12}" if cuda else ""))
    if cuda and not exact:
        print("reserved peak not predicted: the profile records no reserved peaks (taken before they were recorded);"
              " the total is tensor peak + outside, a lower bound; profile again into a new --db to predict it")
    print(f"plan peak: {format_bytes(prediction.peak_memory_bytes)}")
    return 0
