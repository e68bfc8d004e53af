"""GPT: a decoder-only transformer (Radford et al., 2019; Brown et al., 2020).

Layers: ``embed`` (token + learned position embeddings), one layer per transformer block, and
``head`` (final LayerNorm + vocabulary projection). Pre-norm blocks with causal self-attention and a
4x GELU MLP. Tensor parallelism follows Megatron-LM: q/k/v and the first MLP linear split by columns,
the attention output and second MLP linear by rows, the embedding by vocabulary rows, the head by
vocabulary columns (logits gathered).

The GPT-3 family sizes are those of the CAPTURE/Alpa evaluation (GPT-3 paper, Table 2.1; Alpa
``benchmark/alpa/suite_manual_gpt.py`` ``gpt_specs``): sequence 1024, vocabulary 51200.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    GatherOutput,
    RowParallel,
    ShardParams,
    TensorParallelPlan,
    VocabParallelEmbedding,
)

__all__ = ["GPTConfig", "GPT", "GPT_CONFIGS"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Size of a GPT."""

    num_blocks: int
    """Transformer blocks (the model has ``num_blocks + 2`` layers)."""
    hidden_size: int
    """Model width."""
    num_heads: int
    """Attention heads; must divide ``hidden_size``."""
    seq_len: int
    """Tokens per sample."""
    vocab_size: int
    """Vocabulary size."""


GPT_CONFIGS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(num_blocks=8, hidden_size=64, num_heads=4, seq_len=16, vocab_size=128),
    "gpt3-125m": GPTConfig(num_blocks=12, hidden_size=768, num_heads=12, seq_len=1024, vocab_size=51200),
    "gpt3-350m": GPTConfig(num_blocks=24, hidden_size=1024, num_heads=16, seq_len=1024, vocab_size=51200),
    "gpt3-760m": GPTConfig(num_blocks=24, hidden_size=1536, num_heads=16, seq_len=1024, vocab_size=51200),
    "gpt3-1.3b": GPTConfig(num_blocks=24, hidden_size=2048, num_heads=32, seq_len=1024, vocab_size=51200),
    "gpt3-2.6b": GPTConfig(num_blocks=32, hidden_size=2560, num_heads=32, seq_len=1024, vocab_size=51200),
    "gpt3-6.7b": GPTConfig(num_blocks=32, hidden_size=4096, num_heads=32, seq_len=1024, vocab_size=51200),
}


class Embedding(nn.Module):
    """Token plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = nn.Parameter(torch.randn(cfg.seq_len, cfg.hidden_size) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tokens(tokens) + self.positions[: tokens.shape[1]]


class Attention(nn.Module):
    """Causal multi-head self-attention; ``num_heads`` is the LOCAL head count under tensor parallelism."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, -1).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.fc1 = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size)
        self.fc2 = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    """Final LayerNorm and vocabulary projection (logits)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


_BLOCK_TP = TensorParallelPlan(
    [
        ("attn", ShardParams(divide=("num_heads",))),
        ("attn.q", ColumnParallel()),
        ("attn.k", ColumnParallel()),
        ("attn.v", ColumnParallel()),
        ("attn.o", RowParallel()),
        ("fc1", ColumnParallel()),
        ("fc2", RowParallel()),
    ]
)
_EMBED_TP = TensorParallelPlan([("tokens", VocabParallelEmbedding())])
_HEAD_TP = TensorParallelPlan([("proj", ColumnParallel()), ("proj", GatherOutput(dim=-1))])


class GPT(LayeredModel):
    """A GPT as ``[embed, block0, ..., block{n-1}, head]``.

    Example:
        >>> m = GPT("gpt-tiny", GPT_CONFIGS["gpt-tiny"])
        >>> m.num_layers, m.layer_name(0), m.layer_name(9)
        (10, 'embed', 'head')
    """

    vocab_parallel_loss = True  # the mean token cross entropy over the vocabulary (LayeredModel)

    def __init__(self, name: str, cfg: GPTConfig) -> None:
        self.name = name
        self.cfg = cfg

    @property
    def num_layers(self) -> int:
        return self.cfg.num_blocks + 2

    def layer_name(self, index: int) -> str:
        if index == 0:
            return "embed"
        if index == self.num_layers - 1:
            return "head"
        return f"block{index - 1}"

    def build_layer(self, index: int) -> nn.Module:
        if index == 0:
            return Embedding(self.cfg)
        if index == self.num_layers - 1:
            return Head(self.cfg)
        return Block(self.cfg)

    def layer_signature(self, index: int) -> str:
        """Every block is built from the same config (LayeredModel.layer_signature)."""
        return "embed" if index == 0 else "head" if index == self.num_layers - 1 else "block"

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        if index == 0:
            return _EMBED_TP
        if index == self.num_layers - 1:
            return _HEAD_TP
        return _BLOCK_TP

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.randint(0, self.cfg.vocab_size, (num_samples, self.cfg.seq_len + 1), generator=generator)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "family": "gpt", **asdict(self.cfg)}

    def describe(self) -> str:
        c = self.cfg
        return (
            f"{self.name}: GPT, {self.num_layers} layers (embed, {c.num_blocks} blocks, head), hidden {c.hidden_size},"
            f" {c.num_heads} heads, seq {c.seq_len}, vocab {c.vocab_size}"
        )
