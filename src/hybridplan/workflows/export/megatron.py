"""Megatron-LM: the command-line arguments of ``pretrain_gpt.py`` that set the plan's parallelism.

The argument names are Megatron-LM's (megatron/training/arguments.py); Megatron-LM turns them into
megatron-core's ``TransformerConfig`` fields (megatron/training/argument_utils.py
``core_transformer_config_from_args``: the same names with underscores, except ``--decoder-first/last-pipeline-
num-layers``, which become ``num_layers_in_first/last_pipeline_stage``). The cuts:

- an even split of the transformer blocks: no argument;
- an uneven first and/or last stage with equal middle stages: ``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers`` (each at least 1);
- anything else: ``--pipeline-model-parallel-layout``, one ``|``-separated stage per pipeline rank of ``E``
  (embedding), ``t`` (transformer block) and ``L`` (final norm, output layer and loss).

Then ``--micro-batch-size`` (per data-parallel rank), ``--global-batch-size``, ``--use-distributed-optimizer``
(ZeRO-1), ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (every block
recomputed). The model's own sizes (``--hidden-size`` ...) are added for a GPT of the zoo.
"""

from __future__ import annotations

from hybridplan.plan import Plan
from hybridplan.workflows.export.layers import ModelLayers

__all__ = ["megatron_arguments", "pipeline_layout", "format_arguments"]


def pipeline_layout(plan: Plan, layers: ModelLayers) -> str:
    """The plan's cuts as ``--pipeline-model-parallel-layout``, e.g. ``Ettt|tttt|tL``."""
    out = []
    for s in plan.stages:
        text = ("E" if s.start == 0 else "") + "t" * len(layers.blocks_of(s.start, s.stop))
        out.append(text + ("L" if s.stop == layers.num_layers else ""))
    return "|".join(out)


def megatron_arguments(plan: Plan, layers: ModelLayers) -> list[str]:
    """The arguments for a plan Megatron-LM can run (:func:`~.capabilities.nearest_plan` is empty)."""
    s0 = plan.stages[0]
    pp, d, t = plan.num_stages, s0.data_degree, s0.tensor_degree
    args = ["--tensor-model-parallel-size", str(t), "--pipeline-model-parallel-size", str(pp),
            "--num-layers", str(layers.num_blocks)]
    cfg = layers.config
    if cfg.get("family") == "gpt":
        args += ["--hidden-size", str(cfg["hidden_size"]), "--num-attention-heads", str(cfg["num_heads"]),
                 "--ffn-hidden-size", str(4 * cfg["hidden_size"]), "--seq-length", str(cfg["seq_len"]),
                 "--max-position-embeddings", str(cfg["seq_len"])]
    if pp > 1:
        counts = [len(layers.blocks_of(s.start, s.stop)) for s in plan.stages]
        first, last, middle = counts[0], counts[-1], counts[1:-1]
        even = len(set(counts)) == 1
        if not even:
            if first >= 1 and last >= 1 and len(set(middle)) <= 1 and (not middle or middle[0] >= 1):
                args += ["--decoder-first-pipeline-num-layers", str(first),
                         "--decoder-last-pipeline-num-layers", str(last)]
            else:
                args += ["--pipeline-model-parallel-layout", pipeline_layout(plan, layers)]
    args += ["--micro-batch-size", str(plan.microbatch_size // d), "--global-batch-size", str(plan.global_batch_size)]
    if s0.zero == 1:
        args.append("--use-distributed-optimizer")
    if s0.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return args


def format_arguments(args: list[str], *, source: str = "", plan: Plan) -> str:
    """The arguments one option per line, after comment lines saying how to use them."""
    lines = [f"# Megatron-LM arguments of a hybridplan plan{f' ({source})' if source else ''}: {plan.num_devices} devices",
             "# (data-parallel degree = devices / (tensor x pipeline) is implied by the world size)",
             f"# use: torchrun --nproc-per-node ... pretrain_gpt.py $(grep -v '^#' THIS_FILE) <data, tokenizer, ...>"]
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    return "\n".join(lines) + "\n"
