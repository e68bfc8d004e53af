"""torchtitan recipes, checked by torchtitan's own ``ConfigManager`` (the ``--module/--config`` loader and tyro
parser its trainer uses, with ``Trainer.Config``'s validation), its ``ParallelDims`` (the degrees must fill the
world) and its Llama model built on the meta device: every exported module name must be one of the model's.

torchtitan's model code imports triton, so the engines extra installs it (CPU-only torch has none).
"""

from __future__ import annotations

import sys

import pytest

from hybridplan.workflows.export import export_plan
from tests.workflows.export.plans import GPT_TINY, uniform

pytest.importorskip("triton", reason="torchtitan's models import triton (pip install '.[engines]')")
pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install '.[engines]')")

BASE = """
from torchtitan.models.llama3.config_registry import llama3_debugmodel


def debug8():
    config = llama3_debugmodel()  # 6 blocks; gpt-tiny has 8
    config.model_spec.model.layers = config.model_spec.model.layers + config.model_spec.model.layers[:2]
    return config
"""


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    (tmp_path / "hp_base8.py").write_text(BASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)

    def load(plan, name):
        text = export_plan(plan, "torchtitan", GPT_TINY, torchtitan_base="hp_base8:debug8").text
        (tmp_path / f"{name}.py").write_text(text)
        from torchtitan.config.manager import ConfigManager

        return ConfigManager().parse_args(["--module", name, "--config", "hybridplan_plan"])

    yield load
    for name in [m for m in sys.modules if m.startswith("hp_")]:
        del sys.modules[name]


def _module_names(config) -> set[str]:
    import torch

    with torch.device("meta"):
        model = config.model_spec.model.build()
    return {name for name, _ in model.named_modules()}


def test_pipeline_of_data_replicas(recipes):
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = uniform([0, 3, 10], d=2, schedule="gpipe")
    config = recipes(plan, "hp_pipeline")
    p = config.parallelism
    assert (p.pipeline_parallel_degree, p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
            p.tensor_parallel_degree) == (2, 2, 1, 1)
    assert p.pipeline_parallel_schedule == "GPipe"
    from torch.distributed.pipelining.schedules import ScheduleGPipe, get_schedule_class

    assert get_schedule_class(p.pipeline_parallel_schedule) is ScheduleGPipe  # the name torchtitan looks up
    assert p.module_fqns_per_model_part == [["tok_embeddings", "layers.0", "layers.1"],
                                            [f"layers.{i}" for i in range(2, 8)] + ["norm", "lm_head"]]
    # 32 samples in 8 micro-batches of 4, split over 2 replicas: 16 per replica per step, 2 per micro-batch
    assert (config.training.local_batch_size, p.pipeline_parallel_microbatch_size, config.training.global_batch_size) == (16, 2, 32)
    assert config.activation_checkpoint is None
    ParallelDims.from_config(p, world_size=plan.num_devices)
    names = _module_names(config)
    assert {n for part in p.module_fqns_per_model_part for n in part} <= names


def test_fsdp_tensor_and_recompute(recipes):
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = uniform([0, 5, 10], d=2, t=2, zero=3, recompute="full")
    config = recipes(plan, "hp_fsdp")
    p = config.parallelism
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.fsdp_reshard_after_forward) == (1, 2, "always")
    assert p.tensor_parallel_degree == 2 and p.enable_sequence_parallel is False
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    ParallelDims.from_config(p, world_size=plan.num_devices)
    with pytest.raises(AssertionError):  # the check can fail: the same degrees on one device fewer
        ParallelDims.from_config(p, world_size=plan.num_devices - 1)


def test_selective_recompute_is_torchtitans_per_operation_policy(recipes):
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    config = recipes(uniform([0, 10], d=4, zero=3, recompute="selective"), "hp_selective")
    assert type(config.activation_checkpoint) is SelectiveAC.Config


def test_single_stage_accumulates_gradients(recipes):
    plan = uniform([0, 10], d=4)
    config = recipes(plan, "hp_single")
    assert config.parallelism.pipeline_parallel_degree == 1
    # no pipeline: a micro-batch of 4 samples is 1 per replica; torchtitan accumulates 32 / (1 x 4) = 8 steps
    assert (config.training.local_batch_size, config.training.global_batch_size) == (1, 32)


def test_a_base_of_another_depth_is_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    text = export_plan(uniform([0, 5, 10]), "torchtitan", GPT_TINY).text  # llama3_debugmodel: 6 blocks, not 8
    (tmp_path / "hp_six.py").write_text(text)
    from torchtitan.config.manager import ConfigManager

    with pytest.raises(ValueError, match="8 transformer blocks, the base recipe has 6"):
        ConfigManager().parse_args(["--module", "hp_six", "--config", "hybridplan_plan"])
    del sys.modules["hp_six"]
