"""``hybridplan export``: write a plan as torchtitan, Megatron-LM or DeepSpeed take it (workflows/export)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridplan.cli.common import add_command, add_model, check_output, write_output
from hybridplan.plan import Plan
from hybridplan.workflows.export import ENGINES, ModelLayers, NotExpressible, export_plan
from hybridplan.workflows.export.torchtitan import DEFAULT_BASE

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "export",
        help="write a plan as torchtitan, Megatron-LM or DeepSpeed take it",
        description="Translate PLAN into what a training engine takes: torchtitan's recipe (a Python module whose "
        "function returns the Trainer.Config: pipeline degree, stage module names, schedule, tensor and data "
        "(replicate/shard) degrees, micro-batch size, activation checkpointing), Megatron-LM's command-line "
        "arguments (pipeline and tensor sizes, uneven first/last stages or the pipeline layout, micro and global "
        "batch, distributed optimizer, recompute), or DeepSpeed's config JSON (batch sizes, gradient accumulation, "
        "ZeRO stage, pipeline section) with the exact stage boundaries for its PipelineModule. A plan the engine "
        "cannot express (stages of different degrees, per-stage recompute or ZeRO, a schedule it lacks) is refused, "
        "naming what and the nearest plan it runs; --nearest exports that one. docs/export.md has the details.",
        reads="the plan JSON (--plan); the model's layer names (--model, or the plan's zoo model; else the plan is "
        "taken for a decoder-only transformer [embedding, blocks..., head]).",
        writes="the engine's file to --out (or the terminal); with --nearest-plan, the nearest plan's JSON.",
        examples=["hybridplan export --plan best.json --to megatron --model gpt3-1.3b",
                  "hybridplan export --plan best.json --to torchtitan --out hybridplan_recipe.py "
                  "--torchtitan-base torchtitan.models.llama3.config_registry:llama3_8b",
                  "hybridplan export --plan best.json --to deepspeed --nearest --nearest-plan ds_plan.json --out ds.json"],
    )
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--to", required=True, choices=ENGINES, help="the engine")
    add_model(p, required=False, help="the model the plan is for (default: the plan's zoo model, if it names one)")
    p.add_argument("--out", help="write the engine's file here (default: print it)")
    p.add_argument("--nearest", action="store_true", help="export the nearest plan the engine runs, if it cannot run this one")
    p.add_argument("--nearest-plan", metavar="FILE", help="with --nearest: also write that plan's JSON here")
    p.add_argument("--torchtitan-base", default=DEFAULT_BASE, metavar="MODULE:FUNCTION",
                   help=f"torchtitan: the recipe of your model to start from (default {DEFAULT_BASE})")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.errors import UsageError

    check_output(args.out, "--out")
    check_output(args.nearest_plan, "--nearest-plan")
    if args.nearest_plan and not args.nearest:
        raise UsageError("--nearest-plan writes the nearest plan of --nearest, which was not given",
                         fix="add --nearest, or drop --nearest-plan")
    plan = Plan.load(args.plan)
    layers, model = _layers(args.model or _zoo_model_of(plan), plan)
    try:
        exported = export_plan(plan, args.to, layers, nearest=args.nearest, torchtitan_base=args.torchtitan_base,
                               source=args.plan, accept=None if model is None else _runs_on(model))
    except NotExpressible as e:  # the nearest plan first, then the error (the CLI's last lines)
        print(f"the nearest plan {args.to} runs:\n" + "\n".join("  " + line for line in e.nearest.describe().splitlines()),
              file=sys.stderr)
        raise
    if exported.changes:
        if model is not None:  # the engine's grid may ask a layer for a tensor degree it does not split into
            from hybridplan.errors import PlanError

            try:
                exported.plan.validate(model=model)
            except PlanError as e:
                raise PlanError(f"the nearest plan {args.to} runs cannot run {layers.name}: {e.message}",
                                fix="change the plan's degrees or batch so that a uniform grid fits the model") from None
        print(f"exporting the nearest plan {args.to} runs: " + "; ".join(exported.changes), file=sys.stderr)
        if args.nearest_plan:
            write_output(args.nearest_plan, exported.plan.to_json(), "--nearest-plan")
    if args.out:
        write_output(args.out, exported.text, "--out")
        print(f"wrote {args.out} ({args.to})", file=sys.stderr)
    else:
        print(exported.text, end="")
    return 0


def _runs_on(model: LayeredModel) -> Callable[[Plan], bool]:
    """Whether ``model`` runs a plan (the nearest plan's grid must split the model's layers)."""
    from hybridplan.errors import PlanError

    def accept(plan: Plan) -> bool:
        try:
            plan.validate(model=model)
        except PlanError:
            return False
        return True

    return accept


def _zoo_model_of(plan: Plan) -> str | None:
    """The plan's ``model`` annotation (``hybridplan plan`` writes it) when it is a zoo name: a file may name a zoo
    model, never code to import (models/names.py)."""
    from hybridplan.models.names import is_zoo_name

    name = plan.extra.get("model")
    return name if isinstance(name, str) and is_zoo_name(name) else None


def _layers(model: str | None, plan: Plan) -> tuple[ModelLayers, LayeredModel | None]:
    if model is None:
        return ModelLayers.assumed_decoder(plan.num_layers), None
    from hybridplan.models.zoo import get_model  # imports torch: only when a model is named

    m = get_model(model)
    layers = ModelLayers.of(model, [m.layer_name(i) for i in range(m.num_layers)], m.config())
    layers.check(plan)
    plan.validate(model=m)  # tensor-parallel support of the layers, sample granularity
    return layers, m
