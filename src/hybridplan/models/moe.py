"""GShard Mixture-of-Experts transformer LM, as benchmarked by Alpa (and by the CAPTURE evaluation).

Layers: ``embed`` (token + learned position embeddings), ``num_blocks`` transformer blocks, and ``head``
(final LayerNorm + vocabulary projection). Blocks alternate between an MoE block, whose MLP is replaced
by top-2 gated experts, and a dense block (GShard, Lepikhin et al., 2020: every other feed-forward
layer is an MoE layer); as in Alpa ``alpa/model/moe.py`` ``FlaxMoELayerCollection`` the even-numbered
blocks (``block0``, ``block2``, ...) are the MoE ones.

Routing is GShard's static dispatch (Alpa ``top2_gating``, after Lingvo ``gshard_layers.py``): the
flattened ``batch * seq`` tokens form groups of ``S = expert_group_size`` tokens; each expert takes at
most ``C = ceil(2 * S / E * capacity_factor)`` tokens per group; a token's position in its expert's
buffer is a cumulative sum of one-hot masks and tokens past the capacity are dropped; dispatch and
combine are einsums with ``[G, S, E, C]`` tensors. Every shape depends only on the batch shape, never
on the data, so the layer runs unchanged under ``FakeTensorMode``.

[Note: MoE groups and plans] Groups are contiguous runs of the flattened tokens, so a group spans
``S / seq_len`` consecutive samples when ``S > seq_len`` (the paper sizes: 2048 / 1024 = 2). A
micro-batch or data-parallel shard whose sample count is a multiple of :attr:`MoE.samples_per_group`
forms exactly the groups of the full batch, hence computes the same routing and the same math; any
other count raises :class:`ModelError` (padding would change which tokens are dropped).

Tensor parallelism (Megatron-style): attention as in GPT (q, k, v by columns, o by rows, local heads);
the dense MLP column- then row-parallel; in an MoE block the experts are split on F (``wi [E, M, F]``
on dim 2, ``wo [E, F, M]`` on dim 1) inside an ``f``/``g`` region around the experts alone, so that the
gate, dispatch and combine stay replicated and see the full expert outputs; embedding by vocabulary
rows, head by vocabulary columns with the logits gathered.

Differences from Alpa's model, on purpose: pre-norm blocks with causal attention, reusing
:mod:`hybridplan.models.gpt` (Alpa uses post-norm BERT layers: the same weight matrices, LayerNorms
placed differently); an untied head (tying would couple the first and last pipeline stages); no auxiliary
load-balancing loss (Alpa's ``top2_gating`` has none either: "TODO(lmzheng): add the auxiliary loss").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.gpt import Attention, Embedding, GPTConfig, Head
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    CopyInput,
    GatherOutput,
    ReduceOutput,
    RowParallel,
    ShardParams,
    TensorParallelPlan,
    VocabParallelEmbedding,
)
from hybridplan.models.zoo import register

__all__ = ["MoEConfig", "MoE", "MOE_CONFIGS", "top2_gating"]


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Size of a GShard MoE language model."""

    num_blocks: int
    """Transformer blocks, half of them MoE (the model has ``num_blocks + 2`` layers); must be even."""
    hidden_size: int
    """Model width M."""
    num_heads: int
    """Attention heads; must divide ``hidden_size``."""
    seq_len: int
    """Tokens per sample."""
    vocab_size: int
    """Vocabulary size."""
    num_experts: int
    """Experts E per MoE block."""
    expert_group_size: int
    """Tokens S per routing group (Alpa's ``expert_group_size``, GShard's S)."""
    mlp_ratio: int = 8
    """Hidden width F of every MLP and expert as a multiple of M. Alpa's MoE benchmark sets
    ``intermediate_size=hidden_size * 8`` ("specific to gspmd", benchmark/alpa/benchmark_one_case_moe.py);
    with 4 the paper sizes would have about half the parameters their names say."""
    capacity_factor: float = 1.0
    """Expert capacity relative to an even top-2 split; 1.0 gives Alpa's ``C = 2 * S // E`` (GShard's 2N/E)."""

    @property
    def capacity(self) -> int:
        """Tokens C an expert accepts per group."""
        return math.ceil(2 * self.expert_group_size / self.num_experts * self.capacity_factor)

    def gpt(self) -> GPTConfig:
        """The GPT configuration whose embedding, attention and head this model reuses."""
        return GPTConfig(
            num_blocks=self.num_blocks,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            seq_len=self.seq_len,
            vocab_size=self.vocab_size,
        )


def _alpa(num_blocks: int, hidden_size: int, num_experts: int) -> MoEConfig:
    # Alpa benchmark/alpa/suite_manual_moe.py moe_specs (commit b8078a9f): seq_len 1024, vocab 32000,
    # 16 heads and expert_group_size 2048 for every size.
    return MoEConfig(
        num_blocks=num_blocks,
        hidden_size=hidden_size,
        num_heads=16,
        seq_len=1024,
        vocab_size=32000,
        num_experts=num_experts,
        expert_group_size=2048,
    )


MOE_CONFIGS: dict[str, MoEConfig] = {
    # Small enough for multi-process tests on a laptop; 4 blocks = two MoE and two dense blocks.
    "moe-tiny": MoEConfig(
        num_blocks=4, hidden_size=32, num_heads=4, seq_len=16, vocab_size=128, num_experts=4, expert_group_size=16
    ),
    # (num_layers, hidden_size, num_experts) of Alpa moe_specs "380M" ... "10B".
    "moe-380m": _alpa(8, 768, 8),
    "moe-690m": _alpa(8, 768, 16),
    "moe-1.3b": _alpa(16, 768, 16),
    "moe-2.4b": _alpa(16, 1024, 16),
    "moe-7.1b": _alpa(16, 1280, 32),
    "moe-10b": _alpa(16, 1536, 32),
}


def top2_gating(gates: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GShard top-2 routing of softmax ``gates [G, S, E]`` into expert buffers of ``capacity`` slots.

    Returns ``(combine [G, S, E, C], dispatch [G, S, E, C])``: ``dispatch`` is 1 where a token occupies
    a slot, ``combine`` holds its renormalised gate weight there. The first choices of all tokens are
    placed before the second choices, each in token order; tokens past the capacity are dropped.
    Positions are counted in int64 so that they stay exact in low-precision runs.
    """
    num_experts = gates.shape[-1]
    experts = torch.arange(num_experts, device=gates.device)
    slots = torch.arange(capacity, device=gates.device)

    index_1 = gates.argmax(dim=-1)  # [G, S]
    mask_1 = (index_1.unsqueeze(-1) == experts).long()  # [G, S, E]
    gate_1 = (gates * mask_1).sum(dim=-1)
    without_1 = gates * (1 - mask_1)
    index_2 = without_1.argmax(dim=-1)
    mask_2 = (index_2.unsqueeze(-1) == experts).long()
    gate_2 = (without_1 * mask_2).sum(dim=-1)

    pos_1 = mask_1.cumsum(dim=1) - mask_1  # slot of each first choice in its expert's buffer
    mask_1 = mask_1 * (pos_1 < capacity)
    pos_1 = (pos_1 * mask_1).sum(dim=-1)  # [G, S]
    pos_2 = mask_2.cumsum(dim=1) - mask_2 + mask_1.sum(dim=1, keepdim=True)  # after all first choices
    mask_2 = mask_2 * (pos_2 < capacity)
    pos_2 = (pos_2 * mask_2).sum(dim=-1)

    kept_1, kept_2 = mask_1.sum(dim=-1), mask_2.sum(dim=-1)  # [G, S], 0 where dropped
    gate_1, gate_2 = gate_1 * kept_1, gate_2 * kept_2
    denom = gate_1 + gate_2
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    gate_1, gate_2 = gate_1 / denom, gate_2 / denom

    slot_1 = (pos_1.unsqueeze(-1) == slots).to(gates.dtype)  # [G, S, C]
    slot_2 = (pos_2.unsqueeze(-1) == slots).to(gates.dtype)
    where_1 = mask_1.to(gates.dtype).unsqueeze(-1) * slot_1.unsqueeze(-2)  # [G, S, E, C]
    where_2 = mask_2.to(gates.dtype).unsqueeze(-1) * slot_2.unsqueeze(-2)
    combine = gate_1[..., None, None] * where_1 + gate_2[..., None, None] * where_2
    return combine, where_1 + where_2


class Experts(nn.Module):
    """E two-layer ReLU MLPs as batched weights ``wi [E, M, F]`` and ``wo [E, F, M]`` on ``[E, G, C, M]``.

    Initialised with LeCun normal (std ``1/sqrt(fan_in)``), Alpa's ``kernel_init``. Under tensor
    parallelism F is sharded, so the output is a partial sum (closed by :class:`ReduceOutput`).
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        e, m, f = cfg.num_experts, cfg.hidden_size, cfg.mlp_ratio * cfg.hidden_size
        self.wi = nn.Parameter(torch.randn(e, m, f) / math.sqrt(m))
        self.wo = nn.Parameter(torch.randn(e, f, m) / math.sqrt(f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(torch.einsum("egcm,emf->egcf", x, self.wi))
        return torch.einsum("egcf,efm->egcm", h, self.wo)


class MoEFeedForward(nn.Module):
    """Gate (replicated), top-2 dispatch into :class:`Experts`, combine; Alpa's ``FlaxPositionWiseMoELayer``."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.group_size = cfg.expert_group_size
        self.capacity = cfg.capacity
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[0] * x.shape[1]
        if tokens % self.group_size:
            raise ModelError(
                f"MoE layer got {x.shape[0]} samples x {x.shape[1]} tokens = {tokens} tokens, not a multiple of"
                f" expert_group_size {self.group_size}",
                fix="use micro-batch and data-parallel shard sizes that are multiples of the model's"
                " samples_per_group (see [Note: MoE groups and plans] in hybridplan/models/moe.py)",
            )
        grouped = x.reshape(-1, self.group_size, x.shape[-1])  # [G, S, M]
        gates = F.softmax(self.gate(grouped), dim=-1)
        combine, dispatch = top2_gating(gates, self.capacity)
        expert_in = torch.einsum("gsec,gsm->egcm", dispatch, grouped)
        expert_out = self.experts(expert_in)
        return torch.einsum("gsec,egcm->gsm", combine, expert_out).reshape(x.shape)


class DenseBlock(nn.Module):
    """Pre-norm transformer block with a ``mlp_ratio``-wide GELU MLP."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg.gpt())
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.mlp_ratio * cfg.hidden_size)
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MoEBlock(nn.Module):
    """Pre-norm transformer block whose MLP is :class:`MoEFeedForward`."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg.gpt())
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.moe = MoEFeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


_ATTENTION_TP = [
    ("attn", ShardParams(divide=("num_heads",))),
    ("attn.q", ColumnParallel()),
    ("attn.k", ColumnParallel()),
    ("attn.v", ColumnParallel()),
    ("attn.o", RowParallel()),
]
_DENSE_TP = TensorParallelPlan([*_ATTENTION_TP, ("fc1", ColumnParallel()), ("fc2", RowParallel())])
# Experts split on F inside an f ... g region around the experts only: the gate and the dispatch/combine
# einsums stay replicated, so the gate sees the full (reduced) expert outputs and gets full gradients.
_MOE_TP = TensorParallelPlan(
    [
        *_ATTENTION_TP,
        ("moe.experts", CopyInput()),
        ("moe.experts", ShardParams({"wi": 2, "wo": 1})),
        ("moe.experts", ReduceOutput()),
    ]
)
_EMBED_TP = TensorParallelPlan([("tokens", VocabParallelEmbedding())])
_HEAD_TP = TensorParallelPlan([("proj", ColumnParallel()), ("proj", GatherOutput(dim=-1))])


class MoE(LayeredModel):
    """A GShard MoE LM as ``[embed, block0 (MoE), block1 (dense), ..., head]``.

    Example:
        >>> m = MoE("moe-tiny", MOE_CONFIGS["moe-tiny"])
        >>> m.num_layers, m.layer_name(1), m.layer_name(2), m.layer_name(5)
        (6, 'block0', 'block1', 'head')
    """

    vocab_parallel_loss = True  # the mean token cross entropy over the vocabulary (LayeredModel)

    def __init__(self, name: str, cfg: MoEConfig) -> None:
        if cfg.num_blocks % 2:
            raise ModelError(
                f"MoE model {name!r} has num_blocks {cfg.num_blocks}, not even",
                fix="give an even num_blocks: blocks alternate MoE and dense",
            )
        if cfg.num_experts < 2:
            raise ModelError(
                f"MoE model {name!r} has {cfg.num_experts} experts", fix="give at least 2: routing is top-2"
            )
        if cfg.hidden_size % cfg.num_heads:
            raise ModelError(
                f"MoE model {name!r}: hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}",
                fix="choose num_heads dividing hidden_size",
            )
        if cfg.capacity < 1:
            raise ModelError(
                f"MoE model {name!r} has expert capacity {cfg.capacity} (S {cfg.expert_group_size},"
                f" E {cfg.num_experts}, capacity_factor {cfg.capacity_factor})",
                fix="raise expert_group_size or capacity_factor",
            )
        self.name = name
        self.cfg = cfg

    @property
    def num_layers(self) -> int:
        return self.cfg.num_blocks + 2

    @property
    def samples_per_group(self) -> int:
        """Smallest sample count whose tokens fill whole routing groups; micro-batches and data-parallel
        shards must be multiples of it (see [Note: MoE groups and plans])."""
        s, t = self.cfg.expert_group_size, self.cfg.seq_len
        return s * t // math.gcd(s, t) // t

    @property
    def sample_granularity(self) -> int:
        """Batch sizes (micro-batches, data-parallel shards, shape probes) must be multiples of this:
        :attr:`samples_per_group`. A generic name for runtimes and plan validation to look up."""
        return self.samples_per_group

    def is_moe_block(self, index: int) -> bool:
        """Whether layer ``index`` is an MoE block (even-numbered blocks, as in Alpa)."""
        return 0 < index < self.num_layers - 1 and (index - 1) % 2 == 0

    def layer_name(self, index: int) -> str:
        if index == 0:
            return "embed"
        if index == self.num_layers - 1:
            return "head"
        return f"block{index - 1}"

    def build_layer(self, index: int) -> nn.Module:
        if index == 0:
            return Embedding(self.cfg.gpt())
        if index == self.num_layers - 1:
            return Head(self.cfg.gpt())
        return MoEBlock(self.cfg) if self.is_moe_block(index) else DenseBlock(self.cfg)

    def layer_signature(self, index: int) -> str:
        """MoE blocks alternate with dense ones, each kind built from the same config (LayeredModel.layer_signature)."""
        if index == 0 or index == self.num_layers - 1:
            return "embed" if index == 0 else "head"
        return "moe" if self.is_moe_block(index) else "dense"

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        if index == 0:
            return _EMBED_TP
        if index == self.num_layers - 1:
            return _HEAD_TP
        return _MOE_TP if self.is_moe_block(index) else _DENSE_TP

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.randint(0, self.cfg.vocab_size, (num_samples, self.cfg.seq_len + 1), generator=generator)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": "moe",
            **asdict(self.cfg),
            "capacity": self.cfg.capacity,
            "samples_per_group": self.samples_per_group,
        }

    def describe(self) -> str:
        c = self.cfg
        return (
            f"{self.name}: GShard MoE, {self.num_layers} layers (embed, {c.num_blocks} blocks alternating MoE/dense,"
            f" head), hidden {c.hidden_size}, {c.num_experts} experts, group {c.expert_group_size}, capacity"
            f" {c.capacity}, seq {c.seq_len}, vocab {c.vocab_size}"
        )


for _name, _cfg in MOE_CONFIGS.items():
    register(_name, partial(MoE, _name, _cfg))
