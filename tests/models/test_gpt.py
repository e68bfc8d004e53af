"""GPT zoo: layers, deterministic builds, a training step, paper sizes on the meta device, tensor parallelism."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
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

from hybridplan.models import get_model
from hybridplan.models.gpt import GPT_CONFIGS, GPTConfig


def _expected_parameters(c: GPTConfig) -> int:
    # Per block: q, k, v, o (4h^2 + 4h), fc1 and fc2 (8h^2 + 5h), two LayerNorms (4h); embeddings (vocab +
    # positions) x h; head: LayerNorm (2h) and an untied vocab x h projection.
    h = c.hidden_size
    return c.num_blocks * (12 * h * h + 13 * h) + (2 * c.vocab_size + c.seq_len) * h + 2 * h


def test_layers_and_names() -> None:
    model = get_model("gpt-tiny")
    blocks = GPT_CONFIGS["gpt-tiny"].num_blocks
    assert model.num_layers == blocks + 2
    names = [model.layer_name(i) for i in range(model.num_layers)]
    assert names == ["embed", *(f"block{i}" for i in range(blocks)), "head"]
    assert "gpt-tiny" in model.describe() and model.config()["family"] == "gpt"


def test_builds_are_deterministic() -> None:
    assert_builds_deterministic(get_model("gpt-tiny"), layers=[0, 1, get_model("gpt-tiny").num_layers - 1])


def test_make_batch_is_deterministic_and_shifted() -> None:
    model = get_model("gpt-tiny")
    x, y = assert_make_batch_deterministic(model)
    assert x.shape == y.shape == (3, GPT_CONFIGS["gpt-tiny"].seq_len) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-token targets


def test_training_step_runs() -> None:
    out, loss = run_chain(get_model("gpt-tiny"), 2)
    c = GPT_CONFIGS["gpt-tiny"]
    assert out.shape == (2, c.seq_len, c.vocab_size)
    assert abs(loss.item() - torch.log(torch.tensor(float(c.vocab_size)))) < 1.0  # near uniform at init


def test_samples_are_independent() -> None:
    assert_samples_independent(get_model("gpt-tiny"))


def test_runs_under_fake_tensors() -> None:
    c = GPT_CONFIGS["gpt-tiny"]
    assert run_chain_fake(get_model("gpt-tiny"), 2) == (2, c.seq_len, c.vocab_size)


# GPT-3 paper (Table 2.1) sizes count a tied embedding; the untied head here adds vocab x hidden
# (51200 x 768 = +31% at 125m, +8% at 1.3b, +3% at 6.7b), hence the asymmetric range.
@pytest.mark.parametrize(
    "name, nominal",
    [("gpt3-125m", 125e6), ("gpt3-350m", 350e6), ("gpt3-760m", 760e6), ("gpt3-1.3b", 1.3e9), ("gpt3-2.6b", 2.6e9),
     ("gpt3-6.7b", 6.7e9)],
)
def test_paper_sizes_on_meta(name: str, nominal: float) -> None:
    model = get_model(name)
    count = meta_parameter_count(model)
    assert count == _expected_parameters(GPT_CONFIGS[name])
    assert 0.95 * nominal <= count <= 1.35 * nominal, f"{name}: {count:,} parameters"


def test_tensor_parallel_problems() -> None:
    model = get_model("gpt-tiny")
    assert model.tensor_parallel_problem(1, 2) is None
    problem = model.tensor_parallel_problem(1, 3)
    assert problem is not None and "num_heads 4" in problem and "degree 3" in problem
    problem = model.tensor_parallel_problem(0, 3)
    assert problem is not None and "vocabulary size 128" in problem


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_tensor_parallel_matches_unsplit(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    model = get_model("gpt-tiny")
    layers = tensor_parallel_layers(model, degree)
    assert layers == list(range(model.num_layers))
    results = gloo_pool(WORLD).run(check_tensor_parallel, [(model, layers)], degree)
    assert_tensor_parallel_matches(results)
    assert results[0]["gpt-tiny block0 sharded"] == 10  # q, k, v (weight, bias), o.weight, fc1 (2), fc2.weight
