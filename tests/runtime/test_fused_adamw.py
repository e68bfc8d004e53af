"""AdamW's fused step (``RunConfig.adamw = "fused"``; [Note: the AdamW step, multi-tensor or fused] in
runtime/precision.py): the step of Megatron-LM's, DeepSpeed's and torchtitan's fused Adam, in place without
temporaries (docs/engines.md, section 3). Counted on simulated devices against what the engines document, and real
gloo runs that train as one device does."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig, config_from_json, config_to_json
from hybridplan.runtime.cuda_allocator import round_size
from hybridplan.runtime.sim import simulate_stage
from tests.runtime.test_grad_buffers import FP32_GRADIENT_BYTES, PLAN, _stage_parameters
from tests.runtime.util import assert_same_training, make_plan


def _simulated(stage: int, adamw: str, *, precision: str = "fp32", grad_accumulation: str = "autograd",
               device_type: str = "cpu"):
    cluster = Cluster.parse("1x6", device_memory="80GiB") if device_type == "cuda" else Cluster.parse("1x6")
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster, backend="sim", precision=precision,
                    grad_accumulation=grad_accumulation, adamw=adamw, device_type=device_type)
    return simulate_stage(cfg, stage)


def _step_peak(result) -> int:
    """The last iteration's step: its peak."""
    return [a["peak"] for a in result.timeline if a["action"] == "step"][-1]


@pytest.mark.parametrize("stage", [0, 1, 2])  # ZeRO-1 replicas; tensor-parallel shards (DTensors); plain replicas
def test_fused_step_from_fp32_buffers_holds_nothing_beyond_the_training_state(stage):
    """Megatron-LM's way in bf16: fp32 gradient buffers and a fused Adam updating master and moments in place. The step's
    peak is the memory between iterations: parameters, buffers, masters and moments, not a byte more (the engines'
    bytes per parameter are the whole of it). The runtime's own step holds temporaries there."""
    fused = _simulated(stage, "fused", precision="bf16", grad_accumulation="fp32-buffer")
    default = _simulated(stage, "default", precision="bf16", grad_accumulation="fp32-buffer")
    assert _step_peak(fused) == fused.static[-1]
    assert _step_peak(default) > default.static[-1]
    assert fused.static == default.static  # the same state, only the step differs


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_fused_fp32_step_holds_the_gradients_alone(device_type):
    """fp32 with autograd's gradients (plain replicas of the last stage): at the step the device holds its training
    state and the gradients, 4 bytes per parameter, and the fused step adds nothing to them; the default step (CUDA:
    multi-tensor, with a copy of every second moment; CPU: the per-tensor loop) adds its temporaries."""
    fused, default = _simulated(2, "fused", device_type=device_type), _simulated(2, "default", device_type=device_type)
    assert _step_peak(fused) - fused.static[-1] == _gradient_bytes(2, device_type)
    assert _step_peak(default) > _step_peak(fused)
    assert fused.static == default.static


@pytest.mark.parametrize("zero", [2, 3])
def test_fused_step_on_fsdp2_shards(zero):
    """ZeRO-2/3 (FSDP2, runtime/sharding.py): the fused kernel steps the sharded DTensors, holding the same state, and
    its step holds less than the runtime's own."""
    plan = Plan.from_dict({**PLAN.to_dict(), "stages": [{"layers": [0, 3], "parallelism": "data", "degree": 2,
                                                           "devices": [0, 1], "zero": zero},
                                                          {"layers": [3, 10], "parallelism": "none", "degree": 1,
                                                           "devices": [2]}]})
    runs = {adamw: simulate_stage(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x3"), backend="sim",
                                            adamw=adamw), 0) for adamw in ("default", "fused")}
    assert runs["fused"].static == runs["default"].static
    assert runs["fused"].static[-1] < _step_peak(runs["fused"]) < _step_peak(runs["default"])


def _gradient_bytes(stage: int, device_type: str) -> int:
    """The fp32 gradients of PLAN's untensored ``stage``, one tensor per parameter, counted on the model's own layers;
    on CUDA each in the caching allocator's blocks of 512 bytes (runtime/cuda_allocator.py ``round_size``)."""
    s = PLAN.stages[stage]
    model = get_model("gpt-tiny")
    sizes = [FP32_GRADIENT_BYTES * p.numel() for i in range(s.start, s.stop) for p in model.build_layer(i).parameters()]
    assert sum(sizes) == FP32_GRADIENT_BYTES * _stage_parameters(stage)
    return sum(round_size(b) for b in sizes) if device_type == "cuda" else sum(sizes)


def test_adamw_is_checked_and_written():
    cluster = Cluster.parse("1x6")
    with pytest.raises(UsageError, match="AdamW implementation 'apex' is not supported"):
        RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster, adamw="apex")  # type: ignore[arg-type]
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster, adamw="fused")
    assert config_from_json(config_to_json(cfg)) == cfg and cfg.describe()["adamw"] == "fused"
    assert "adamw" not in RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster).describe()


@pytest.mark.distributed
def test_fused_step_trains_as_one_device_on_zero1_and_tensor_stages():
    """fp32: the fused kernel computes AdamW's update (to rounding: the helper's 1e-5 tolerances against one device
    stepping with the per-tensor loop), through ZeRO-1 replicas (their shares) and a tensor stage (DTensor shards)."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    data = plan.to_dict()
    data["stages"][0]["zero"] = 1
    assert_same_training("gpt-tiny", type(plan).from_dict(data), "1x4", adamw="fused")
