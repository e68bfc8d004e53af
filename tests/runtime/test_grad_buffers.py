"""fp32 gradient buffers (runtime/grad_buffers.py, Megatron's ``main_grad``): what they accumulate, the memory the
simulated devices count against Megatron's published bytes per parameter, and real gloo runs that train as one
device does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig, config_from_json, config_to_json
from hybridplan.runtime.grad_buffers import Fp32GradBuffers
from hybridplan.runtime.sim import simulate_stage
from tests.runtime.test_precision import BF16_UNIT_ROUNDOFF, _run
from tests.runtime.util import assert_same_training, make_plan, single_device

# Megatron-LM's distributed optimizer documentation (docs/user-guide/features/dist_optimizer.md; docs/engines.md),
# bytes per parameter without the distributed optimizer: bf16 parameters with fp32 gradients 18 (2 parameter +
# 4 gradient + 4 master + 8 moments), fp32 parameters with fp32 gradients 16 (4 + 4 + 8). ZeRO's mixed precision
# count (Rajbhandari et al. 2020, section 3.1), as this runtime holds it with autograd's gradients: 2 + 2 + 12 = 16.
MEGATRON_BF16_FP32_GRADS = 18
MEGATRON_FP32 = 16
ZERO_MIXED_PRECISION = 2 + 2 + 12
FP32_GRADIENT_BYTES = 4
"""A gradient buffer element: fp32. Between iterations autograd holds no gradient at all, so the buffers are all
that the static memory gains."""


def test_buffers_accumulate_micro_batches_in_fp32_and_free_each_grad():
    torch.manual_seed(0)
    m = nn.Linear(8, 4).to(torch.bfloat16)
    opt = Fp32GradBuffers(torch.optim.SGD(m.parameters(), lr=0.0), list(m.parameters()))
    xs = [torch.randn(3, 8, dtype=torch.bfloat16) for _ in range(3)]
    expected, in_bf16 = torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bfloat16)
    for x in xs:
        m(x).sum().backward()
        assert m.weight.grad is None  # freed as soon as it is added into the buffer
        micro_batch = torch.ones(3, 4, dtype=torch.bfloat16).T @ x  # d(sum of outputs)/d(weight), in bf16
        expected += micro_batch.float()
        in_bf16 += micro_batch  # what autograd's bf16 .grad would hold
    buffer = m.weight.main_grad
    assert buffer.dtype == torch.float32 and torch.equal(buffer, expected)
    assert not torch.equal(in_bf16.float(), expected)  # (the sums differ: bf16 rounds each one)
    assert torch.equal(m.bias.main_grad, torch.full((4,), 9.0))  # 3 rows x 3 micro-batches, exact in fp32
    storage = buffer.untyped_storage().data_ptr()
    opt.zero_grad()
    assert torch.count_nonzero(buffer) == 0 and buffer.untyped_storage().data_ptr() == storage  # kept, not freed


def test_an_fp32_parameter_steps_from_its_buffer_like_from_its_grad():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.AdamW(a.parameters(), lr=0.1)
    opt_b = Fp32GradBuffers(torch.optim.AdamW(b.parameters(), lr=0.1), list(b.parameters()))
    for _ in range(2):
        opt_a.zero_grad()
        opt_b.zero_grad()
        for x in torch.randn(3, 2, 4):  # three micro-batches
            a(x).square().sum().backward()
            b(x).square().sum().backward()
        opt_a.step()
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)  # 0 + g1 + g2 + g3 is autograd's g1 + g2 + g3 to the bit


# ---------------------------------------------------------------------------------------------- simulated devices
PLAN = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
    {"layers": [0, 3], "parallelism": "data", "degree": 2, "devices": [0, 1], "zero": 1},
    {"layers": [3, 7], "parallelism": "tensor", "degree": 2, "devices": [2, 3]},
    {"layers": [7, 10], "parallelism": "data", "degree": 2, "devices": [4, 5]}]})


def _stage_parameters(stage: int) -> int:
    """Parameters of an untensored stage of PLAN, counted on the model's own layers."""
    model = get_model("gpt-tiny")
    s = PLAN.stages[stage]
    return sum(p.numel() for i in range(s.start, s.stop) for p in model.build_layer(i).parameters())


def _simulated(stage: int, precision: str, grad_accumulation: str):
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x6"), backend="sim", precision=precision,
                    grad_accumulation=grad_accumulation)
    return simulate_stage(cfg, stage)


@pytest.mark.parametrize("stage", [0, 2])  # ZeRO-1 replicas; plain replicas (last stage: the loss)
def test_simulated_bf16_stage_keeps_4_more_bytes_per_parameter_and_holds_megatrons_18(stage):
    n = _stage_parameters(stage)
    plain, buffered = _simulated(stage, "bf16", "autograd"), _simulated(stage, "bf16", "fp32-buffer")
    assert buffered.static[-1] - plain.static[-1] == FP32_GRADIENT_BYTES * n
    got, ref = buffered.breakdowns[-1], plain.breakdowns[-1]
    assert got["gradients"] == FP32_GRADIENT_BYTES * n and ref["gradients"] == 2 * n
    if stage == 2:  # unsharded: the model state at the peak is Megatron's 18 bytes per parameter against ZeRO's 16
        assert got["parameters"] + got["gradients"] + got["optimizer"] == MEGATRON_BF16_FP32_GRADS * n
        assert ref["parameters"] + ref["gradients"] + ref["optimizer"] == ZERO_MIXED_PRECISION * n
    # Each action's peak: before the first backward autograd holds no gradient (the whole 4-byte buffer is extra);
    # once every parameter has one, a 4-byte buffer stands where a 2-byte gradient was: 18 - 16 bytes.
    gains = {a["action"]: b["peak"] - a["peak"] for a, b in zip(plain.timeline, buffered.timeline, strict=True)}
    first_backward = list(gains).index("B0")
    assert set(list(gains.values())[:first_backward]) == {FP32_GRADIENT_BYTES * n}
    after = [gains[a] for a in list(gains)[first_backward + 1:] if a != "step"]
    assert after and set(after) == {(MEGATRON_BF16_FP32_GRADS - ZERO_MIXED_PRECISION) * n}
    assert gains["step"] < after[0]  # the step steps from the fp32 buffers: no fp32 copy of a gradient


def test_simulated_tensor_stage_buffers_its_shards():
    plain, buffered = _simulated(1, "bf16", "autograd"), _simulated(1, "bf16", "fp32-buffer")
    shard_bytes = buffered.breakdowns[-1]["parameters"]  # bf16: 2 bytes per element of this device's shards
    assert buffered.breakdowns[-1]["gradients"] == 2 * shard_bytes
    assert buffered.static[-1] - plain.static[-1] == FP32_GRADIENT_BYTES * shard_bytes // 2


def test_simulated_fp32_stage_keeps_its_gradients_and_holds_megatrons_16():
    n = _stage_parameters(2)
    plain, buffered = _simulated(2, "fp32", "autograd"), _simulated(2, "fp32", "fp32-buffer")
    assert buffered.static[-1] - plain.static[-1] == FP32_GRADIENT_BYTES * n
    got = buffered.breakdowns[-1]
    assert got["parameters"] + got["gradients"] + got["optimizer"] == MEGATRON_FP32 * n
    assert buffered.iteration_peaks[-1] == plain.iteration_peaks[-1]  # the buffer is the gradient autograd held


# ---------------------------------------------------------------------------------------------- settings
def test_grad_accumulation_is_checked_and_written():
    cluster = Cluster.parse("1x6")
    with pytest.raises(UsageError, match="gradient accumulation 'bf16-buffer' is not supported"):
        RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster, grad_accumulation="bf16-buffer")  # type: ignore[arg-type]
    zero3 = Plan.from_dict({**PLAN.to_dict(), "stages": [{**PLAN.to_dict()["stages"][0], "zero": 3},
                                                         *PLAN.to_dict()["stages"][1:]]})
    with pytest.raises(UsageError, match="stage 0 .* is ZeRO-3, whose FSDP2 units already accumulate"):
        RunConfig(model="gpt-tiny", plan=zero3, cluster=cluster, grad_accumulation="fp32-buffer")
    two_bw = make_plan("2bw", 16, 4, [(0, 5, "none", [0]), (5, 10, "none", [1])])
    with pytest.raises(UsageError, match="not run under PipeDream-2BW"):
        RunConfig(model="gpt-tiny", plan=two_bw, cluster=Cluster.parse("1x2"), grad_accumulation="fp32-buffer")
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster, grad_accumulation="fp32-buffer")
    assert config_from_json(config_to_json(cfg)) == cfg and cfg.describe()["grad_accumulation"] == "fp32-buffer"
    assert "grad_accumulation" not in RunConfig(model="gpt-tiny", plan=PLAN, cluster=cluster).describe()


# ---------------------------------------------------------------------------------------------- real runs
@pytest.mark.distributed
def test_fp32_buffers_train_as_one_device_on_zero1_and_tensor_stages():
    """fp32: the buffer's sum 0 + g1 + ... + gm is autograd's, the all-reduce sums the same values: the run trains
    as one device does (the helper's 1e-5 tolerances), through ZeRO-1 replicas and a tensor-parallel stage."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    plan = Plan.from_dict({**plan.to_dict(), "stages": [{**plan.to_dict()["stages"][0], "zero": 1},
                                                        plan.to_dict()["stages"][1]]})
    got = assert_same_training("gpt-tiny", plan, "1x4", grad_accumulation="fp32-buffer")
    plain = _run(plan, "1x4")
    assert got.losses == plain.losses  # to the bit
    for d, p in zip(got.devices, plain.devices, strict=True):  # kept between iterations: 4 bytes per parameter more
        assert d.static_memory_bytes - p.static_memory_bytes == d.peak_breakdown["parameters"]  # (fp32: 4 bytes each)


@pytest.mark.distributed
def test_bf16_buffers_train_like_one_bf16_device():
    """bf16 with fp32 buffers against one bf16 device accumulating in bf16: the buffers only round less (each
    micro-batch's bf16 gradient is added exactly in fp32, where autograd rounds every sum to bf16), so the losses
    differ by less than the bound of test_precision's bf16 plan test (u/4 relative; measured in the report)."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    got = _run(plan, "1x4", precision="bf16", grad_accumulation="fp32-buffer")
    ref = _run(single_device(plan), "1x1", precision="bf16")
    assert len(got.losses) == 3
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= BF16_UNIT_ROUNDOFF / 4 * abs(b), (got.losses, ref.losses)
    plain = _run(plan, "1x4", precision="bf16")
    for d, p in zip(got.devices, plain.devices, strict=True):
        parts = d.peak_breakdown  # 2-byte parameters, 4-byte gradient buffers, 12 bytes of optimizer state each
        assert parts["gradients"] == 2 * parts["parameters"] and parts["optimizer"] == 6 * parts["parameters"]
        n = parts["parameters"] // 2
        assert d.static_memory_bytes - p.static_memory_bytes == FP32_GRADIENT_BYTES * n
