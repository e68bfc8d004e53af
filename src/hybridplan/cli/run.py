"""``hybridplan run``: train a model with a plan on local processes and measure it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybridplan.cli.common import add_cluster, add_model, add_training, cluster_from, training_options
from hybridplan.errors import UsageError
from hybridplan.plan import Plan
from hybridplan.runtime.config import RunConfig, config_to_json
from hybridplan.runtime.launch import launch, validate_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train with a plan and measure per-device peak memory and iteration time",
        description="Train MODEL for N iterations with PLAN, one process per device (gloo on CPU, NCCL on GPU). "
        "The first iteration is a warm-up; peak memory and time are measured on the others.",
    )
    add_model(p)
    add_cluster(p)
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--iterations", type=int, default=3, help="training iterations including the warm-up (default 3)")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--timeout", type=float, default=900.0, help="end the run after this many seconds (default 900)")
    add_training(p)
    p.add_argument("--no-memory", action="store_true", help="do not track memory (CPU tracking costs ~1.2x time)")
    p.add_argument("--json", action="store_true", help="print the result JSON instead of a table")
    p.add_argument(
        "--write-config",
        metavar="FILE",
        help="only write the run configuration for 'torchrun -m hybridplan.runtime.worker --config FILE' and exit",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {args.iterations}")
    cfg = RunConfig(
        model=args.model,
        plan=Plan.load(args.plan),
        cluster=cluster_from(args),
        iterations=args.iterations,
        seed=args.seed,
        learning_rate=args.lr,
        track_memory=not args.no_memory,
        timeout_s=args.timeout,
        **training_options(args),
    )
    if args.write_config:
        validate_config(cfg)
        Path(args.write_config).write_text(config_to_json(cfg))
        print(f"wrote {args.write_config}; launch with: torchrun --nproc-per-node K --nnodes N ... "
              f"-m hybridplan.runtime.worker --config {args.write_config} --out result.json")
        return 0
    validate_config(cfg)
    print(f"running {cfg.model_name()} on {cfg.cluster.describe()}", file=sys.stderr)
    print(cfg.plan.describe(), file=sys.stderr)
    result = launch(cfg, on_event=lambda msg: print(msg, file=sys.stderr))
    if args.out:
        result.save(args.out)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    return 0 if result.ok else 1
