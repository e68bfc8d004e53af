"""``hybridplan export``: a plan as torchtitan, Megatron-LM and DeepSpeed take it.

- :mod:`~hybridplan.workflows.export.layers`: the model's layers as the engines' units (embedding, transformer
  blocks, final norm + head);
- :mod:`~hybridplan.workflows.export.capabilities`: what each engine expresses and the nearest plan it runs;
- :mod:`~hybridplan.workflows.export.torchtitan`, :mod:`~hybridplan.workflows.export.megatron`,
  :mod:`~hybridplan.workflows.export.deepspeed`: the files.

It reads the plan and the model's layer names only, and imports no torch (tests/test_architecture.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hybridplan.errors import PlanError
from hybridplan.plan import Plan
from hybridplan.workflows.export.capabilities import CAPABILITIES, ENGINES, Engine, nearest_plan
from hybridplan.workflows.export.deepspeed import deepspeed_config, dumps
from hybridplan.workflows.export.layers import ModelLayers
from hybridplan.workflows.export.megatron import format_arguments, megatron_arguments
from hybridplan.workflows.export.torchtitan import DEFAULT_BASE, torchtitan_recipe

__all__ = ["ENGINES", "Engine", "Exported", "ModelLayers", "NotExpressible", "export_plan", "nearest_plan"]


class NotExpressible(PlanError):
    """The engine cannot run the plan as it is; ``nearest`` is the closest plan it runs, ``changes`` what differs."""

    def __init__(self, message: str, *, fix: str | None = None, nearest: Plan, changes: list[str]) -> None:
        super().__init__(message, fix=fix)
        self.nearest = nearest
        self.changes = changes


@dataclass(frozen=True)
class Exported:
    """An export: the file's text, the plan it expresses, and what was changed to get there (``--nearest``)."""

    text: str
    plan: Plan
    changes: tuple[str, ...]


def export_plan(plan: Plan, engine: Engine, layers: ModelLayers, *, nearest: bool = False,
                torchtitan_base: str = DEFAULT_BASE, source: str = "",
                accept: Callable[[Plan], bool] | None = None) -> Exported:
    """What ``engine`` takes to run ``plan`` (or, with ``nearest``, the nearest plan it runs; ``accept`` as
    :func:`~.capabilities.nearest_plan`'s).

    Raises:
        PlanError: for a plan that does not match the model, or breaks a plan rule.
        NotExpressible: for a plan the engine cannot express (without ``nearest``), naming what and the nearest plan.
        UsageError: for an unknown engine, or a bad torchtitan base.
    """
    from hybridplan.errors import UsageError

    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", fix=f"use one of {list(ENGINES)}")
    layers.check(plan)
    plan.validate(num_layers=layers.num_layers)
    if CAPABILITIES[engine].decoder_only and not layers.decoder:
        raise PlanError(f"{engine} runs decoder-only transformers cut at block boundaries ([embedding, blocks..., norm"
                        f" + head]), and {layers.name}'s layers are not: {', '.join(layers.layer_names[:4])}, ...",
                        fix="export a GPT, MoE or hf: model, or use --to deepspeed (any list of layers)")
    near, changes = nearest_plan(plan, engine, accept=accept)
    if changes and not nearest:
        raise NotExpressible(
            f"{engine} cannot run this plan as it is: " + "; ".join(changes),
            fix=f"export the nearest plan {engine} runs with --nearest (--nearest-plan FILE saves it, to predict or"
            " validate it)", nearest=near, changes=changes)
    if engine == "torchtitan":
        text = torchtitan_recipe(near, layers, base=torchtitan_base, source=source)
    elif engine == "megatron":
        text = format_arguments(megatron_arguments(near, layers), source=source, plan=near)
    else:
        text = dumps(deepspeed_config(near, layers, source=source))
    return Exported(text, near, tuple(changes))
