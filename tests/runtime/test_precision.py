"""Training options: mixed precision (fp32 master weights and AdamW states) and activation checkpointing,
in unit tests and in real multi-process runs on gloo."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hybridplan.errors import UsageError
from hybridplan.runtime.precision import (
    DEFAULT_FP16_LOSS_SCALE,
    MixedPrecisionAdamW,
    build_optimizer,
    cast_module,
    check_precision,
    loss_scale_of,
)
from hybridplan.runtime.sim import fake_process_group
from tests.runtime.util import make_plan, single_device

BF16_UNIT_ROUNDOFF = 2.0**-8
"""bfloat16 keeps 8 significant bits: round-to-nearest changes a value by at most 2^-8 of it."""


def test_build_optimizer_fp32_is_torch_adamw_with_the_modelled_devices_implementation():
    m = nn.Linear(3, 3)
    cpu = build_optimizer(m, precision="fp32", learning_rate=1e-3, weight_decay=0.01, loss_scale=None, device_type="cpu")
    cuda = build_optimizer(m, precision="fp32", learning_rate=1e-3, weight_decay=0.01, loss_scale=None, device_type="cuda")
    assert type(cpu) is torch.optim.AdamW and m.weight.dtype == torch.float32
    assert cpu.defaults["foreach"] is False and cuda.defaults["foreach"] is True


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_keeps_fp32_masters_and_steps_like_adamw(precision, dtype):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    reference = [p.detach().clone() for p in m.parameters()]
    opt = build_optimizer(m, precision=precision, learning_rate=1e-2, weight_decay=0.01, loss_scale=None, device_type="cpu")
    params = list(m.parameters())
    assert all(p.dtype == dtype for p in params)
    masters = [opt.state[p]["master"] for p in params]
    assert all(w.dtype == torch.float32 for w in masters)
    assert all(torch.equal(w, r) for w, r in zip(masters, reference))  # the fp32 values, not rounded ones
    scale = loss_scale_of(precision, None)
    (m(torch.randn(4, 8, dtype=dtype)).float().square().mean() * scale).backward()
    grads = [p.grad.float() / scale for p in params]
    opt.step()
    # The same update with torch's AdamW on fp32 copies given the (unscaled) low-precision gradients.
    copies = [nn.Parameter(r.clone()) for r in reference]
    for c, g in zip(copies, grads):
        c.grad = g
    torch.optim.AdamW(copies, lr=1e-2, weight_decay=0.01).step()
    for w, c, p in zip(masters, copies, params):
        assert torch.equal(w, c.detach())
        assert torch.equal(p.detach(), c.detach().to(dtype))  # copied back into the low-precision parameter
    assert opt.state[params[0]]["exp_avg"].dtype == torch.float32


def test_master_of_a_tensor_parallel_parameter_is_a_dtensor():
    from torch.distributed.device_mesh import DeviceMesh

    from hybridplan.models.tensor_parallel import TensorParallelGroup
    from hybridplan.models.zoo import get_model

    model = get_model("gpt-tiny")
    with fake_process_group(0, 2):  # real tensors; the fake group makes the collectives no-ops
        group = dist.new_group([0, 1])
        tp = TensorParallelGroup(group, DeviceMesh.from_group(group, "cpu"), 0, 2)
        block = model.build_layer(1)
        model.tensor_parallel_plan(1).apply(block, tp)
        opt = build_optimizer(block, precision="bf16", learning_rate=1e-3, weight_decay=0.0, loss_scale=None, device_type="cpu")
        weight = block.attn.q.parametrizations.weight.original
        master = opt.state[weight]["master"]
        assert type(weight).__name__ == type(master).__name__ == "DTensor"
        assert weight.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert master.placements == weight.placements and master.to_local().shape == weight.to_local().shape
        block(torch.randn(2, 16, 64, dtype=torch.bfloat16)).float().sum().backward()
        opt.step()
        assert torch.equal(weight.to_local(), master.to_local().to(torch.bfloat16))


def test_cast_module_keeps_shared_parameters_shared_and_order():
    a = nn.Linear(2, 2)
    m = nn.Sequential(a, nn.ReLU(), a)
    pairs = cast_module(m, torch.bfloat16)
    assert [p for p, _ in pairs] == list(m.parameters()) and len(pairs) == 2
    assert m[0].weight is m[2].weight


def test_precision_options_are_checked():
    with pytest.raises(UsageError, match="precision 'fp8' is not supported"):
        check_precision("fp8", None)
    with pytest.raises(UsageError, match="only applies to 'fp16'"):
        check_precision("bf16", 64.0)
    with pytest.raises(UsageError, match="must be positive"):
        check_precision("fp16", 0.0)
    assert loss_scale_of("fp16", None) == DEFAULT_FP16_LOSS_SCALE and loss_scale_of("bf16", None) == 1.0
    with pytest.raises(ValueError, match="fp32"):
        MixedPrecisionAdamW([(nn.Parameter(torch.zeros(2)), torch.zeros(2, dtype=torch.float16))], lr=1.0, weight_decay=0.0)


# ---------------------------------------------------------------------------------------------- real runs
def _run(plan, cluster: str, **kw):
    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=3, **kw))
    assert result.ok, result.reason
    return result


@pytest.mark.distributed
def test_bf16_plan_trains_like_one_bf16_device():
    """A data x2 -> tensor x2 plan in bf16 has the losses of one device in bf16.

    Tolerance: the plans differ only in how sums are split and rounded (tensor-parallel partial sums
    and data-parallel gradient sums are rounded to bf16 before they are added), each rounding at most
    u = 2^-8 relative; the loss averages 256 token losses computed in fp32, so such differences mostly
    cancel. Measured: at most 9.2e-5 relative over the 3 iterations; the bound u/4 ~ 1e-3 leaves 10x
    margin and is still 40x tighter than a single bf16 rounding of a logit could move the loss.
    """
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    got = _run(plan, "1x4", precision="bf16")
    ref = _run(single_device(plan), "1x1", precision="bf16")
    assert len(got.losses) == 3
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= BF16_UNIT_ROUNDOFF / 4 * abs(b), (got.losses, ref.losses)
    # It trained in mixed precision: 2-byte parameters and gradients, 12 bytes of optimizer state each.
    for d in got.devices:
        parts = d.peak_breakdown
        assert parts["gradients"] == parts["parameters"] and parts["optimizer"] == 6 * parts["parameters"]


@pytest.mark.distributed
def test_checkpointing_trains_the_same_and_keeps_fewer_activations():
    """Recomputation repeats the same kernels on the same inputs: the losses are bitwise equal (fp32),
    tensor-parallel collectives included; each device's activation memory at its peak drops."""
    plan = make_plan("gpipe", 16, 4, [(0, 5, "tensor", [0, 1]), (5, 10, "data", [2, 3])])
    plain = _run(plan, "1x4")
    ckpt = _run(plan, "1x4", activation_checkpointing=True)
    assert ckpt.losses == plain.losses
    for p, c in zip(plain.devices, ckpt.devices):
        assert c.peak_breakdown["activations"] * 4 < p.peak_breakdown["activations"]
        assert c.peak_memory_bytes < p.peak_memory_bytes
        assert c.static_memory_bytes == p.static_memory_bytes
