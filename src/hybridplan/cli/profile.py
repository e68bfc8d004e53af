"""``hybridplan profile``: run the profiling campaign into a database; with ``--time``, time the layers instead."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from hybridplan.cli.common import (
    add_cluster,
    add_hosts,
    add_command,
    add_model,
    add_training,
    check_host_options,
    check_output,
    cluster_from,
    global_batch,
    hosts_from,
    microbatches,
    positive_float,
    positive_int,
    training_options,
    write_output,
)
from hybridplan.errors import UsageError
from hybridplan.plan import SCHEDULES
from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import ProfileStore

if TYPE_CHECKING:
    from hybridplan.profiling.campaign import Campaign
    from hybridplan.runtime.hosts import Hosts


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "profile",
        help="run the profiling campaign (per-layer memory statistics), or time the layers (--time)",
        description="Profile the model's memory with short runs of chosen partitionings (CAPTURE): pipeline-only, "
        "data- and tensor-parallel stages at two batch sizes, from which per-layer statistics predict any plan. Every "
        "run is written to the database as it finishes; running the same command again resumes where it stopped. "
        "With --time, measure per-layer forward and backward seconds instead (for the throughput objective), and the "
        "per-message latency and bandwidth of the runtime's backend between two of its processes.",
        reads="a cluster TOML if --cluster names one; the database, if it exists (to resume).",
        writes="the SQLite profile database (--db: runs, per-device measurements, statistics, layer times); with "
        "--time-out, a layer-time JSON; progress to the terminal. --dry-run writes nothing.",
        examples=["hybridplan profile --model gpt-tiny --cluster 1x4 --global-batch-size 64 --num-microbatches 4 "
                  "--db profile.sqlite",
                  "hybridplan profile --model gpt3-1.3b --cluster 4x4 --global-batch-size 1024 --num-microbatches 64 "
                  "--backend sim --device cuda --precision bf16 --device-memory 40GiB --db gpt3.sqlite",
                  "hybridplan profile --model gpt-tiny --cluster 1x4 --global-batch-size 64 --num-microbatches 4 "
                  "--db profile.sqlite --time",
                  "hybridplan profile --model gpt-tiny --cluster 2x4 --global-batch-size 64 --num-microbatches 4 "
                  "--db profile.sqlite --hosts node1,node2   # from node1; or --hosts slurm in a SLURM allocation"],
    )
    add_model(p)
    add_cluster(p)
    p.add_argument("--global-batch-size", type=global_batch, required=True, help="the target global batch size")
    p.add_argument("--num-microbatches", type=microbatches, required=True, help="the target micro-batch count")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="schedule of the profiling runs (a 2bw profile includes the weight stash; any profile predicts every schedule)")
    p.add_argument("--db", required=True, help="SQLite profile database (created or resumed)")
    p.add_argument("--profile-batch-sizes", help="two global batch sizes to profile, e.g. 32,16 (default: B/2,B/4)")
    p.add_argument("--scenarios", help="comma-separated: pipeline,data2,data4,tensor2,tensor4,data2-zero3,... (default: all"
                   " that apply)")
    p.add_argument("--zero", action="store_true",
                   help="also profile data-parallel ZeRO-3 at each data degree (predicts ZeRO-3 stages; ZeRO-1 needs no"
                   " scenario): at most twice the runs")
    p.add_argument("--neighbors", type=positive_int, help="layers per neighbour chain for M_a (default ceil(L/G), as CAPTURE)")
    p.add_argument("--merge-layers", type=positive_int, metavar="L_M", help="merge layers to L_M after the pipeline scenario (CAPTURE's layer merger)")
    p.add_argument("--dry-run", action="store_true", help="list the runs the campaign would make, run nothing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=positive_float, default=900.0, help="seconds before a profiling run is ended (default 900)")
    add_training(p)
    t = p.add_argument_group("layer times (--time)")
    t.add_argument("--time", action="store_true",
                   help="instead of memory, measure per-layer forward/backward seconds on the real runtime (table layer_times)"
                   " and the backend's per-message latency and bandwidth (docs/time.md)")
    t.add_argument("--time-out", metavar="FILE", help="also write the layer times as a time-profile JSON")
    t.add_argument("--time-degrees", help="tensor-parallel degrees to time, e.g. 1,2 (default: 1,2,4 where possible)")
    t.add_argument("--time-micro-batch-sizes", metavar="B1,B2,...",
                   help="micro-batch sizes to time, e.g. 1,2,4 (default: the target's and its half: two runs per degree);"
                   " between them a layer's time is interpolated, outside them extrapolated as max(fixed, per-sample x b)"
                   " (docs/time.md)")
    t.add_argument("--time-max-layers", type=positive_int, help="at most this many consecutive layers per timing run (default: all)")
    add_hosts(p, "run every profiling run")
    p.set_defaults(handler=handle)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{what} must be comma-separated positive integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise UsageError(f"{what} must be comma-separated positive integers, got {text!r}")
    return values


def handle(args: argparse.Namespace) -> int:
    if args.global_batch_size % args.num_microbatches:
        raise UsageError(f"--global-batch-size {args.global_batch_size} does not split into {args.num_microbatches}"
                         " equal micro-batches", fix="choose a micro-batch count that divides the global batch size")
    check_host_options(args)
    if args.time and args.hosts is not None:
        raise UsageError("--hosts runs the memory campaign on several machines; --time measures layers on this one",
                         fix="drop --hosts for --time (layer times do not depend on the number of nodes)")
    if args.time:
        return _time(args)
    if args.time_out or args.time_degrees or args.time_micro_batch_sizes or args.time_max_layers:
        raise UsageError("--time-out, --time-degrees, --time-micro-batch-sizes and --time-max-layers need --time")
    if not args.dry_run:
        check_output(args.db, "--db")
    cluster = cluster_from(args)
    hosts = hosts_from(args, cluster)
    if not args.dry_run:
        from hybridplan.runtime.gpu_check import check_devices

        check_devices("the profile", backend=args.backend, device_type=args.device, share_gpu=args.share_gpu,
                      here=hosts is None)
    batch_sizes = _ints(args.profile_batch_sizes, "--profile-batch-sizes") if args.profile_batch_sizes else None
    scenarios = tuple(Scenario.parse(s.strip()) for s in args.scenarios.split(",")) if args.scenarios else None

    with ProfileStore(":memory:" if args.dry_run else args.db) as store:  # a file that is no database fails here
        return _campaign(args, cluster, batch_sizes, scenarios, store, hosts)


def _campaign(args: argparse.Namespace, cluster: Cluster, batch_sizes: tuple[int, ...] | None,
              scenarios: tuple[Scenario, ...] | None, store: ProfileStore, hosts: Hosts | None) -> int:
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.runtime.multinode import MultiNode

    cfg = CampaignConfig(
        model=args.model,
        cluster=cluster,
        global_batch_size=args.global_batch_size,
        num_microbatches=args.num_microbatches,
        schedule=args.schedule,
        batch_sizes=batch_sizes,
        scenarios=scenarios,
        zero=args.zero,
        neighbors=args.neighbors,
        merge_to=args.merge_layers,
        seed=args.seed,
        timeout_s=args.timeout,
        run_options=training_options(args),
    )
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with contextlib.ExitStack() as stack:
        nodes = None
        if hosts is not None and not args.dry_run:  # the agents start (and the hosts are checked) before any run
            nodes = stack.enter_context(MultiNode(hosts, devices_per_node=cluster.devices_per_node, on_event=say))
        campaign = Campaign(cfg, store, progress=say, launch=nodes.launch if nodes is not None else None)
        return _run_campaign(args, campaign)


def _run_campaign(args: argparse.Namespace, campaign: Campaign) -> int:
    if args.dry_run:
        runs = campaign.dry_run()
        for batch, scenario, run in runs:
            stages = " ".join(f"[{s.start},{s.stop}){'' if s.degree == 1 else s.parallelism[0] + str(s.degree)}" for s in run.stages)
            print(f"{scenario.name:>9} @ batch {batch:>5}: {stages}")
        counts: dict[str, int] = {}
        for _, scenario, _ in runs:
            counts[scenario.name] = counts.get(scenario.name, 0) + 1
        print(f"{len(runs)} runs: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
              f" (CAPTURE's Description 1: {campaign.L + 1} per scenario and batch size)")
        return 0
    print(
        f"profiling {args.model} ({campaign.L} layers) for {campaign.cfg.cluster.describe()}: scenarios "
        f"{', '.join(s.name for s in campaign.scenarios)} at global batch sizes {campaign.batch_sizes}",
        file=sys.stderr,
    )
    summary = campaign.run()
    print(
        f"done: {summary.runs_executed} runs executed, {summary.runs_resumed} resumed from the database,"
        f" {summary.runs_failed} failed, in {summary.seconds:.0f} s; statistics in {args.db}"
    )
    for key, count in summary.runs_per_scenario.items():
        print(f"  {key}: {count} runs")
    for key, spans in summary.unmeasured.items():
        print(f"  {key}: not measured: {spans}")
    return 0


def _time(args: argparse.Namespace) -> int:
    """``--time``: the layer-time profile (profiling/timing.py)."""
    if args.backend == "sim":
        raise UsageError(
            "--time measures seconds, but simulated devices (--backend sim) run fake tensors that take no time",
            fix="drop --backend sim: layer times need the real runtime",
        )
    if args.dry_run:
        raise UsageError("--dry-run lists the memory campaign's runs; it does not apply to --time")
    if args.share_gpu:
        raise UsageError("--time measures seconds, but ranks sharing a GPU (--share-gpu) take turns on it: their times"
                         " are not representative", fix="drop --share-gpu; on one GPU, time tensor degree 1 with"
                         " --time-degrees 1")
    check_output(args.db, "--db")
    check_output(args.time_out, "--time-out")
    target = args.global_batch_size // args.num_microbatches
    if args.time_micro_batch_sizes:
        sizes = _ints(args.time_micro_batch_sizes, "--time-micro-batch-sizes")
    else:
        sizes = (target, target // 2) if target % 2 == 0 else (target,)
    degrees = _ints(args.time_degrees, "--time-degrees") if args.time_degrees else None
    cluster = cluster_from(args)
    from hybridplan.runtime.gpu_check import check_devices

    check_devices("the layer timing", backend="real", device_type=args.device, share_gpu=False)

    from hybridplan.profiling.stored_time_profile import time_profile_from_store
    from hybridplan.profiling.timing import LayerTiming, TimingConfig

    options = {k: v for k, v in training_options(args).items() if k != "backend"}
    cfg = TimingConfig(
        model=args.model,
        cluster=cluster,
        micro_batch_sizes=tuple(sorted(set(sizes), reverse=True)),
        tensor_degrees=degrees,
        max_layers_per_run=args.time_max_layers,
        seed=args.seed,
        timeout_s=args.timeout,
        run_options=options,
    )
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with ProfileStore(args.db) as store:
        timing = LayerTiming(cfg, store, progress=say)
        say(f"timing {args.model} layers on {timing.device_type!r} devices: tensor degrees {list(timing.degrees)},"
            f" micro-batch sizes {list(cfg.micro_batch_sizes)} (CPU times are noisy and not GPU-representative)")
        summary = timing.run()
        profile = time_profile_from_store(store, warn=say)
    print(f"done: {summary.runs_executed} timing runs executed, {summary.runs_resumed} resumed from the database,"
          f" {len(summary.failed)} failed, in {summary.seconds:.0f} s; layer times in {args.db}")
    for failure in summary.failed:
        print(f"  failed: {failure}")
    if profile.links is not None:
        links = profile.links
        print(f"  links ({links.backend}): all-reduce {links.allreduce_latency_s * 1e6:.0f} us per ring step,"
              f" send/recv {links.p2p_latency_s * 1e6:.0f} us per message (docs/time.md: per-message latency)")
    for t in profile.timings:
        extra = ""
        if t.optimizer_s_per_byte is not None and t.overhead_s is not None:
            extra = (f"; optimizer step {t.optimizer_s_per_byte * 2**20 * 1e3:.3f} ms per MiB of parameters,"
                     f" other {t.overhead_s * 1e3:.2f} ms per iteration")
        print(f"  {t.device_type} tensor x{t.tensor_degree}, micro-batch {t.micro_batch_size}: forward"
              f" {sum(t.forward_s) * 1e3:.2f} ms, backward {sum(t.backward_s) * 1e3:.2f} ms per micro-batch{extra}")
    if args.time_out:
        write_output(args.time_out, profile.to_json(), "--time-out")
        print(f"time profile written to {args.time_out}")
    return 0 if not summary.failed else 1
