"""``hybridplan show``: a plan as a picture (report/plan_picture.py): its mesh, its devices' memory, its timeline."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from hybridplan.cli.common import add_command, check_output, gpu_name
from hybridplan.errors import HybridPlanError, PlanError, UsageError
from hybridplan.plan import Cluster, Plan

__all__ = ["register", "handle"]

UNIT_SOURCE = "no time profile: unit times, forward 1 and backward 2 per layer"


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "show",
        help="draw a plan: its mesh coloured by stage, each device's memory against its capacity, its schedule in time",
        description="Draw PLAN as one PNG: the mesh (nodes x devices) coloured by stage, with each stage's layers, data x"
        " tensor degree, ZeRO stage and recompute; with --prediction or --validation, each device's memory as a stacked"
        " bar (parameters + optimizer state, gradients, activations, temporaries, the allocator's cache, what lies"
        " outside the allocator: as far as the file splits it) against the capacity; and the timeline of one iteration:"
        " every stage's forward and backward of each micro-batch, from the time model with --time-profile or a --db"
        " with layer times (else unit times: forward 1, backward 2 per layer), the pipeline's bubbles as gaps.",
        reads="the plan JSON; a prediction ('predict --json' or 'estimate-memory --json' output) or a validation"
        " ('validate --out'); a layer-time JSON (--time-profile) or a profile database with layer times (--db, read"
        " only); a cluster TOML if --cluster names one.",
        writes="the PNG (--png). Nothing else.",
        examples=["hybridplan show plan.json --png plan.png",
                  "hybridplan show plan.json --prediction p.json --cluster 2x4 --gpu h100-sxm --png plan.png",
                  "hybridplan show plan.json --validation v.json --time-profile t.json --png plan.png"],
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON file ('plan --out', 'estimate-memory --out')")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--prediction", metavar="FILE",
                       help="per-device predicted memory: what 'hybridplan predict --json' (split by kind) or"
                            " 'hybridplan estimate-memory --json' printed, saved to a file")
    which.add_argument("--validation", metavar="FILE", help="a validation ('hybridplan validate --out'): measured"
                       " peaks as bars, predicted ones as marks")
    p.add_argument("--time-profile", metavar="FILE", help="layer-time JSON for the timeline (the time model)")
    p.add_argument("--db", help="profile database whose layer times time the timeline (instead of --time-profile)")
    p.add_argument("--cluster", help="NxK or a cluster TOML: the mesh drawn and timed (default: the plan's 'cluster'"
                   " key, else one node of the plan's devices)")
    p.add_argument("--device-memory", help="per-device capacity drawn against the bars, e.g. 80GiB (overrides the"
                   " cluster's and --gpu's)")
    p.add_argument("--gpu", type=gpu_name, metavar="NAME", help="the GPU every device is ('hybridplan gpus'): its"
                   " memory is the capacity, its link times the transfers")
    p.add_argument("--png", required=True, help="the PNG to write")
    p.set_defaults(handler=handle)


def _read_json(path: str, option: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"{option} {path!r} cannot be read: {e.strerror or e}", fix="check the path") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path!r} is not text", fix="give the JSON file hybridplan wrote") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{option} {path!r} is not JSON: {e.msg} at line {e.lineno}",
                         fix="give the JSON file hybridplan wrote") from None


def _plan(path: str) -> Plan:
    """The plan, with a file that is no plan named as such."""
    if not Path(path).exists():
        raise PlanError(f"plan file {path!r} does not exist", fix="check the path, or write one with 'hybridplan plan --out'")
    try:
        return Plan.from_dict(_read_json(path, "PLAN"))
    except PlanError as e:
        raise PlanError(f"{path!r} is not a plan: {e.message}",
                        fix=e.fix or "give a plan JSON ('hybridplan plan --out'; format: hybridplan/plan/plan.py)") from None


def _cluster(args: argparse.Namespace, plan: Plan) -> Cluster:
    """--cluster, else the plan's own "cluster" key (NxK), else one node holding the plan's devices."""
    spec = args.cluster
    recorded = plan.extra.get("cluster")
    if spec is None and isinstance(recorded, str) and re.fullmatch(r"\d+x\d+", recorded):
        spec = recorded
    if spec is None:
        spec = f"1x{max(d for s in plan.stages for d in s.devices) + 1}"
    cluster = Cluster.parse(spec, device_memory=args.device_memory, gpu=args.gpu)
    try:
        plan.check_fits(plan.num_layers, cluster)
    except PlanError as e:
        raise PlanError(f"the plan does not fit the cluster {cluster.shape}: {e.message}",
                        fix="give the cluster the plan is for: --cluster NxK or a cluster TOML") from None
    return cluster


def handle(args: argparse.Namespace) -> int:
    import importlib.util

    from hybridplan.report.device_memory import plan_memory_from

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("hybridplan show draws with matplotlib, which is not installed",
                         fix="pip install 'hybridplan[plot]' (or matplotlib)")
    check_output(args.png, "--png")
    if args.db and args.time_profile:
        raise UsageError("--db and --time-profile both give layer times", fix="give one of them")
    for option, path in (("--time-profile", args.time_profile), ("--db", args.db)):
        if path and not Path(path).is_file():
            raise UsageError(f"{option} {path!r} does not exist", fix="check the path")
    plan = _plan(args.plan)
    plan.validate()
    cluster = _cluster(args, plan)
    memory = None
    source = args.prediction or args.validation
    if source:
        option = "--prediction" if args.prediction else "--validation"
        memory = plan_memory_from(_read_json(source, option), plan, f"{option} {Path(source).name}",
                                  validation=bool(args.validation))
    timeline = _timeline(args, plan, cluster)
    from hybridplan.report.plan_picture import draw_plan, write_png

    out = write_png(draw_plan(plan, cluster, timeline, memory), args.png)
    print(f"picture written to {out}")
    return 0


def _timeline(args: argparse.Namespace, plan: Plan, cluster: Cluster) -> Any:
    from hybridplan.report.timeline import model_durations, play, unit_durations

    if not (args.time_profile or args.db):
        return play(plan, unit_durations(plan), unit="unit", source=UNIT_SOURCE)
    import sys

    from hybridplan.predict.time_model import predict_iteration_time
    from hybridplan.workflows.sources import Sources

    with Sources.open(args.db, time_profile=args.time_profile, warn=lambda msg: print(msg, file=sys.stderr)) as sources:
        profile = sources.time_profile()
    try:
        breakdown = predict_iteration_time(plan, profile, cluster)
    except HybridPlanError as e:
        raise type(e)(f"the time model cannot time the plan: {e.message}", fix=e.fix) from None
    name = Path(args.time_profile or args.db).name
    return play(plan, model_durations(breakdown), unit="s",
                source=f"time model, {name}; its closed form: {_seconds(breakdown.total_s)}")


def _seconds(value: float) -> str:
    return f"{value * 1e3:.4g} ms" if value < 1 else f"{value:.4g} s"
