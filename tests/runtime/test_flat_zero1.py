"""ZeRO-1 with a flat, evenly split partition (runtime/flat_zero1.py, DeepSpeed's and Megatron-LM's distributed
optimizer's way): the ranges, the memory the simulated devices count against the engines' published bytes per
parameter, and real gloo runs that train as one device does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig, config_from_json, config_to_json
from hybridplan.runtime.flat_zero1 import flat_ranges
from hybridplan.runtime.sim import simulate_stage
from tests.runtime.test_precision import BF16_UNIT_ROUNDOFF, _run
from tests.runtime.util import assert_same_training, make_plan, single_device

# Megatron-LM's distributed optimizer (docs/user-guide/features/dist_optimizer.md; docs/engines.md): bytes per
# parameter over d data-parallel ranks, bf16 parameters with fp32 gradients 6 + 12/d, fp32 parameters and gradients
# 8 + 8/d.
MEGATRON_BF16 = (6, 12)
MEGATRON_FP32 = (8, 8)


@pytest.mark.parametrize(("numels", "ranks"), [([6, 4], 3), ([1, 1, 1], 2), ([5], 4), ([3, 100, 7], 8), ([2], 3)])
def test_every_element_is_in_exactly_one_range_of_equal_size(numels, ranks):
    ranges = flat_ranges(numels, ranks)
    assert len(ranges) == ranks
    covered = [(i, e) for pieces in ranges for i, a, b in pieces for e in range(a, b)]
    assert sorted(covered) == [(i, e) for i, n in enumerate(numels) for e in range(n)]  # once each, none twice
    size = -(-sum(numels) // ranks)
    assert all(sum(b - a for _, a, b in pieces) <= size for pieces in ranges)
    assert [sum(b - a for _, a, b in pieces) for pieces in ranges if pieces][:-1] == [size] * (
        sum(1 for p in ranges if p) - 1)  # full ranges but the last


# ---------------------------------------------------------------------------------------------- simulated devices
# The first stage holds gpt-tiny's embedding: its 8,192-element token table is a large share of the stage, which
# ZeroRedundancyOptimizer gives one rank whole.
PLAN = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
    {"layers": [0, 2], "parallelism": "data", "degree": 4, "devices": [0, 1, 2, 3], "zero": 1},
    {"layers": [2, 10], "parallelism": "none", "degree": 1, "devices": [4]}]})


def _numel() -> int:
    model = get_model("gpt-tiny")
    return sum(p.numel() for i in range(0, 2) for p in model.build_layer(i).parameters())


def _static(precision: str, partition: str) -> list[dict[str, int]]:
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x5"), backend="sim", precision=precision,
                    grad_accumulation="fp32-buffer", adamw="fused", zero1=partition)
    return [simulate_stage(cfg, 0, rank=r).breakdowns[-1] for r in range(4)]


@pytest.mark.parametrize(("precision", "published"), [("bf16", MEGATRON_BF16), ("fp32", MEGATRON_FP32)])
def test_each_flat_share_holds_megatrons_bytes_per_parameter(precision, published):
    """Each of the 4 ranks keeps the optimizer state of a quarter of the stage's elements (the last rank the rest):
    with Megatron-LM's fp32 gradient buffers, parameters + gradients + optimizer state are its published bytes per
    parameter, 6 + 12/d in bf16 and 8 + 8/d in fp32, on every rank. Whole tensors leave the ranks uneven here."""
    n = _numel()
    replicated, sharded = published
    flat = _static(precision, "flat")
    shares = [sum(b - a for _, a, b in pieces) for pieces in flat_ranges([n], 4)]
    for parts, share in zip(flat, shares, strict=True):
        assert parts["parameters"] + parts["gradients"] == replicated * n
        assert parts["optimizer"] == sharded * share
    whole = [parts["optimizer"] for parts in _static(precision, "tensors")]
    assert max(whole) - min(whole) > max(p["optimizer"] for p in flat) - min(p["optimizer"] for p in flat)


def test_the_partition_travels_to_the_workers_and_is_written_where_set():
    """A real run hands its workers the configuration as JSON (runtime/torchrun.py): the partition must survive it.
    Its choices are checked with the other closed settings (tests/runtime/test_config.py)."""
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x5"), zero1="flat")
    assert config_from_json(config_to_json(cfg)) == cfg and cfg.describe()["zero1"] == "flat"
    assert "zero1" not in RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x5")).describe()


def test_a_piece_is_stepped_in_place_through_a_view():
    """fp32: a rank's pieces are views of its parameters, so AdamW's in-place update is the parameter's."""
    layer = nn.Linear(3, 2)
    flat = layer.weight.detach().view(-1)
    piece = flat[2:5]
    piece.add_(1.0)
    assert torch.equal(layer.weight.detach().view(-1)[2:5], piece)


# ---------------------------------------------------------------------------------------------- real runs
@pytest.mark.distributed
def test_flat_zero1_trains_as_one_device_on_a_data_and_a_data_x_tensor_stage():
    """fp32: each rank steps its range with AdamW's per-element update and broadcasts it, so the run trains as one
    device does (the helper's 1e-5 tolerances), through ZeRO-1 replicas and data x tensor replicas."""
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
        {"layers": [0, 4], "parallelism": "data", "degree": 2, "devices": [0, 1], "zero": 1},
        {"layers": [4, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [2, 3, 4, 5],
         "zero": 1}]})
    assert_same_training("gpt-tiny", plan, "1x6", zero1="flat")


@pytest.mark.distributed
def test_flat_zero1_in_bf16_with_fp32_buffers_trains_like_one_bf16_device():
    """bf16, Megatron-LM's way (fp32 gradient buffers, the flat partition, fused AdamW): the losses within the bound
    of test_precision's bf16 plan test (u/4 relative) of one bf16 device accumulating in bf16."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "data", [2, 3])])
    plan = Plan.from_dict({**plan.to_dict(), "stages": [{**s, "zero": 1} for s in plan.to_dict()["stages"]]})
    got = _run(plan, "1x4", precision="bf16", grad_accumulation="fp32-buffer", zero1="flat", adamw="fused")
    ref = _run(single_device(plan), "1x1", precision="bf16")
    assert len(got.losses) == 3
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= BF16_UNIT_ROUNDOFF / 4 * abs(b), (got.losses, ref.losses)
