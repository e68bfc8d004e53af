"""HuggingFace models: the layered model computes what transformers' ``*ForCausalLM`` computes (loss and
gradients, in one process and trained by the runtime on real gloo processes, pipelined and
tensor-parallel), shipped configurations build at full size on the meta device, and bad names fail early."""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo import (
    WORLD,
    GlooPool,
    assert_builds_deterministic,
    assert_samples_independent,
    assert_tensor_parallel_matches,
    check_tensor_parallel,
    tensor_parallel_layers,
)

from hybridplan.errors import ModelError
from hybridplan.models.base import build_layers
from hybridplan.models.hf import HFModel
from hybridplan.models.hf_config import HF_CONFIGS, load_hf_config
from hybridplan.models.names import check_model_name
from hybridplan.models.zoo import get_model

TINY = ["hf:llama-tiny", "hf:mistral-tiny", "hf:qwen2-tiny", "hf:gpt2-tiny", "hf:mixtral-tiny"]


# ---------------------------------------------------------------------------------------------- the HF reference
def reference_model(name: str) -> torch.nn.Module:
    """transformers' own ``*ForCausalLM`` of the same configuration (eager experts, SDPA attention), dropout
    off as in hybridplan (GPT-2's config has 0.1)."""
    import transformers

    shipped = HF_CONFIGS[name.removeprefix("hf:")]
    config = transformers.AutoConfig.for_model(**shipped, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    config._attn_implementation = "sdpa"
    return transformers.AutoModelForCausalLM.from_config(config)


def hf_key(model: HFModel, key: str) -> str:
    """The reference's parameter name of our ``"<layer>.<param>"`` key (fused expert names handled by the caller)."""
    layer, _, name = key.partition(".")
    index, last = int(layer), model.num_layers - 1
    gpt2 = model.model_type == "gpt2"
    if index == 0:
        return f"transformer.{name}" if gpt2 else f"model.{name}"
    if index == last:
        if name.startswith("lm_head"):
            return name
        return name.replace("norm.", "transformer.ln_f." if gpt2 else "model.norm.")
    return name.replace("layer.", f"transformer.h.{index - 1}." if gpt2 else f"model.layers.{index - 1}.")


def to_reference(model: HFModel, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``"<layer>.<param>"`` tensors under the reference's names and layouts: Mixtral's ``gate_up_proj`` is
    gate then up; GPT-2's ``Conv1D`` weights are our Linear weights transposed, ``c_attn`` is q, k, v side by side."""
    out: dict[str, torch.Tensor] = {}
    for key, t in ours.items():
        if key.endswith(("experts.up_proj", "c_attn.k.weight", "c_attn.k.bias", "c_attn.v.weight", "c_attn.v.bias")):
            continue
        if key.endswith("experts.gate_proj"):
            up = ours[key.replace("gate_proj", "up_proj")]
            out[hf_key(model, key).replace("gate_proj", "gate_up_proj")] = torch.cat([t, up], dim=1)
        elif ".c_attn.q." in key:
            parts = [ours[key.replace(".q.", f".{p}.")] for p in "qkv"]
            fused = torch.cat([p.t() for p in parts], dim=1) if key.endswith("weight") else torch.cat(parts)
            out[hf_key(model, key).replace(".q.", ".")] = fused
        elif model.model_type == "gpt2" and re.search(r"\.(c_proj|c_fc)\.weight$", key):
            out[hf_key(model, key)] = t.t()
        else:
            out[hf_key(model, key)] = t
    return out


def our_state(layers: list[torch.nn.Module], attr: str = "data") -> dict[str, torch.Tensor]:
    return {f"{i}.{n}": getattr(p, attr) for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


def reference_training(name: str, batch: int, iterations: int, seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train transformers' model as the runtime trains ours (same initial weights, batches, AdamW):
    losses per iteration and the last gradients, under the reference's names."""
    from hybridplan.runtime.executor import data_seed

    model = get_model(name)
    assert isinstance(model, HFModel)
    ref = reference_model(name)
    ref.load_state_dict(to_reference(model, our_state(build_layers(model, 0, model.num_layers, seed))), strict=True)
    optimizer = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for it in range(iterations):
        inputs, targets = model.make_batch(batch, torch.Generator().manual_seed(data_seed(seed, it)))
        optimizer.zero_grad()
        loss = ref(input_ids=inputs, labels=inputs, shift_labels=targets).loss  # transformers' causal-LM loss
        loss.backward()
        losses.append(loss.item())
        if it < iterations - 1:
            optimizer.step()
    return losses, {n: p.grad.detach().clone() for n, p in ref.named_parameters()}


@pytest.mark.parametrize("name", TINY)
def test_loss_and_gradients_equal_transformers(name: str) -> None:
    model = get_model(name)
    assert isinstance(model, HFModel)
    layers = build_layers(model, 0, model.num_layers, seed=3)
    ref = reference_model(name)
    ref.load_state_dict(to_reference(model, our_state(layers)), strict=True)
    inputs, targets = model.make_batch(4, torch.Generator().manual_seed(5))
    x = inputs
    for layer in layers:
        x = layer(x)
    loss = model.loss(x, targets)
    loss.backward()
    ref_loss = ref(input_ids=inputs, labels=inputs, shift_labels=targets).loss  # transformers' causal-LM loss
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    grads = to_reference(model, our_state(layers, "grad"))
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    assert grads.keys() == ref_grads.keys()
    scale = max(float(g.norm()) for g in ref_grads.values())
    for key, g in ref_grads.items():
        assert float((grads[key] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-7 * scale, key


@pytest.mark.parametrize("name", ["hf:llama-tiny", "hf:mixtral-tiny"])
def test_layers_are_deterministic_and_samples_independent(name: str) -> None:
    model = get_model(name)
    assert_builds_deterministic(model)
    assert_samples_independent(model)


def test_sliding_window_mask_matters() -> None:
    """mistral-tiny's window (8) is shorter than its sequence (16): without the mask the loss would differ,
    so the reference equality above checks the mask."""
    model = get_model("hf:mistral-tiny")
    layers = build_layers(model, 0, model.num_layers, seed=0)
    inputs, _ = model.make_batch(2, torch.Generator().manual_seed(1))
    x = layers[0](inputs)
    with_window = layers[1](x)
    layers[1].sliding_window = None
    assert not torch.allclose(with_window, layers[1](x))


# ---------------------------------------------------------------------------------------------- tensor parallelism
def test_tensor_parallel_problems() -> None:
    llama = get_model("hf:llama-tiny")  # 4 heads, 2 key/value heads, vocabulary 128
    assert llama.tensor_parallel_problem(1, 2) is None
    assert "key/value heads 2 is not divisible by degree 4" in llama.tensor_parallel_problem(1, 4)
    assert "attention heads 4 is not divisible by degree 3" in llama.tensor_parallel_problem(1, 3)
    gpt2 = get_model("hf:gpt2-tiny")
    assert all(gpt2.tensor_parallel_problem(i, 2) is None for i in range(4))
    assert "attention heads 4 is not divisible by degree 8" in gpt2.tensor_parallel_problem(1, 8)
    assert get_model("hf:gpt2").tensor_parallel_problem(0, 2) == "embed_tokens: vocabulary size 50257 is not divisible by degree 2".replace("embed_tokens", "wte")


@pytest.mark.distributed
def test_tensor_parallel_layers_match_unsplit(gloo_pool: Callable[[int], GlooPool]) -> None:
    cases = []
    for name in ("hf:llama-tiny", "hf:qwen2-tiny", "hf:mixtral-tiny", "hf:gpt2-tiny"):
        model = get_model(name)
        layers = tensor_parallel_layers(model, 2)
        assert layers == list(range(model.num_layers))
        cases.append((model, layers))
    results = gloo_pool(WORLD).run(check_tensor_parallel, cases, 2)
    # transformers' RMSNorm and rotary embedding compute in float32 whatever the layer's dtype, so the
    # float64 check sees float32 rounding (~1e-7) where a wrong split gives errors near 1.
    assert_tensor_parallel_matches(results, tolerance=1e-5)
    # q, k, v (Qwen2: and their biases), o; gate, up, down (Mixtral: the three expert tensors)
    assert results[0]["hf:llama-tiny layer0 sharded"] == 7
    assert results[0]["hf:qwen2-tiny layer0 sharded"] == 10
    assert results[0]["hf:mixtral-tiny layer0 sharded"] == 7
    # q, k, v weights and biases, c_proj; c_fc weight and bias, c_proj (row-parallel biases stay whole)
    assert results[0]["hf:gpt2-tiny layer0 sharded"] == 10


# ---------------------------------------------------------------------------------------------- the runtime
@pytest.mark.distributed
@pytest.mark.parametrize("name, schedule", [("hf:llama-tiny", "1f1b"), ("hf:mixtral-tiny", "gpipe")])
def test_runtime_trains_as_transformers(name: str, schedule: str) -> None:
    """A tensor-parallel stage then a pipeline stage, on 3 gloo processes: the losses of 3 iterations and
    the last gradients equal transformers' model trained in one process; simulated devices (fake tensors)
    measure the same memory to the byte (Mixtral too: its experts' shapes do not depend on the routing)."""
    from runtime.util import make_plan, run_with_state

    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    plan = make_plan(schedule, 8, 4, [(0, 2, "tensor", [0, 1]), (2, 4, "none", [2])])
    result, _, grads = run_with_state(name, plan, "1x3")
    ref_losses, ref_grads = reference_training(name, 8, 3)
    for a, b in zip(result.losses, ref_losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (result.losses, ref_losses)
    model = get_model(name)
    assert isinstance(model, HFModel)
    got = to_reference(model, grads)
    assert got.keys() == ref_grads.keys()
    total = torch.cat([g.flatten() for g in ref_grads.values()]).norm()
    diff = torch.cat([(got[k] - g).flatten() for k, g in ref_grads.items()]).norm()
    assert diff <= 1e-5 * total
    sim = launch(RunConfig(model=name, plan=plan, cluster=Cluster.parse("1x3"), backend="sim"))
    assert sim.ok, sim.reason
    for s, r in zip(sim.devices, result.devices, strict=True):
        assert (s.iteration_peaks, s.peak_breakdown, s.timeline) == (r.iteration_peaks, r.peak_breakdown, r.timeline)


# ---------------------------------------------------------------------------------------------- shipped sizes
# Published parameter counts (model cards; GPT-2's is the tied 124,439,808 plus the untied head's
# 50257 x 768, see the [Note] in hybridplan/models/hf.py; Llama/Mistral/Qwen2/Mixtral heads are untied).
PUBLISHED = {
    "llama3-8b": 8_030_261_248,
    "llama2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "qwen2-7b": 7_615_616_512,
    "gpt2": 124_439_808 + 50257 * 768,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_shipped_configs_build_at_full_size_on_meta(name: str) -> None:
    model = get_model(f"hf:{name}")
    assert model.parameter_count() == PUBLISHED[name]


def test_big_stage_simulates_on_fake_tensors() -> None:
    """One stage of Llama-3-8B (embedding and two decoder layers, 2-way tensor-parallel) on a simulated device."""
    from runtime.util import make_plan

    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate_stage

    plan = make_plan("1f1b", 2, 2, [(0, 3, "tensor", [0, 1]), (3, 34, "none", [2])])
    cfg = RunConfig(model="hf:llama3-8b", plan=plan, cluster=Cluster.parse("1x3"), backend="sim", iterations=2)
    report = simulate_stage(cfg, stage_index=0)
    # This device's share, by hand: half the embedding rows; per decoder layer half of q (h x h), k and v
    # (h x 1024: 8 key/value heads of 128), o (h x h) and of the three MLP matrices (h x 14336), two whole
    # RMSNorm scales; fp32.
    h, v, f, kv = 4096, 128256, 14336, 8 * 128
    per_layer = (h * h + 2 * h * kv + h * h) // 2 + 3 * h * f // 2 + 2 * h
    weights = 4 * (v * h // 2 + 2 * per_layer)
    rotary = 2 * 2 * 64 * 4  # per layer inv_freq and original_inv_freq buffers: head_dim / 2 floats each
    breakdown = report.breakdowns[-1]
    assert breakdown["gradients"] == weights and breakdown["optimizer"] == 2 * weights  # AdamW's two moments
    assert breakdown["parameters"] == weights + rotary
    assert max(report.iteration_peaks) > 4 * weights


# ---------------------------------------------------------------------------------------------- names and errors
def write_config(tmp_path: Path, config: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def with_digits(key: str) -> str:
    """llama-tiny's config.json with ``key`` set to an integer of 5,000 digits (Python converts at most 4,300)."""
    return json.dumps(HF_CONFIGS["llama-tiny"])[:-1] + f', "{key}": ' + "7" * 5000 + "}"


def test_config_json_paths_build(tmp_path: Path) -> None:
    path = write_config(tmp_path, HF_CONFIGS["llama-tiny"])
    for spec in (f"hf:{tmp_path}", f"hf:{path}"):
        check_model_name(spec)
        model = get_model(spec)
        assert model.num_layers == 4 and model.config()["hf_config"] == HF_CONFIGS["llama-tiny"]
    # the runtime pickles a model object to its processes: the copy builds the same layers
    copy = pickle.loads(pickle.dumps(model))
    assert copy.config() == model.config()
    a, b = build_layers(model, 1, 2, seed=0)[0], build_layers(copy, 1, 2, seed=0)[0]
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: "hf:llama-tinyy", r"(?s)neither a shipped HuggingFace config nor an existing path.*hf:llama-tiny"),
        (lambda p: f"hf:{p}", r"has no config.json"),
        (lambda p: f"hf:{write_config(p, '{not json')}", r"is not readable JSON"),
        (lambda p: f"hf:{write_config(p, [1, 2])}", r"holds a JSON list, not an object"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'model_type': 'bert'})}",
         r"(?s)architecture 'bert' .* not supported.*\['llama', 'mistral', 'qwen2', 'mixtral', 'gpt2'\]"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'hidden_size': 0})}",
         r"hidden_size is 0, not a positive integer"),
        # issue 32: every size checked before transformers or torch sees it, bounds with their reasons
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'num_attention_heads': 5})}",
         r"hidden_size 32 is not divisible by num_attention_heads 5"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'num_key_value_heads': 3})}",
         r"num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'num_key_value_heads': 8})}",
         r"num_key_value_heads is 8, more than 4 \(the attention heads\)"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'hidden_size': 30, 'num_attention_heads': 2})}",
         r"each head has 15 channels .* an odd number"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'num_hidden_layers': 10**9})}",
         r"num_hidden_layers is 1,000,000,000, more than 16,384 \(128 times the deepest published"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'hidden_size': 10**12})}",
         r"hidden_size is 1,000,000,000,000, more than 2,097,152"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['llama-tiny'], 'max_position_embeddings': 0})}",
         r"max_position_embeddings is 0, not a positive integer"),
        (lambda p: f"hf:{write_config(p, {k: v for k, v in HF_CONFIGS['llama-tiny'].items() if k != 'vocab_size'})}",
         r"vocab_size is missing"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['mixtral-tiny'], 'num_local_experts': 0})}",
         r"num_local_experts is 0, not a positive integer"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['mixtral-tiny'], 'num_experts_per_tok': 5})}",
         r"num_experts_per_tok is 5, more than 4 \(the 4 experts"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['gpt2-tiny'], 'n_head': 5})}", r"n_embd 32 is not divisible by n_head 5"),
        (lambda p: f"hf:{write_config(p, {**HF_CONFIGS['mistral-tiny'], 'sliding_window': 0})}",
         r"sliding_window is 0, not a positive integer"),
        (lambda p: f"hf:{write_config(p, '[' * 200_000)}", r"is not readable JSON: it is nested deeper than"),
        (lambda p: "hf:llama-tiny,seq=0", r"the sequence length is 0, not a positive integer"),
        (lambda p: "hf:llama-tiny,seq=8k", r"the sequence length is '8k', not a whole number of tokens"),
        (lambda p: "hf:llama-tiny,seq=" + "9" * 5000, r"the sequence length is '9{20}', not a whole number"),
        (lambda p: "hf:llama-tiny,seq=17", r"a sequence of 17 tokens is longer than the model's 16 positions"),
        (lambda p: f"hf:{write_config(p, with_digits('hidden_size'))}",
         r"hidden_size is an integer of 5,000 digits, more than 2,097,152"),
        (lambda p: f"hf:{write_config(p, with_digits('bos_token_id'))}",
         r"bos_token_id is an integer of 5,000 digits; no field of a config.json needs more than 19 digits"),
    ],
)
def test_bad_names_fail_before_torch_work(tmp_path: Path, setup: Callable[[Path], str], message: str) -> None:
    spec = setup(tmp_path)
    with pytest.raises(ModelError, match=message):
        check_model_name(spec)
    with pytest.raises(ModelError, match=message):
        get_model(spec)


def test_a_sequence_length_in_the_name_is_trained_on_and_told_apart() -> None:
    """``,seq=N``: the batches are N tokens, the configuration (what caches and profiles key by) says so, and the
    layers are the same modules as the name without it."""
    short, plain = get_model("hf:llama-tiny,seq=8"), get_model("hf:llama-tiny")
    assert (short.seq_len, plain.seq_len) == (8, 16) and short.name == "hf:llama-tiny,seq=8"
    inputs, targets = short.make_batch(2, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (2, 8)
    assert short.config() != plain.config()
    long = get_model("hf:llama3-8b,seq=8192")
    assert long.seq_len == 8192 and get_model("hf:llama3-8b").seq_len == 2048  # beyond the default cap, up to 8,192
    built = [torch.nn.Sequential(*build_layers(m, 0, m.num_layers, seed=1)) for m in (short, plain)]
    assert [(k, v.shape) for k, v in built[0].state_dict().items()] == [(k, v.shape) for k, v in built[1].state_dict().items()]


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_shipped_configs_pass_the_checks_of_a_config_json(tmp_path: Path, name: str) -> None:
    """The bounds refuse no published model: each shipped config, given as a file, is accepted as it is."""
    assert load_hf_config(f"hf:{write_config(tmp_path, HF_CONFIGS[name])}") == HF_CONFIGS[name]


def test_missing_transformers_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    with pytest.raises(ModelError, match=re.escape("pip install -c constraints.txt")):
        check_model_name("hf:llama-tiny")


def test_hf_names_are_never_code() -> None:
    from hybridplan.models.names import is_code_name

    assert not is_code_name("hf:gpt2") and is_code_name("mypkg:gpt2")
