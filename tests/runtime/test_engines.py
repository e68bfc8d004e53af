"""Engine profiles (runtime/engines.py): the options each engine sets, its refusals, hybridplan's predictions
unchanged, and Megatron's profile measured against Megatron's published bytes per parameter."""

from __future__ import annotations

import json

import pytest

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.engines import ENGINES, engine_run_options, not_modelled
from hybridplan.runtime.launch import launch
from hybridplan.runtime.sim import simulate_stage
from hybridplan.workflows.estimate_memory import estimate_plans
from tests.runtime.test_grad_buffers import MEGATRON_BF16_FP32_GRADS
from tests.runtime.util import make_plan

PLAN = make_plan("1f1b", 16, 4, [(0, 5, "data", [0, 1]), (5, 10, "none", [2])])
FSDP = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
    {"layers": [0, 3], "parallelism": "data", "degree": 2, "devices": [0, 1], "zero": 3, "recompute": "selective"},
    {"layers": [3, 10], "parallelism": "data", "degree": 2, "devices": [2, 3], "zero": 2}]})
"""A torchtitan plan: every stage FSDP-sharded (ZeRO-3, then ZeRO-2: ``fsdp_reshard_after_forward`` "always",
"never"), the first recomputing selectively."""


def _with(plan: Plan, stage: int, **fields) -> Plan:
    data = plan.to_dict()
    data["stages"][stage].update(fields)
    return Plan.from_dict(data)


def test_hybridplan_sets_nothing_and_its_estimate_is_unchanged():
    assert engine_run_options("hybridplan", plan=PLAN, precision="bf16") == {} and not_modelled("hybridplan") == ()
    base = {"precision": "bf16"}
    cluster = Cluster.parse("1x3")
    plain = estimate_plans("gpt-tiny", cluster, [PLAN], run_options=base)
    named = estimate_plans("gpt-tiny", cluster, [PLAN],
                           run_options={**base, **engine_run_options("hybridplan", plan=PLAN, precision="bf16")})
    assert json.dumps([e.to_dict() for e in named]) == json.dumps([e.to_dict() for e in plain])


def test_megatron_profile_holds_megatrons_18_bytes_per_parameter_in_bf16():
    options = engine_run_options("megatron", plan=PLAN, precision="bf16")
    assert options == {"grad_accumulation": "fp32-buffer", "adamw": "fused"}
    model = get_model("gpt-tiny")
    n = sum(p.numel() for i in range(5, 10) for p in model.build_layer(i).parameters())
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x3"), backend="sim", precision="bf16", **options)
    stage = simulate_stage(cfg, 1)
    parts = stage.breakdowns[-1]
    assert parts["parameters"] + parts["gradients"] + parts["optimizer"] == MEGATRON_BF16_FP32_GRADS * n
    # its fused Adam steps in place from the fp32 buffers: the step holds nothing beyond the training state
    assert [a["peak"] for a in stage.timeline if a["action"] == "step"][-1] == stage.static[-1]


def test_engines_refuse_what_is_not_modelled_with_the_reason():
    tensor_last = make_plan("1f1b", 16, 4, [(0, 5, "none", [0]), (5, 10, "tensor", [1, 2])])
    assert engine_run_options("megatron", plan=tensor_last, precision="bf16") == {  # its loss on vocabulary shards
        "grad_accumulation": "fp32-buffer", "adamw": "fused", "loss": "vocab-parallel"}
    assert engine_run_options("megatron", plan=_with(PLAN, 0, zero=1), precision="bf16") == {  # its distributed
        "grad_accumulation": "fp32-buffer", "adamw": "fused", "zero1": "flat"}  # optimizer's flat partition
    with pytest.raises(UsageError, match="stage 0 .* is ZeRO-3: Megatron-LM shards the optimizer state with its"):
        engine_run_options("megatron", plan=_with(PLAN, 0, zero=3), precision="bf16")
    with pytest.raises(UsageError, match="Megatron-LM's fp16 training .* is not modelled yet"):
        engine_run_options("megatron", plan=PLAN, precision="fp16")
    for schedule in ("gpipe", "2bw"):  # Megatron-LM runs 1F1B: export turns these into it (docs/export.md)
        with pytest.raises(UsageError, match=f"schedule is {schedule}: Megatron-LM runs 1F1B"):
            engine_run_options("megatron", plan=Plan.from_dict({**PLAN.to_dict(), "schedule": schedule}), precision="bf16")
    assert engine_run_options("megatron", plan=Plan.from_dict({**PLAN.to_dict(), "schedule": "flush"}),
                              precision="bf16") == {"grad_accumulation": "fp32-buffer",
                                                         "adamw": "fused"}
    with pytest.raises(UsageError, match="the deepspeed engine's memory is not modelled yet: .*section"):
        engine_run_options("deepspeed", plan=PLAN, precision="bf16")
    for engine in ("deepspeed", "torchtitan"):
        assert not_modelled(engine)  # it says what is missing
    with pytest.raises(UsageError, match=r"stage 1 \(.*\) is not FSDP-sharded: torchtitan wraps every stage in FSDP2"):
        engine_run_options("torchtitan", plan=_with(PLAN, 0, zero=3), precision="bf16")
    with pytest.raises(UsageError, match="torchtitan trains in bf16 or fp32"):
        engine_run_options("torchtitan", plan=FSDP, precision="fp16")
    fsdp_tensor = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
        {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [0, 1, 2, 3],
         "zero": 3}]})
    assert engine_run_options("torchtitan", plan=fsdp_tensor, precision="bf16") == {  # loss parallel
        "fsdp_reduce": "fp32", "adamw": "fused", "loss": "vocab-parallel"}
    with pytest.raises(UsageError, match="engine 'nemo' is not known"):
        engine_run_options("nemo", plan=PLAN, precision="bf16")
    assert ENGINES == ("hybridplan", "megatron", "deepspeed", "torchtitan")
    assert engine_run_options("megatron", plan=PLAN, precision="fp32") == {"grad_accumulation": "fp32-buffer",
                                                                           "adamw": "fused"}


def test_torchtitan_profile_reduce_scatters_in_fp32_and_the_simulator_counts_it_as_it_runs():
    """torchtitan's FSDP2 reduce-scatters gradients in fp32 (``mixed_precision_reduce``) and steps with fused AdamW:
    in bf16 each device holds between iterations what hybridplan's runtime holds (fp32 shards as masters, their
    moments), and more at its peak (each unit's gradients cast to fp32 for the collective); a real gloo run of the
    options trains like one bf16 device (tests/runtime/test_precision.py's bound), and the simulated devices count it
    byte for byte."""
    from tests.runtime.test_precision import BF16_UNIT_ROUNDOFF
    from tests.runtime.util import single_device

    options = engine_run_options("torchtitan", plan=FSDP, precision="bf16")
    assert options == {"fsdp_reduce": "fp32", "adamw": "fused"}

    def run(plan: Plan, cluster: str, backend: str, **opts):
        result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=2,
                                  precision="bf16", backend=backend, **opts))
        assert result.ok, result.reason
        return result

    real, sim = run(FSDP, "1x4", "real", **options), run(FSDP, "1x4", "sim", **options)
    assert [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in sim.devices] == \
        [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in real.devices]
    ours = simulate_stage(RunConfig(model="gpt-tiny", plan=FSDP, cluster=Cluster.parse("1x4"), precision="bf16"), 0)
    assert real.devices[0].static_memory_bytes == ours.static[-1]
    assert real.devices[0].iteration_peaks[-1] > ours.iteration_peaks[-1]
    one = run(single_device(FSDP), "1x1", "real")
    for a, b in zip(real.losses, one.losses, strict=True):
        assert abs(a - b) <= BF16_UNIT_ROUNDOFF / 4 * abs(b), (real.losses, one.losses)
