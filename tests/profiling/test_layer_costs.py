"""Per-layer costs on fake tensors, the baselines' inputs built from them, and the FLOP time profile."""

from __future__ import annotations

import pytest

from hybridplan.plan import Plan

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import UsageError
from hybridplan.profiling.layer_costs import baseline_layer_costs, flop_time_profile, measure_layer_costs
from hybridplan.models.zoo import get_model
from hybridplan.predict.time_model import predict_iteration_time


@pytest.fixture(scope="module")
def gpt():
    model = get_model("gpt-tiny")  # hidden 64, seq 16, vocab 128, 8 blocks
    return model, measure_layer_costs(model)


def test_counts_match_the_model(gpt):
    model, costs = gpt
    assert sum(c.parameters for c in costs) == model.parameter_count()
    assert all(c.parameter_bytes == 4 * c.parameters for c in costs)
    assert costs[0].forward_flops_per_sample == 0  # an embedding lookup does no matmul
    # a block: qkv (3 h^2), projection (h^2), MLP (8 h^2) matmuls on 16 tokens, 2 FLOPs per multiply-add,
    # plus attention scores and values (2 x 16 x 16 x h)
    h, s = 64, 16
    assert costs[1].forward_flops_per_sample == 2 * s * 12 * h * h + 2 * 2 * s * s * h
    assert all(c.output_bytes_per_sample == s * h * 4 for c in costs[:-1])
    assert all(c.latent_bytes_per_sample >= c.output_bytes_per_sample for c in costs)


def test_low_precision_halves_the_bytes(gpt):
    model, costs = gpt
    half = measure_layer_costs(model, precision="bf16")
    assert [c.parameter_bytes for c in half] == [c.parameter_bytes // 2 for c in costs]
    assert half[1].output_bytes_per_sample == costs[1].output_bytes_per_sample // 2


def test_baseline_costs(gpt):
    _, costs = gpt
    assert baseline_layer_costs(costs, "equal", microbatch_size=4) is None
    assert baseline_layer_costs(costs, "deepspeed-parameters", microbatch_size=4) == [c.parameters for c in costs]
    size = baseline_layer_costs(costs, "torchgpipe-size", microbatch_size=4)
    assert size[2] == costs[2].latent_bytes_per_sample * 4 + 2 * costs[2].parameter_bytes
    with pytest.raises(UsageError):
        baseline_layer_costs(costs, "alpa", microbatch_size=4)


def test_flop_time_profile_prices_plans(gpt):
    model, costs = gpt
    profile = flop_time_profile(model, costs, precision="fp32", device_type="cpu", peak_flops=1e9, efficiency=1.0)
    assert "not a measurement" in profile.source
    fwd, bwd = profile.layer_times("cpu", 1, 2)
    assert fwd[1] == pytest.approx(2 * costs[1].forward_flops_per_sample / 1e9) and bwd[1] == pytest.approx(2 * fwd[1])
    fwd2, _ = profile.layer_times("cpu", 2, 2)
    assert fwd2[1] == pytest.approx(fwd[1] / 2)
    layout = Plan.uniform(boundaries=[0, 5, 10], data_degree=1, tensor_degree=1, micro_batch_size=2, global_batch_size=8)
    assert predict_iteration_time(layout, profile, Cluster.uniform(1, 2)).total_s > 0
