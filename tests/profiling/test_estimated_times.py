"""Estimated layer times (profiling/estimated_times.py): FLOPs and bytes counted on fake tensors against formulas
written here, roofline times, identical layers counted once, the counts kept in the memo, and refusals where no
peak rate is known."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster
from hybridplan.profiling.estimated_times import (
    PassCounts,
    PeakRates,
    count_layer,
    count_pass,
    estimated_time_profile,
    peak_rates,
)
from hybridplan.runtime.split_layers import split_layers
from hybridplan.profiling.stage_memo import StageMemo

H100_BF16 = 989.5e12  # NVIDIA H100 SXM datasheet: 1,979 TFLOP/s bf16 with sparsity, dense half (plan/gpus.py)
H100_FP32 = 67e12
H100_BANDWIDTH = 3.35e12


def test_a_linear_forward_is_2bsh2_flops_and_its_backward_twice_that() -> None:
    b, s, h = 3, 5, 8
    with FakeTensorMode():
        linear = nn.Linear(h, h, bias=False)
        x = torch.empty(b, s, h, requires_grad=True)
        y, forward = count_pass(lambda: linear(x))
        _, backward = count_pass(lambda: y.backward(torch.empty_like(y)))
    assert forward.total_flops == 2 * b * s * h * h
    assert backward.total_flops == 2 * forward.total_flops  # the gradient of the input and of the weight
    # forward: one matrix product reading x and the weight and writing y, fp32
    assert forward.total_bytes == (b * s * h + h * h + b * s * h) * 4
    assert forward.collectives == backward.collectives == 0


def test_views_move_no_bytes_and_an_embedding_reads_only_its_rows() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 6)
        _, views = count_pass(lambda: x.t().reshape(6, 4).unsqueeze(0))
        table = nn.Embedding(1000, 16)
        ids = torch.zeros(2, 3, dtype=torch.long)
        _, looked_up = count_pass(lambda: table(ids))
    assert views.total_bytes == 0
    rows = 2 * 3 * 16 * 4
    assert looked_up.total_bytes == rows + rows + 2 * 3 * 8  # rows read, output written, the ids (not the table)


def _llama_tiny_decoder_flops(b: int) -> tuple[int, int]:
    """hf:llama-tiny's decoder layer (models/hf_config.py: hidden 32, 4 heads of 8, 2 key-value heads, MLP 64,
    sequence 16): forward and backward FLOPs, 2 per multiply-add, attention as torch's counter counts it."""
    h, heads, kv, d, ffn, s = 32, 4, 2, 8, 64, 16
    per_token = 2 * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * ffn)  # q, k and v, o, gate/up/down
    matmuls = b * s * per_token
    attention = 2 * (2 * b * heads * s * s * d)  # scores and weighted values
    attention_backward = 5 * (2 * b * heads * s * s * d)  # four gradient products and the scores again
    return matmuls + attention, 2 * matmuls + attention_backward


@pytest.mark.parametrize("b", [1, 4])
def test_a_decoder_layer_counts_its_matrix_products_and_attention(b: int) -> None:
    model = get_model("hf:llama-tiny")
    [module] = [count_layer(model, 1, m, b, "fp32") for m in split_layers(model, "tensor", 1, [1]) if m is not None]
    forward, backward = _llama_tiny_decoder_flops(b)
    assert module.forward.total_flops == forward
    assert module.backward.total_flops == backward


def test_a_tensor_rank_computes_its_share_and_issues_the_collectives() -> None:
    model = get_model("hf:llama-tiny")
    whole = [count_layer(model, 1, m, 2, "fp32") for m in split_layers(model, "tensor", 1, [1]) if m is not None][0]
    half = [count_layer(model, 1, m, 2, "fp32") for m in split_layers(model, "tensor", 2, [1]) if m is not None][0]
    assert half.forward.total_flops == whole.forward.total_flops / 2  # every product and the heads split in two
    assert half.backward.total_flops == whole.backward.total_flops / 2
    # Megatron's split (models/hf.py): row-parallel o and down all-reduce forward; the column-parallel q, k, v,
    # gate and up all-reduce their input's gradient backward
    assert (half.forward.collectives, half.backward.collectives) == (2, 5)
    assert (whole.forward.collectives, whole.backward.collectives) == (0, 0)


def test_an_operator_takes_the_longer_of_its_compute_and_its_memory_time() -> None:
    rates = PeakRates(gpu="h100-sxm", math="bf16", flops=H100_BF16, memory_bandwidth=H100_BANDWIDTH)
    compute_bound = PassCounts(flops=(H100_BF16 * 1e-3,), bytes=(1e6,))  # 1 ms of FLOPs, 0.3 us of bytes
    memory_bound = PassCounts(flops=(1e6,), bytes=(H100_BANDWIDTH * 2e-3,))  # 2 ms of bytes
    assert rates.seconds(compute_bound) == pytest.approx(1e-3, rel=1e-12)
    assert rates.seconds(memory_bound) == pytest.approx(2e-3, rel=1e-12)
    both = PassCounts(flops=compute_bound.flops + memory_bound.flops, bytes=compute_bound.bytes + memory_bound.bytes)
    assert rates.seconds(both) == pytest.approx(3e-3, rel=1e-12)  # one kernel after the other


def test_peak_rates_come_from_the_gpu_catalogue_at_the_training_precision() -> None:
    cluster = Cluster.parse("1x2", gpu="h100-sxm")
    assert (peak_rates(cluster, "bf16").flops, peak_rates(cluster, "bf16").memory_bandwidth) == (H100_BF16, H100_BANDWIDTH)
    assert peak_rates(cluster, "fp32").flops == H100_FP32  # fp32 matrix products on the CUDA cores (no TF32)
    assert peak_rates(cluster, "fp32").efficiency == 1.0


@pytest.mark.parametrize("cluster, wanted", [
    (Cluster.parse("1x2"), "CPU devices"),
    (Cluster.parse("1x2", device_type="cuda"), "no named GPU"),
    (Cluster.parse("1x2", gpu="a10g"), "no published"),
])
def test_no_peak_rate_no_estimate(cluster: Cluster, wanted: str) -> None:
    with pytest.raises(UsageError, match=wanted) as e:
        estimated_time_profile(get_model("gpt-tiny"), cluster, precision="fp32", micro_batch_sizes=[1])
    assert e.value.fix is not None and "--time-profile" in e.value.fix


def test_the_profile_times_every_layer_at_its_counted_roofline(tmp_path: Path) -> None:
    model = get_model("hf:llama-tiny")
    cluster = Cluster.parse("1x2", gpu="h100-sxm")
    estimate = estimated_time_profile(model, cluster, precision="bf16", micro_batch_sizes=[2, 4],
                                      memo=StageMemo(tmp_path))
    profile = estimate.profile
    assert profile.device_types == ("cuda",) and profile.tensor_degrees("cuda") == (1, 2)
    assert not profile.tensor_comm_in_times and "ESTIMATED" in profile.source
    rates = peak_rates(cluster, "bf16")
    for b in (2, 4):
        forward, backward = profile.layer_times("cuda", 1, b)
        for index in range(model.num_layers):
            [counts] = [count_layer(model, index, m, b, "bf16") for m in split_layers(model, "tensor", 1, [index])
                        if m is not None]
            assert forward[index] == pytest.approx(rates.seconds(counts.forward), rel=1e-12)
            assert backward[index] == pytest.approx(rates.seconds(counts.backward), rel=1e-12)
            assert forward[index] >= counts.forward.total_flops / H100_BF16  # never faster than the peak
    forward, _ = profile.layer_times("cuda", 1, 4)
    assert forward[1] == forward[2]  # the two decoder layers
    assert profile.layers[1].tensor_parallel_allreduces == (2, 5)
    assert profile.timings[0].optimizer_s_per_byte is not None and profile.timings[0].optimizer_s_per_byte > 0


def test_identical_layers_are_counted_once_and_kept_in_the_memo(tmp_path: Path) -> None:
    model = get_model("gpt-tiny")  # embed, 8 identical blocks, head
    cluster = Cluster.parse("1x2", gpu="a100-80gb")
    sizes = [1, 2, 4]
    first = estimated_time_profile(model, cluster, precision="fp32", micro_batch_sizes=sizes, memo=StageMemo(tmp_path))
    splits_in_two = sum(model.tensor_parallel_problem(i, 2) is None for i in (0, 1, 9))
    assert first.counted == 3 * len(sizes) + splits_in_two * len(sizes)  # three distinct layers, not ten
    again = estimated_time_profile(model, cluster, precision="fp32", micro_batch_sizes=sizes, memo=StageMemo(tmp_path))
    assert again.counted == 0 and again.reused >= first.counted
    assert again.profile.to_dict() == first.profile.to_dict()
    # the counts do not depend on the GPU: another one re-uses them, at its own rates
    h100 = estimated_time_profile(model, Cluster.parse("1x2", gpu="h100-sxm"), precision="fp32",
                                  micro_batch_sizes=sizes, memo=StageMemo(tmp_path))
    assert h100.counted == 0 and h100.profile.layer_times("cuda", 1, 4)[0][5] < first.profile.layer_times("cuda", 1, 4)[0][5]
    # another precision is other work
    bf16 = estimated_time_profile(model, cluster, precision="bf16", micro_batch_sizes=[1], memo=StageMemo(tmp_path))
    assert bf16.counted > 0
