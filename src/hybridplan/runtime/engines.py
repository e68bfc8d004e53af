"""Engine profiles: the runtime options that make hybridplan's runtime hold memory as a training engine does.

A plan exported to Megatron-LM, DeepSpeed or torchtitan (workflows/export) is trained by that engine, which holds
some things differently from this runtime (docs/engines.md lists each difference with its source). An engine
profile is the set of :class:`~hybridplan.runtime.config.RunConfig` fields that run the engine's way where the
runtime can, so the simulator measures it rather than a formula guessing it. Where the engine's way is not run
yet AND it changes the memory of the plan asked about, :func:`engine_run_options` refuses with the reason
instead of predicting this runtime's memory under the engine's name. "hybridplan" is the runtime's own way: no
option set, every prediction as it was.

Today the Megatron-LM profile sets ``grad_accumulation``, its fp32 gradient buffers (``main_grad``), kept by
default with bf16 and in fp32 training (docs/engines.md, section 1), ``adamw``, its fused Adam step, in place without
temporaries (section 3), and on ZeRO-1 stages ``zero1``, its distributed optimizer's flat, evenly split partition
(section 2). The torchtitan profile sets ``fsdp_reduce`` (FSDP2 reduce-scatters the
gradients in fp32, section 8) and ``adamw`` (its fused default), for plans whose every stage is FSDP-sharded
(ZeRO-2/3): torchtitan wraps every stage in FSDP2, and its stages recompute fully or selectively
(``"recompute": "selective"``, its per-operation policy: runtime/checkpointing.py). Both compute a tensor-parallel
last stage's loss on its vocabulary shards (``loss``, section 4).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from hybridplan.errors import UsageError
from hybridplan.plan import Plan

__all__ = ["Engine", "ENGINES", "engine_run_options", "not_modelled"]

Engine = Literal["hybridplan", "megatron", "deepspeed", "torchtitan"]
"""Who trains the plan: hybridplan's runtime, or an engine a plan is exported to."""

ENGINES: tuple[Engine, ...] = get_args(Engine)
"""The engine profiles."""

_NOT_MODELLED: dict[Engine, tuple[str, ...]] = {
    "hybridplan": (),
    "megatron": ("attention backend and dropout 0.1 (section 5)",
                 "tied embeddings' copy on the last stage (section 6)"),
    "deepspeed": ("BF16_Optimizer's gradient buffer in the model dtype without ZeRO (section 1)",
                  "fused Adam's step (section 3)"),
    "torchtitan": ("FSDP2 on stages without data sharding (section 8)",),
}
"""Per engine, the behaviours of docs/engines.md (its sections) that change memory and the runtime does not run."""


def not_modelled(engine: str) -> tuple[str, ...]:
    """What ``engine`` does that changes memory and the runtime does not run yet (docs/engines.md sections)."""
    _check_engine(engine)
    return _NOT_MODELLED[engine]  # type: ignore[index]  # checked: one of ENGINES


def engine_run_options(engine: str, *, plan: Plan, precision: str, model: Any = None) -> dict[str, Any]:
    """The RunConfig fields under which the runtime holds ``plan``'s memory as ``engine`` does.

    ``model`` (a name or a :class:`~hybridplan.models.base.LayeredModel`; None: a language model is assumed) says
    whether a tensor-parallel last stage's loss can be computed on vocabulary shards, as the engines do.

    Raises:
        UsageError: for an unknown engine, or where the engine's way of holding this plan (in ``precision``)
            is not run yet: the message names the behaviour and its section in docs/engines.md.

    Example:
        >>> from hybridplan.plan import Plan
        >>> plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        ...     {"layers": [0, 10], "parallelism": "none", "degree": 1, "devices": [0]}]})
        >>> engine_run_options("megatron", plan=plan, precision="bf16")
        {'grad_accumulation': 'fp32-buffer', 'adamw': 'fused'}
        >>> engine_run_options("hybridplan", plan=plan, precision="bf16")
        {}
    """
    _check_engine(engine)
    if engine == "hybridplan":
        return {}
    if engine == "torchtitan":
        return _torchtitan_options(plan, precision, model)
    if engine != "megatron":
        raise UsageError(f"the {engine} engine's memory is not modelled yet: {'; '.join(not_modelled(engine))}"
                         " (docs/engines.md)", fix="predict hybridplan's runtime (--engine hybridplan), or megatron's")
    if precision == "fp16":
        raise UsageError("Megatron-LM's fp16 training (fp16 gradient buffers, fp32 copies in the optimizer: 20 bytes"
                         " per parameter, docs/engines.md section 1) is not modelled yet",
                         fix="predict bf16 (--precision bf16), or hybridplan's runtime (--engine hybridplan)")
    if plan.schedule not in ("1f1b", "flush"):
        raise UsageError(f"the plan's schedule is {plan.schedule}: Megatron-LM runs 1F1B (its non-interleaved pipeline"
                         " schedule; 'export --to megatron' turns the plan into 1F1B, docs/export.md), whose memory"
                         f" differs from {plan.schedule}'s", fix="predict the plan with schedule 1f1b (--schedule 1f1b,"
                         " or the plan's \"schedule\"), or hybridplan's runtime (--engine hybridplan)")
    for i, s in enumerate(plan.stages):
        if s.zero >= 2:
            raise UsageError(f"stage {i} ({s.describe()}) is ZeRO-{s.zero}: Megatron-LM shards the optimizer state"
                             " with its distributed optimizer (ZeRO-1, docs/engines.md section 2), which is what is"
                             " modelled", fix="give the stage \"zero\": 1 or none, or predict hybridplan's runtime"
                             " (--engine hybridplan)")
    flat = {"zero1": "flat"} if any(s.zero == 1 for s in plan.stages) else {}  # its distributed optimizer's split
    return {"grad_accumulation": "fp32-buffer", "adamw": "fused", **flat, **_split_loss("Megatron-LM", plan, model)}


def _split_loss(engine: str, plan: Plan, model: Any) -> dict[str, Any]:
    """The loss on vocabulary shards where the last stage is tensor-parallel (docs/engines.md section 4; keys of
    other plans' stages stay as they were), or the refusal where ``model``'s loss is not a token cross entropy."""
    if plan.stages[-1].tensor_degree <= 1:
        return {}
    if model is not None:
        from hybridplan.models.zoo import resolve_model

        resolved = resolve_model(model)
        if not resolved.vocab_parallel_loss:
            raise UsageError(f"the last stage ({plan.stages[-1].describe()}) is tensor-parallel: {engine} computes its"
                             f" loss on vocabulary shards (docs/engines.md section 4), and {resolved.name}'s loss is not"
                             " a token cross entropy", fix="give the last stage tensor degree 1, or predict"
                             " hybridplan's runtime (--engine hybridplan)")
    return {"loss": "vocab-parallel"}


def _torchtitan_options(plan: Plan, precision: str, model: Any) -> dict[str, Any]:
    """torchtitan's options for ``plan``, or the reason it is not modelled (:func:`engine_run_options`)."""
    instead = "or predict hybridplan's runtime (--engine hybridplan)"
    if precision == "fp16":
        raise UsageError("torchtitan trains in bf16 or fp32 (mixed_precision_param), not fp16",
                         fix=f"predict bf16 (--precision bf16), {instead}")
    if plan.schedule == "2bw":
        raise UsageError("torchtitan does not run PipeDream-2BW ('export --to torchtitan' turns the plan into 1F1B)",
                         fix=f"predict the plan with schedule 1f1b or gpipe, {instead}")
    for i, s in enumerate(plan.stages):
        if s.zero < 2:
            raise UsageError(
                f"stage {i} ({s.describe()}) is not FSDP-sharded: torchtitan wraps every stage in FSDP2 (HSDP when"
                " replicated, a degree of 1 without data parallelism: docs/engines.md section 8), which this runtime"
                " models on ZeRO-2/3 stages only", fix=f"give every stage \"zero\": 2 or 3 over 2 or more replicas,"
                f" {instead}")
    return {"fsdp_reduce": "fp32", "adamw": "fused", **_split_loss("torchtitan", plan, model)}


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r} is not known", fix=f"use one of {list(ENGINES)}")
