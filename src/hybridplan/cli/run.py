"""``hybridplan run``: train a model with a plan on local processes (or simulated devices, or on several
machines with --hosts) and measure it."""

from __future__ import annotations

import argparse
import json
import sys

from hybridplan.cli.common import (
    add_cluster,
    add_hosts,
    add_command,
    add_model,
    add_training,
    check_output,
    cluster_from,
    hosts_from,
    positive_float,
    positive_int,
    training_options,
    write_output,
)
from hybridplan.errors import UsageError
from hybridplan.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "run",
        help="train with a plan and measure per-device peak memory and iteration time",
        description="Train MODEL for N iterations with PLAN, one process per device (gloo on CPU, NCCL on GPU), or on "
        "simulated devices (--backend sim: fake tensors, exact memory, no time); with --hosts, on several machines through "
        "torchrun. The first iteration is a warm-up; "
        "peak memory and time are measured on the others. A run that exceeds --device-memory ends with status 'oom' "
        "(exit code 1).",
        reads="the plan JSON (--plan); a cluster TOML if --cluster names one.",
        writes="the result JSON to --out (status, losses, iteration time, per-device peak memory and breakdown); a "
        "table to the terminal (or the JSON with --json). With --write-config, only a run configuration for torchrun.",
        examples=["hybridplan run --model gpt-tiny --cluster 1x4 --plan plan.json --iterations 3 --out result.json",
                  "hybridplan run --model gpt-tiny --cluster 2x4 --plan plan.json --hosts node1,node2",
                  "hybridplan run --model gpt3-1.3b --cluster 4x4 --plan plan.json --backend sim --device cuda "
                  "--precision bf16"],
    )
    add_model(p)
    add_cluster(p)
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--iterations", type=positive_int, default=3, help="training iterations including the warm-up (default 3)")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--timeout", type=positive_float, default=900.0, help="end the run after this many seconds (default 900)")
    add_training(p)
    p.add_argument("--no-memory", action="store_true", help="do not track memory (CPU tracking costs ~1.2x time)")
    p.add_argument("--json", action="store_true", help="print the result JSON instead of a table")
    p.add_argument(
        "--write-config",
        metavar="FILE",
        help="only write the run configuration for 'torchrun -m hybridplan.runtime.torchrun --config FILE' and exit",
    )
    add_hosts(p, "run")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    # Everything that can be checked without torch first: files, outputs, the plan's own rules.
    check_output(args.out, "--out")
    check_output(args.write_config, "--write-config")
    plan = Plan.load(args.plan)
    cluster = cluster_from(args)
    plan.validate(cluster=cluster)
    hosts = hosts_from(args, cluster)
    if hosts is not None and args.write_config:
        raise UsageError("--write-config writes a configuration to start with torchrun by hand; --hosts starts it",
                         fix="drop one of them")

    from hybridplan.runtime.config import RunConfig, config_to_json, validate_config
    from hybridplan.runtime.launch import launch

    cfg = RunConfig(
        model=args.model,
        plan=plan,
        cluster=cluster,
        iterations=args.iterations,
        seed=args.seed,
        learning_rate=args.lr,
        track_memory=not args.no_memory,
        timeout_s=args.timeout,
        **training_options(args),
    )
    validate_config(cfg)
    from hybridplan.runtime.gpu_check import check_devices

    check_devices("the run", backend=cfg.backend, device_type=cfg.device_type, share_gpu=cfg.share_gpu,
                  here=hosts is None and not args.write_config)  # --write-config: run elsewhere, by torchrun
    if args.write_config:
        write_output(args.write_config, config_to_json(cfg), "--write-config")
        print(f"wrote {args.write_config}; launch with: torchrun --nproc-per-node K --nnodes N ... "
              f"-m hybridplan.runtime.torchrun --config {args.write_config} --out result.json")
        return 0
    print(f"running {cfg.model_name()} on {cfg.cluster.describe()}", file=sys.stderr)
    print(cfg.plan.describe(), file=sys.stderr)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if hosts is None:
        result = launch(cfg, on_event=say)
    else:
        from hybridplan.runtime.multinode import MultiNode

        with MultiNode(hosts, devices_per_node=cluster.devices_per_node, on_event=say) as nodes:
            result = nodes.launch(cfg)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.summary())
    if args.out:
        write_output(args.out, json.dumps(result.to_dict(), indent=1) + "\n", "--out")
    return 0 if result.ok else 1
