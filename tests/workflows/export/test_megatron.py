"""Megatron-LM arguments, checked by megatron-core's own config classes.

megatron-core (the pip package) ships ``megatron.core`` but not Megatron-LM's ``megatron.training.arguments``
parser, so the exported arguments are read as Megatron-LM reads them (each ``--flag`` is the field of the same name
with underscores; ``--decoder-first/last-pipeline-num-layers`` become ``num_layers_in_first/last_pipeline_stage``,
megatron/training/argument_utils.py ``core_transformer_config_from_args``) into megatron-core's
``TransformerConfig`` (which validates the pipeline split and recompute settings in ``__post_init__``), its
``ConstantNumMicroBatchesCalculator`` (global batch = micro-batch x data-parallel x micro-batches) and
``OptimizerConfig``; then megatron-core's ``get_num_layers_to_build`` says how many blocks each pipeline rank
builds, which must be the plan's.
"""

from __future__ import annotations

import shlex

import pytest

from hybridplan.workflows.export import export_plan
from tests.workflows.export.plans import GPT_TINY, uniform

megatron = pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install '.[engines]')")

RENAMED = {"decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
           "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}


def _parse(text: str) -> dict[str, object]:
    words = shlex.split(" ".join(line for line in text.splitlines() if not line.startswith("#")))
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        key = words[i][2:].replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            value: object = words[i + 1]
            out[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _build(args: dict[str, object], world: int):
    import torch
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {RENAMED.get(k, k): v for k, v in args.items()
              if k not in ("micro_batch_size", "global_batch_size", "use_distributed_optimizer", "seq_length",
                           "max_position_embeddings")}
    config = TransformerConfig(**fields, pipeline_dtype=torch.float32)
    dp = world // (config.tensor_model_parallel_size * config.pipeline_model_parallel_size)
    micro = ConstantNumMicroBatchesCalculator(args["global_batch_size"], args["micro_batch_size"], dp, None, 0)
    OptimizerConfig(use_distributed_optimizer=bool(args.get("use_distributed_optimizer")))
    layout = config.pipeline_model_parallel_layout  # parsed by megatron-core; its rank look-ups need parallel_state
    if layout is not None:
        from megatron.core.transformer.enums import LayerType

        blocks = [layout.layout[r][0].count(LayerType.decoder) for r in range(config.pipeline_model_parallel_size)]
    else:
        blocks = [get_num_layers_to_build(config, pp_rank=r) for r in range(config.pipeline_model_parallel_size)]
    return config, micro.get(), blocks


@pytest.mark.parametrize("cuts, blocks, flag", [
    ([0, 5, 10], [4, 4], None),                                                   # even: no flag
    ([0, 3, 10], [2, 6], "decoder_first_pipeline_num_layers"),                     # uneven first/last
    ([0, 3, 7, 10], [2, 4, 2], "decoder_first_pipeline_num_layers"),
    ([0, 1, 5, 10], [0, 4, 4], "pipeline_model_parallel_layout"),                  # embedding alone: layout
    ([0, 2, 4, 9, 10], [1, 2, 5, 0], "pipeline_model_parallel_layout"),            # head alone, unequal middles
])
def test_cuts_are_megatrons(cuts, blocks, flag):
    plan = uniform(cuts, d=2)
    args = _parse(export_plan(plan, "megatron", GPT_TINY).text)
    assert flag is None and not any(k in args for k in ("decoder_first_pipeline_num_layers",
                                                          "pipeline_model_parallel_layout")) or flag in args
    config, microbatches, built = _build(args, plan.num_devices)
    assert built == blocks  # the blocks of each stage counted by hand from the cuts
    assert microbatches == plan.num_microbatches == 8
    assert args["micro_batch_size"] == 2  # 32 / 8 micro-batches / 2 replicas


def test_tensor_zero1_and_recompute():
    plan = uniform([0, 5, 10], d=2, t=2, zero=1, recompute="full")
    args = _parse(export_plan(plan, "megatron", GPT_TINY).text)
    config, microbatches, _ = _build(args, plan.num_devices)
    assert config.tensor_model_parallel_size == 2 and config.pipeline_model_parallel_size == 2
    assert args["use_distributed_optimizer"] is True
    assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == ("full", "uniform", 1)
    assert microbatches == 8


def test_a_wrong_layer_count_is_refused_by_megatron():
    """The check can fail: a layout of 7 blocks for an 8-block model."""
    plan = uniform([0, 1, 5, 10])
    args = _parse(export_plan(plan, "megatron", GPT_TINY).text)
    args["pipeline_model_parallel_layout"] = "E|tttt|tttL"
    with pytest.raises(AssertionError, match="must match num_layers"):
        _build(args, 3)
