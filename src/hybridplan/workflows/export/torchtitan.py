"""torchtitan: a recipe (a Python function returning ``Trainer.Config``) that sets the plan's parallelism.

torchtitan 0.3 has no TOML job files any more: a run is ``--module M --config F``, a function returning a full
``Trainer.Config`` (torchtitan/config/README.md, ``ConfigManager._load_config``). The export is such a module: it
calls a base recipe of the user's model (``--torchtitan-base module:function``, by default torchtitan's
``llama3_debugmodel``), checks that its model has the plan's number of transformer blocks, and sets:

- ``parallelism.pipeline_parallel_degree``, ``module_fqns_per_model_part`` (the plan's cuts as torchtitan module
  names: ``tok_embeddings``, ``layers.<i>``, ``norm`` + ``lm_head``), ``pipeline_parallel_schedule`` (``GPipe``
  or ``1F1B``, torch.distributed.pipelining's names) and ``pipeline_parallel_microbatch_size``;
- ``tensor_parallel_degree`` (sequence parallelism off: hybridplan's tensor parallelism is Megatron's, without
  it), ``data_parallel_replicate_degree`` (ZeRO-0: DDP) or ``data_parallel_shard_degree`` with
  ``fsdp_reshard_after_forward`` (ZeRO-2: "never", ZeRO-3: "always"; FSDP2 as hybridplan's runtime runs them);
- ``training.local_batch_size`` (samples per data-parallel rank per step), ``training.global_batch_size``;
  without pipelining the plan's micro-batches become gradient-accumulation steps;
- ``activation_checkpoint``: ``FullAC`` when the stages recompute, ``SelectiveAC`` (its per-operation policy) when
  they recompute selectively, else none.

Run: ``NGPU=<devices> MODULE=<the file's module> CONFIG=hybridplan_plan ./run_train.sh`` (the file's folder on
``PYTHONPATH``).
"""

from __future__ import annotations

import json

from hybridplan.errors import UsageError
from hybridplan.plan import Plan
from hybridplan.workflows.export.layers import ModelLayers

__all__ = ["DEFAULT_BASE", "SCHEDULE_NAMES", "module_fqns", "torchtitan_recipe"]

DEFAULT_BASE = "torchtitan.models.llama3.config_registry:llama3_debugmodel"
"""The base recipe when none is given: torchtitan's small Llama 3 (6 blocks)."""

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "flush": "1F1B"}
"""hybridplan's schedules by torch.distributed.pipelining's names (``get_schedule_class``)."""


def module_fqns(plan: Plan, layers: ModelLayers) -> list[list[str]]:
    """The torchtitan module names of every stage (``module_fqns_per_model_part``)."""
    out = []
    for s in plan.stages:
        names = ["tok_embeddings"] if s.start == 0 else []
        names += [f"layers.{b}" for b in layers.blocks_of(s.start, s.stop)]
        if s.stop == layers.num_layers:
            names += ["norm", "lm_head"]
        out.append(names)
    return out


def torchtitan_recipe(plan: Plan, layers: ModelLayers, *, base: str = DEFAULT_BASE, source: str = "") -> str:
    """The recipe module's text for a plan torchtitan can run (:func:`~.capabilities.nearest_plan` is empty).

    Raises:
        UsageError: for a ``base`` that is not ``module:function``.
    """
    module, _, function = base.partition(":")
    if not module or not function.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        raise UsageError(f"--torchtitan-base {base!r} is not module:function",
                         fix=f"e.g. --torchtitan-base {DEFAULT_BASE}")
    s0 = plan.stages[0]
    d, t, pp = s0.data_degree, s0.tensor_degree, plan.num_stages
    zero, recompute = s0.zero, {"full": "FullAC", "selective": "SelectiveAC"}.get(s0.recompute)
    per_replica = plan.microbatch_size // d
    lines = [
        f'"""torchtitan recipe of a hybridplan plan{f" ({source})" if source else ""}: {pp} pipeline stage(s) x data {d}'
        f' x tensor {t} = {plan.num_devices} devices.',
        "",
        f"Run: NGPU={plan.num_devices} MODULE=<this module> CONFIG=hybridplan_plan ./run_train.sh",
        '"""',
        "",
        f"from {module} import {function} as _base",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "",
        f"NUM_BLOCKS = {layers.num_blocks}",
        f"MODULE_FQNS = {json.dumps(module_fqns(plan, layers))}",
        "",
        "",
        "def hybridplan_plan():",
        f'    """{base} with the plan\'s parallelism."""',
        "    config = _base()",
        "    blocks = getattr(getattr(config.model_spec, 'model', None), 'layers', None)",
        "    if blocks is not None and len(blocks) != NUM_BLOCKS:",
        "        raise ValueError(f'the plan is for {NUM_BLOCKS} transformer blocks, the base recipe has {len(blocks)}')",
        "    p = config.parallelism",
        f"    p.pipeline_parallel_degree = {pp}",
        f"    p.module_fqns_per_model_part = {'MODULE_FQNS' if pp > 1 else 'None'}",
        f"    p.pipeline_parallel_schedule = {SCHEDULE_NAMES[plan.schedule]!r}",
        f"    p.pipeline_parallel_microbatch_size = {per_replica}",
        f"    p.tensor_parallel_degree = {t}",
        "    p.enable_sequence_parallel = False",
        f"    p.data_parallel_replicate_degree = {d if zero == 0 else 1}",
        f"    p.data_parallel_shard_degree = {d if zero else 1}",
        f"    p.fsdp_reshard_after_forward = {('always' if zero == 3 else 'never') if zero else 'default'!r}",
        "    p.context_parallel_degree = 1",
        f"    config.training.local_batch_size = {plan.global_batch_size // d if pp > 1 else per_replica}",
        f"    config.training.global_batch_size = {plan.global_batch_size}",
    ]
    if pp > 1:
        lines.append("    config.training.disable_cuda_graphs = True  # torchtitan: CUDA graphs do not support pipelining yet")
    lines.append(f"    config.activation_checkpoint = {f'{recompute}.Config()' if recompute else 'None'}")
    lines.append("    return config")
    return "\n".join(lines) + "\n"
