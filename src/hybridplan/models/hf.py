"""HuggingFace decoder-only LMs as layered models, built from their configuration with transformers.

``get_model("hf:llama3-8b")`` reads the configuration (hybridplan/models/hf_config.py: shipped, or a
``config.json``) and decomposes the model as transformers' ``*ForCausalLM`` computes it:

- ``embed``: the token embedding (``embed_tokens``; GPT-2 ``wte`` plus the learned positions ``wpe``);
- ``layer0`` ... ``layer{n-1}``: each one transformers' own decoder layer (``LlamaDecoderLayer``,
  ``GPT2Block``, ...), built with its ``layer_idx``;
- ``head``: the final norm and the vocabulary projection ``lm_head``.

[Note: HF layers as stages] Only the hidden states cross a layer boundary (models/boundaries.py: one
``[seq, hidden]`` tensor per sample). What ``*Model.forward`` computes once and hands to every layer is
rebuilt inside each layer from the sequence length alone: the position ids (``0 .. seq-1``, the same
for every sample: no padding), the rotary ``cos``/``sin`` (each decoder layer owns a rotary module, a
buffer of ``head_dim / 2`` inverse frequencies) and the attention mask (none: SDPA's causal mask;
or an explicit causal sliding-window mask where the config's window is shorter than the sequence).
So any range of layers runs as a stage, and the math is the whole model's.

Departures from the HF model, on purpose: a tied ``lm_head`` is untied (tying would couple the first
and last stages; GPT-2 then has one more ``vocab x hidden`` matrix), dropout is off (it would make
micro-batches and data-parallel shards change the math), attention is SDPA, and a Mixtral layer's
experts run as a grouped matrix product (:class:`SparseMoE`: transformers' ``grouped_mm`` experts, with
the fused ``gate_up_proj`` held as ``gate_proj`` and ``up_proj``), whose shapes do not depend on the
routing, so fake tensors simulate it and memory is the same for every batch. Weights are drawn like
``_init_weights`` of transformers (normal with ``initializer_range``; zero biases; norms at one; GPT-2's
``c_proj`` without its ``1/sqrt(2 n_layer)`` scaling), layer by layer from the seeded RNG (models/base.py).

Tensor parallelism (Megatron-style, models/tensor_parallel.py): attention ``q_proj``, ``k_proj``,
``v_proj`` by columns and ``o_proj`` by rows (whole heads: query and key/value head counts must
divide by the degree); the MLP ``gate_proj``, ``up_proj`` by columns, ``down_proj`` by rows; Mixtral
experts split on their intermediate size inside an ``f``/``g`` region around the experts alone (the
router and the combine stay replicated); the embedding by vocabulary rows, the head by vocabulary
columns with the logits gathered. GPT-2's ``Conv1D`` modules (a linear with its weight transposed) are
held as ``nn.Linear`` and its fused ``c_attn`` as ``q``, ``k``, ``v`` (:class:`SplitQKV`), so that the same
rules split them: ``c_attn.q/k/v`` and ``c_fc`` by columns, ``attn.c_proj`` and ``mlp.c_proj`` by rows.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.hf_config import HF_PREFIX, SEQ_LEN_KEY, check_transformers, hf_seq_len, load_hf_config
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    CopyInput,
    GatherOutput,
    ReduceOutput,
    RowParallel,
    ShardParams,
    TensorParallelPlan,
    TensorParallelRule,
    VocabParallelEmbedding,
)

__all__ = ["HFModel", "SparseMoE", "GroupedExperts", "grouped_mm", "hf_model"]

# model_type -> (transformers module, config class, decoder layer class, final norm class, rotary class)
_CLASSES: dict[str, tuple[str, str, str, str | None, str | None]] = {
    "llama": ("llama", "LlamaConfig", "LlamaDecoderLayer", "LlamaRMSNorm", "LlamaRotaryEmbedding"),
    "mistral": ("mistral", "MistralConfig", "MistralDecoderLayer", "MistralRMSNorm", "MistralRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2DecoderLayer", "Qwen2RMSNorm", "Qwen2RotaryEmbedding"),
    "mixtral": ("mixtral", "MixtralConfig", "MixtralDecoderLayer", "MixtralRMSNorm", "MixtralRotaryEmbedding"),
    "gpt2": ("gpt2", "GPT2Config", "GPT2Block", None, None),
}
_DROPOUTS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout",
             "hidden_dropout", "router_jitter_noise")


# ---------------------------------------------------------------------------------------------- grouped experts
@torch.library.custom_op("hybridplan::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows ``offsets[e-1]:offsets[e]`` of ``x [S, K]`` times ``weight[e] [K, N]``: ``[S, N]``.

    A custom operator (like transformers' ``grouped_mm_fallback``) so that fake tensors see only its
    output, whose shape does not depend on how many rows each expert got. ``torch._grouped_mm`` does the
    same on CUDA, but its meta kernel accepts only bf16 (measured on torch 2.13), so fp32 runs could not
    be simulated with it.
    """
    out = x.new_zeros(x.shape[0], weight.shape[-1])
    start = 0
    for e, stop in enumerate(offsets.tolist()):
        if stop > start:
            torch.mm(x[start:stop], weight[e], out=out[start:stop])
        start = stop
    return out


@grouped_mm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[-1])


@torch.library.custom_op("hybridplan::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward(
    x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_x, grad_w = torch.zeros_like(x), torch.zeros_like(weight)
    start = 0
    for e, stop in enumerate(offsets.tolist()):
        if stop > start:
            torch.mm(grad[start:stop], weight[e].t(), out=grad_x[start:stop])
            torch.mm(x[start:stop].t(), grad[start:stop], out=grad_w[e])
        start = stop
    return grad_x, grad_w


@_grouped_mm_backward.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offsets = inputs[2]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, weight = ctx.saved_tensors
    grad_x, grad_w = _grouped_mm_backward(x, weight, ctx.offsets, grad.contiguous())
    return grad_x, grad_w, None


grouped_mm.register_autograd(_backward, setup_context=_setup)


class GroupedExperts(nn.Module):
    """E gated MLPs ``down(act(gate(x)) * up(x))`` over expert-sorted rows (Mixtral's experts).

    Weights as transformers holds them (``[E, out, in]``), with ``gate_up_proj`` split into ``gate_proj``
    and ``up_proj`` so that tensor parallelism shards each on the intermediate size (dim 1; ``down_proj``
    on dim 2) and the output is a partial sum closed by :class:`ReduceOutput`.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        e, h, f = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Parameter(torch.empty(e, f, h))
        self.up_proj = nn.Parameter(torch.empty(e, f, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, f))
        from transformers.activations import ACT2FN

        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        gate = grouped_mm(x, self.gate_proj.transpose(1, 2), offsets)
        up = grouped_mm(x, self.up_proj.transpose(1, 2), offsets)
        return grouped_mm(self.act_fn(gate) * up, self.down_proj.transpose(1, 2), offsets)


class SparseMoE(nn.Module):
    """Mixtral's sparse MoE block: transformers' top-k router, :class:`GroupedExperts`, weighted sum.

    The same math as ``MixtralSparseMoeBlock`` with the ``grouped_mm`` experts: every token's top-k
    (expert, weight) pairs are sorted by expert, the experts run on the sorted rows, and each token sums
    its k outputs times the router weights.
    """

    def __init__(self, config: Any, router: nn.Module) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.num_experts = config.num_local_experts
        self.gate = router
        self.experts = GroupedExperts(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        _, weights, index = self.gate(flat)  # [N, k] each
        expert_of, order = torch.sort(index.reshape(-1), stable=True)
        rows = flat[order // self.top_k]  # [N * k, H], grouped by expert
        counts = (expert_of.unsqueeze(-1) == torch.arange(self.num_experts, device=flat.device)).sum(dim=0)
        offsets = counts.cumsum(dim=0).to(torch.int32)
        out = self.experts(rows, offsets) * weights.reshape(-1)[order].unsqueeze(-1)
        out = out[torch.argsort(order)].view(flat.shape[0], self.top_k, shape[-1]).sum(dim=1)
        return out.to(hidden.dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------- layers
class SplitQKV(nn.Module):
    """GPT-2's ``c_attn`` (one ``Conv1D`` computing ``[q | k | v]``) as three ``nn.Linear`` whose outputs are
    concatenated: the same math, and each part splits by columns (a fused weight's shards would interleave
    the parts)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def _as_linear(conv1d: nn.Module) -> nn.Linear:
    """An ``nn.Linear`` of the shape of a transformers ``Conv1D`` (``x @ W + b`` with ``W`` of ``[in, out]``:
    the same math with the weight transposed); its weights are drawn by :func:`_init_weights`."""
    weight = conv1d.get_parameter("weight")
    return nn.Linear(weight.shape[0], weight.shape[1])


class Embedding(nn.Module):
    """Token embedding (``embed_tokens``); GPT-2: ``wte`` plus learned positions ``wpe``."""

    def __init__(self, config: Any, gpt2: bool) -> None:
        super().__init__()
        if gpt2:
            self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
            self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "wte"):
            return self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        return self.embed_tokens(tokens)


class DecoderLayer(nn.Module):
    """One transformers decoder layer, with what ``*Model.forward`` would hand it rebuilt here
    ([Note: HF layers as stages])."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None, sliding_window: int | None) -> None:
        super().__init__()
        self.layer = layer
        if rotary is not None:
            self.rotary = rotary
        self.sliding_window = sliding_window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        positions = torch.arange(t, device=x.device).unsqueeze(0)
        kwargs: dict[str, Any] = {}
        if hasattr(self, "rotary"):
            kwargs["position_embeddings"] = self.rotary(x, positions)
            kwargs["position_ids"] = positions
        mask = None
        if self.sliding_window is not None and self.sliding_window < t:
            q, k = positions.view(t, 1), positions.view(1, t)
            mask = ((k <= q) & (q - k < self.sliding_window)).view(1, 1, t, t)
        out = self.layer(x, attention_mask=mask, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    """Final norm and the (untied) vocabulary projection ``lm_head``."""

    def __init__(self, norm: nn.Module, config: Any) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


@torch.no_grad()
def _init_weights(module: nn.Module, std: float) -> None:
    """transformers' ``_init_weights`` for these models: normal(0, std) matrices, zero biases; norms keep
    their constructors' ones and zeros."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear | nn.Embedding) or type(sub).__name__.endswith("TopKRouter"):
            # *TopKRouter: Mixtral's router (a bare weight)
            matrices: list[torch.Tensor] = [sub.get_parameter("weight")]
            bias = getattr(sub, "bias", None)
            if isinstance(bias, torch.Tensor):
                bias.zero_()
        elif isinstance(sub, GroupedExperts):
            matrices = [sub.gate_proj, sub.up_proj, sub.down_proj]
        else:
            continue
        for p in matrices:
            p.normal_(0.0, std)


# ---------------------------------------------------------------------------------------------- tensor parallel
class WholeHeads(TensorParallelRule):
    """No split of its own: checks that query and key/value heads divide by the degree (whole heads
    per rank: the attention reshapes its projections into ``-1`` heads of ``head_dim``)."""

    def __init__(self, heads: int, kv_heads: int) -> None:
        self.heads, self.kv_heads = heads, kv_heads

    def apply(self, module: nn.Module, tp: Any) -> None:
        return None

    def problem(self, module: nn.Module, degree: int) -> str | None:
        for what, n in (("attention heads", self.heads), ("key/value heads", self.kv_heads)):
            if n % degree:
                return f"{what} {n} is not divisible by degree {degree}"
        return None


_EMBED_TP = TensorParallelPlan([("embed_tokens", VocabParallelEmbedding())])
_GPT2_EMBED_TP = TensorParallelPlan([("wte", VocabParallelEmbedding())])
_HEAD_TP = TensorParallelPlan([("lm_head", ColumnParallel()), ("lm_head", GatherOutput(dim=-1))])
_DENSE_MLP_TP = [("layer.mlp.gate_proj", ColumnParallel()), ("layer.mlp.up_proj", ColumnParallel()),
                 ("layer.mlp.down_proj", RowParallel())]
_EXPERTS_TP = [("layer.mlp.experts", CopyInput()),
               ("layer.mlp.experts", ShardParams({"gate_proj": 1, "up_proj": 1, "down_proj": 2})),
               ("layer.mlp.experts", ReduceOutput())]


# ---------------------------------------------------------------------------------------------- the model
class HFModel(LayeredModel):
    """A transformers decoder-only LM as ``[embed, layer0, ..., layer{n-1}, head]``.

    Example:
        >>> m = hf_model("hf:llama-tiny")
        >>> m.num_layers, m.layer_name(0), m.layer_name(1), m.layer_name(3)
        (4, 'embed', 'layer0', 'head')
    """

    vocab_parallel_loss = True  # the mean token cross entropy over the vocabulary (LayeredModel)

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.raw_config = config
        self.model_type: str = config["model_type"]
        self.seq_len = hf_seq_len(config)
        module, config_cls, self._layer_cls, self._norm_cls, self._rotary_cls = _CLASSES[self.model_type]
        self._module = f"transformers.models.{module}.modeling_{module}"
        cls = getattr(importlib.import_module(f"transformers.models.{module}.configuration_{module}"), config_cls)
        hf_config = cls.from_dict({k: v for k, v in config.items() if k not in ("auto_map", "architectures", SEQ_LEN_KEY)})
        for key in _DROPOUTS:
            if hasattr(hf_config, key):
                setattr(hf_config, key, 0.0)
        hf_config._attn_implementation = "sdpa"
        hf_config.use_cache = False
        self.hf_config = hf_config
        heads, hidden = hf_config.num_attention_heads, hf_config.hidden_size
        if self.model_type == "gpt2" and hidden % heads:
            raise ModelError(f"model {name!r}: n_embd {hidden} is not divisible by n_head {heads}",
                             fix="give n_embd a multiple of n_head")
        kv = getattr(hf_config, "num_key_value_heads", None) or heads
        if heads % kv:
            raise ModelError(f"model {name!r}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                             fix="give num_key_value_heads dividing num_attention_heads")
        self._heads = WholeHeads(heads, kv)

    def __getstate__(self) -> dict[str, Any]:  # the runtime pickles models to its processes
        return {"name": self.name, "config": self.raw_config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["config"])  # type: ignore[misc]

    @property
    def num_layers(self) -> int:
        return int(self.hf_config.num_hidden_layers) + 2

    def layer_name(self, index: int) -> str:
        if index == 0:
            return "embed"
        if index == self.num_layers - 1:
            return "head"
        return f"layer{index - 1}"

    def _sliding_window(self, layer: int) -> int | None:
        window = getattr(self.hf_config, "sliding_window", None)
        types = getattr(self.hf_config, "layer_types", None)
        if types is not None:
            return window if types[layer] == "sliding_attention" else None
        return window

    def build_layer(self, index: int) -> nn.Module:
        cfg = self.hf_config
        modeling = importlib.import_module(self._module)
        built: nn.Module
        if index == 0:
            built = Embedding(cfg, gpt2=self.model_type == "gpt2")
        elif index == self.num_layers - 1:
            if self._norm_cls is None:
                norm: nn.Module = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
            else:
                norm = getattr(modeling, self._norm_cls)(cfg.hidden_size, eps=cfg.rms_norm_eps)
            built = Head(norm, cfg)
        else:
            i = index - 1
            layer = getattr(modeling, self._layer_cls)(cfg, layer_idx=i)
            if self.model_type == "mixtral":
                layer.mlp = SparseMoE(cfg, layer.mlp.gate)
            if self.model_type == "gpt2":
                layer.attn.c_attn = SplitQKV(cfg.hidden_size)
                layer.attn.c_proj = _as_linear(layer.attn.c_proj)
                layer.mlp.c_fc = _as_linear(layer.mlp.c_fc)
                layer.mlp.c_proj = _as_linear(layer.mlp.c_proj)
            rotary = getattr(modeling, self._rotary_cls)(cfg) if self._rotary_cls else None
            built = DecoderLayer(layer, rotary, self._sliding_window(i))
        _init_weights(built, cfg.initializer_range)
        return built

    def layer_signature(self, index: int) -> str:
        """Decoder layers differ only by ``layer_idx`` (a key-value cache index: no cache is kept here) and by their
        attention window (``layer_types``): layers of one window are one layer (LayeredModel.layer_signature)."""
        if index == 0 or index == self.num_layers - 1:
            return "embed" if index == 0 else "head"
        return f"decoder(window={self._sliding_window(index - 1)})"

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan:
        if index == 0:
            return _GPT2_EMBED_TP if self.model_type == "gpt2" else _EMBED_TP
        if index == self.num_layers - 1:
            return _HEAD_TP
        if self.model_type == "gpt2":
            return TensorParallelPlan([
                ("layer.attn", self._heads), ("layer.attn", ShardParams(divide=("split_size",))),
                ("layer.attn.c_attn.q", ColumnParallel()), ("layer.attn.c_attn.k", ColumnParallel()),
                ("layer.attn.c_attn.v", ColumnParallel()), ("layer.attn.c_proj", RowParallel()),
                ("layer.mlp.c_fc", ColumnParallel()), ("layer.mlp.c_proj", RowParallel())])
        attention = [("layer.self_attn", self._heads), ("layer.self_attn.q_proj", ColumnParallel()),
                     ("layer.self_attn.k_proj", ColumnParallel()), ("layer.self_attn.v_proj", ColumnParallel()),
                     ("layer.self_attn.o_proj", RowParallel())]
        return TensorParallelPlan([*attention, *(_EXPERTS_TP if self.model_type == "mixtral" else _DENSE_MLP_TP)])

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.randint(0, self.hf_config.vocab_size, (num_samples, self.seq_len + 1), generator=generator)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "family": "hf", "model_type": self.model_type, "seq_len": self.seq_len,
                "hf_config": self.raw_config}

    def describe(self) -> str:
        c = self.hf_config
        extra = f", {c.num_local_experts} experts top-{c.num_experts_per_tok}" if self.model_type == "mixtral" else ""
        kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return (f"{self.name}: HF {self.model_type}, {self.num_layers} layers (embed, {c.num_hidden_layers} decoder"
                f" layers, head), hidden {c.hidden_size}, {c.num_attention_heads} heads ({kv} key/value){extra},"
                f" seq {self.seq_len}, vocab {c.vocab_size}")


def hf_model(name: str) -> HFModel:
    """The layered model of ``hf:NAME_OR_PATH`` (see hybridplan/models/hf_config.py).

    Raises:
        ModelError: a bad name, path or config (:func:`~hybridplan.models.hf_config.load_hf_config`), or
            transformers not installed.
    """
    config = load_hf_config(name)
    check_transformers()
    if not name.startswith(HF_PREFIX):
        name = HF_PREFIX + name
    try:
        return HFModel(name, config)
    except (TypeError, ValueError, KeyError) as e:  # transformers' own checks of the config's values
        raise ModelError(f"model {name!r}: transformers rejects the config: {type(e).__name__}: {e}",
                         fix="fix the config.json (compare with the model card's)") from None

