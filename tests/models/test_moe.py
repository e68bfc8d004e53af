"""GShard MoE zoo: routing against a loop reference, layers, determinism, group handling, sizes, tensor parallelism."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from gloo import (
    WORLD,
    GlooPool,
    assert_builds_deterministic,
    assert_make_batch_deterministic,
    assert_samples_independent,
    assert_tensor_parallel_matches,
    check_tensor_parallel,
    meta_parameter_count,
    run_chain,
    run_chain_fake,
    tensor_parallel_layers,
)

from hybridplan.errors import ModelError
from hybridplan.models import get_model
from hybridplan.models.moe import MOE_CONFIGS, MoE, MoEBlock, MoEConfig, MoEFeedForward, top2_gating

TINY = MOE_CONFIGS["moe-tiny"]


def _reference_routing(gates: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GShard top-2 routing written as loops: first choices fill the buffers in token order, then second choices."""
    g, s, e = gates.shape
    combine = torch.zeros(g, s, e, capacity, dtype=gates.dtype)
    for group in range(g):
        fill = [0] * e
        choices = []
        for rank in range(2):
            for token in range(s):
                order = gates[group, token].argsort(descending=True)
                expert = int(order[rank])
                slot = fill[expert]
                fill[expert] += 1
                choices.append((token, expert, slot if slot < capacity else None))
        for token in range(s):
            kept = [(x, c) for t, x, c in choices if t == token and c is not None]
            total = sum(float(gates[group, token, x]) for x, _ in kept)
            for x, c in kept:
                combine[group, token, x, c] = gates[group, token, x] / total
    return combine, (combine > 0).to(gates.dtype)


@pytest.mark.parametrize("experts, capacity", [(4, 3), (4, 8), (3, 2)])
def test_top2_gating_matches_loop_reference(experts: int, capacity: int) -> None:
    gates = F.softmax(torch.randn(2, 8, experts, generator=torch.Generator().manual_seed(experts + capacity)), -1)
    combine, dispatch = top2_gating(gates, capacity)
    ref_combine, ref_dispatch = _reference_routing(gates, capacity)
    torch.testing.assert_close(combine, ref_combine)
    assert torch.equal(dispatch, ref_dispatch)
    assert dispatch.sum(dim=(1, 3)).le(capacity).all()  # no expert over capacity in any group
    assert dispatch.sum(dim=(2, 3)).le(2).all()  # at most two slots per token
    assert dispatch.sum(dim=1).le(1).all()  # a slot holds at most one token


def test_tokens_over_capacity_are_dropped() -> None:
    # All 4 tokens prefer expert 0, then expert 1; capacity 2: tokens 2 and 3 get no slot at all.
    gates = torch.tensor([[[0.7, 0.3]] * 4])
    combine, dispatch = top2_gating(gates, 2)
    assert dispatch[0, :2].sum() == 4 and dispatch[0, 2:].sum() == 0
    torch.testing.assert_close(combine[0, 0].sum(), torch.tensor(1.0))


def test_moe_feed_forward_matches_per_token_experts() -> None:
    torch.manual_seed(0)
    ffn = MoEFeedForward(TINY)
    x = torch.randn(2, TINY.seq_len, TINY.hidden_size)
    out = ffn(x)
    tokens = x.reshape(-1, TINY.expert_group_size, TINY.hidden_size)
    combine, _ = top2_gating(F.softmax(ffn.gate(tokens), -1), TINY.capacity)
    weights = combine.sum(-1)  # [G, S, E]: each token's gate weight per expert (0 if not routed)
    expected = torch.zeros_like(tokens)
    for e in range(TINY.num_experts):
        h = F.relu(tokens @ ffn.experts.wi[e]) @ ffn.experts.wo[e]
        expected += weights[..., e : e + 1] * h
    torch.testing.assert_close(out, expected.reshape(x.shape), rtol=1e-5, atol=1e-5)


def test_layers_alternate_moe_and_dense() -> None:
    model = get_model("moe-tiny")
    assert model.num_layers == TINY.num_blocks + 2 == 6
    assert [model.layer_name(i) for i in range(6)] == ["embed", "block0", "block1", "block2", "block3", "head"]
    kinds = [type(model.build_layer(i)).__name__ for i in range(1, 5)]
    assert kinds == ["MoEBlock", "DenseBlock", "MoEBlock", "DenseBlock"]  # Alpa: even blocks are MoE
    assert model.config()["capacity"] == math.ceil(2 * 16 / 4) == 8


def test_builds_are_deterministic() -> None:
    assert_builds_deterministic(get_model("moe-tiny"))


def test_make_batch_is_deterministic() -> None:
    x, y = assert_make_batch_deterministic(get_model("moe-tiny"))
    assert x.shape == (3, TINY.seq_len) and torch.equal(x[:, 1:], y[:, :-1])


def test_training_step_runs() -> None:
    out, _ = run_chain(get_model("moe-tiny"), 2)
    assert out.shape == (2, TINY.seq_len, TINY.vocab_size)


def test_samples_are_independent() -> None:
    assert_samples_independent(get_model("moe-tiny"), num_samples=4, split=1)


def test_groups_spanning_samples() -> None:
    # Groups of 32 tokens over samples of 16: two samples per group, like the paper sizes (2048 / 1024).
    model = MoE("moe-span", replace(TINY, expert_group_size=32))
    assert model.samples_per_group == model.sample_granularity == 2
    assert_samples_independent(model, num_samples=4, split=2)  # micro-batches of whole groups: same math
    torch.manual_seed(0)
    block = MoEBlock(model.cfg)
    with pytest.raises(ModelError, match="48 tokens, not a multiple of expert_group_size 32"):
        block(torch.randn(3, TINY.seq_len, TINY.hidden_size))


def test_invalid_configs() -> None:
    with pytest.raises(ModelError, match="num_blocks 3"):
        MoE("odd", replace(TINY, num_blocks=3))
    with pytest.raises(ModelError, match="1 experts"):
        MoE("one", replace(TINY, num_experts=1))
    with pytest.raises(ModelError, match="hidden_size 32 is not divisible by num_heads 5"):
        MoE("heads", replace(TINY, num_heads=5))
    with pytest.raises(ModelError, match="capacity 0"):
        MoE("small", replace(TINY, capacity_factor=0.0))


def test_runs_under_fake_tensors() -> None:
    assert run_chain_fake(get_model("moe-tiny"), 2) == (2, TINY.seq_len, TINY.vocab_size)


def _expected_parameters(c: MoEConfig) -> int:
    h, f = c.hidden_size, c.mlp_ratio * c.hidden_size
    attention = 4 * h * h + 4 * h + 4 * h  # q, k, v, o and two LayerNorms
    dense = attention + 2 * h * f + f + h
    moe = attention + h * c.num_experts + 2 * c.num_experts * h * f  # gate, wi, wo
    half = c.num_blocks // 2
    return half * (dense + moe) + (2 * c.vocab_size + c.seq_len) * h + 2 * h


# Alpa's names count its MoE with a tied embedding; the untied head and the position table add
# 25M-50M, so the counts land 2-8% above the names.
@pytest.mark.parametrize(
    "name, nominal",
    [("moe-380m", 380e6), ("moe-690m", 690e6), ("moe-1.3b", 1.3e9), ("moe-2.4b", 2.4e9), ("moe-7.1b", 7.1e9),
     ("moe-10b", 10e9)],
)
def test_paper_sizes_on_meta(name: str, nominal: float) -> None:
    model = get_model(name)
    count = meta_parameter_count(model)
    assert count == _expected_parameters(MOE_CONFIGS[name])
    assert 0.97 * nominal <= count <= 1.10 * nominal, f"{name}: {count:,} parameters"
    assert model.samples_per_group == 2 and MOE_CONFIGS[name].capacity == 2 * 2048 // MOE_CONFIGS[name].num_experts


def test_paper_size_runs_under_fake_tensors() -> None:
    # moe-380m: one routing group spans both samples; [G, S, E, C] = [1, 2048, 8, 512].
    assert run_chain_fake(get_model("moe-380m"), 2) == (2, 1024, 32000)


def test_tensor_parallel_problems() -> None:
    model = get_model("moe-tiny")
    assert model.tensor_parallel_problem(1, 4) is None
    problem = model.tensor_parallel_problem(1, 3)
    assert problem is not None and "num_heads 4 is not divisible by degree 3" in problem
    problem = model.tensor_parallel_problem(1, 8)
    assert problem is not None and "degree 8" in problem
    wide = MoE("wide", replace(TINY, num_heads=8, hidden_size=40))  # F = 320 experts' width, 8 heads
    assert wide.tensor_parallel_problem(1, 8) is None
    assert "vocabulary size 128 is not divisible by degree 3" in wide.tensor_parallel_problem(0, 3)


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_tensor_parallel_matches_unsplit(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    model = get_model("moe-tiny")
    layers = tensor_parallel_layers(model, degree)
    assert layers == list(range(model.num_layers))
    results = gloo_pool(WORLD).run(check_tensor_parallel, [(model, layers)], degree)
    assert_tensor_parallel_matches(results)
    # MoE block: attention (q, k, v weight and bias, o weight) and the two expert tensors; the gate stays whole.
    assert results[0]["moe-tiny block0 sharded"] == 9
