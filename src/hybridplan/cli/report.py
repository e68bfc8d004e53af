"""``hybridplan report``: a terminal table and a PNG of a validation, a run, a plan's prediction, a Pareto
front, or a benchmark's results file."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybridplan.cli.common import add_cluster, add_command, check_output, cluster_from
from hybridplan.errors import UsageError
from hybridplan.report.data import MemoryView, View, load_view
from hybridplan.units import parse_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "report",
        help="table and PNG of a validation, a run, a plan's prediction, a Pareto front or a benchmark result",
        description="Render per-device predicted against measured peak memory (from 'validate --out' or 'run --out',"
        " or --plan with --db for a prediction), a memory/time Pareto front (a Pareto JSON, or computed with"
        " --pareto), or a benchmark's results.json, as a table in the terminal and a PNG (matplotlib).",
        reads="the input JSON (a validation, run result, Pareto front or benchmark results file), or the plan JSON "
        "(--plan) with the profile database (--db, read only); a time profile for --pareto.",
        writes="a PNG (--png, default <input name>.png in the current folder; none with --no-plot) and a table to the "
        "terminal.",
        examples=["hybridplan report v.json --png v.png",
                  "hybridplan report --plan best.json --db profile.sqlite --device-memory 40GiB --no-plot",
                  "hybridplan report --plan best.json --db profile.sqlite --pareto --cluster 1x4"],
    )
    p.add_argument("input", nargs="?", help="a validation, run result, Pareto or benchmark results JSON file")
    p.add_argument("--plan", help="plan JSON: report its predicted per-device peaks (needs --db)")
    p.add_argument("--db", help="profile database, for --plan or --time-profile")
    p.add_argument("--pareto", action="store_true",
                   help="also draw the memory/time Pareto front of the model (needs --db and --cluster, and layer times:"
                        " --time-profile, or a --db profiled with --time); --plan is marked on it")
    p.add_argument("--time-profile", help="time profile JSON for --pareto (default: the --db's layer times)")
    add_cluster(p, required=False)
    p.add_argument("--png", help="PNG to write (default: <input or plan name>.png in the current folder)")
    p.add_argument("--no-plot", action="store_true", help="print the table only")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.report.tables import render_table

    if (args.input is None) == (args.plan is None):
        raise UsageError("give either an input file or --plan", fix="e.g. 'hybridplan report validation.json' or"
                         " 'hybridplan report --plan plan.json --db profile.sqlite'")
    if args.plan and not args.db:
        raise UsageError("--plan needs --db (the profile that predicts it)", fix="add --db profile.sqlite")
    if args.pareto and not (args.db and args.cluster):
        raise UsageError("--pareto needs --db and --cluster", fix="add --db profile.sqlite --cluster 4x4")
    capacity = parse_bytes(args.device_memory, what="--device-memory") if args.device_memory else None
    if capacity is not None and capacity < 1:
        raise UsageError(f"--device-memory {args.device_memory!r} is not a capacity (it must be positive)",
                         fix="give the capacity of one device, e.g. --device-memory 40GiB")
    stem = Path(args.input or args.plan).stem
    base = Path(args.png) if args.png else None
    if not args.no_plot:
        first = base if base is not None else Path(f"{stem}.png")
        check_output(first, "--png")
        if args.pareto:
            check_output(first.with_name(f"{first.stem}-pareto.png"), "--png")
    views: list[tuple[View, str]] = []
    if args.input:
        view = load_view(args.input)
        if isinstance(view, MemoryView) and capacity:
            view = MemoryView(view.title, view.devices, capacity, view.status)
        views.append((view, stem))
    else:
        views.append((_prediction(args, capacity), stem))
    if args.pareto:
        views.append((_pareto(args), f"{stem}-pareto"))
    for i, (view, name) in enumerate(views):
        print(render_table(view))
        if args.no_plot:
            continue
        from hybridplan.report.plots import render_plot

        path = Path(f"{name}.png") if base is None else (base if i == 0 else base.with_name(f"{base.stem}-pareto.png"))
        print(f"plot written to {render_plot(view, path)}")
    return 0


def _prediction(args: argparse.Namespace, capacity: int | None) -> MemoryView:
    from hybridplan.plan import Plan
    from hybridplan.predict.memory import MemoryPredictor

    plan = Plan.load(args.plan)
    predictor = MemoryPredictor.from_db(args.db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                        num_microbatches=plan.num_microbatches)
    return MemoryView.from_prediction(predictor.predict(plan), f"{Path(args.plan).stem}: predicted", capacity)


def _pareto(args: argparse.Namespace) -> View:
    import sys

    from hybridplan.plan import Plan
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.report.pareto import memory_time_front
    from hybridplan.workflows.sources import Sources

    cluster = cluster_from(args)
    marks = {}
    if args.plan:
        plan = Plan.load(args.plan)
        predictor = MemoryPredictor.from_db(args.db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                            num_microbatches=plan.num_microbatches)
        marks[Path(args.plan).stem] = plan
    else:
        predictor = MemoryPredictor.from_db(args.db)
    with Sources.open(args.db, time_profile=args.time_profile, warn=lambda msg: print(msg, file=sys.stderr)) as sources:
        profile = sources.time_profile()
    view, unpriced = memory_time_front(predictor, profile, cluster, title=f"{profile.model} on {cluster.shape}: memory/time",
                                       marks=marks)
    if unpriced:
        print(f"{unpriced} strategies left out: the memory profile cannot predict them", file=sys.stderr)
    return view
