"""Selective activation checkpointing per operation, as torchtitan runs it (a stage's ``"recompute": "selective"``).

[Note: torchtitan's selective checkpointing] torchtitan's ``activation_checkpoint.mode = "selective"`` with
``selective_ac_option = "op"`` (the default of its Llama 3 recipes, and the setting of its published Llama 3.1
runs, benchmarks/engine_memory) wraps each transformer block, and only the blocks, in a non-reentrant checkpoint
whose policy (torch's ``create_selective_checkpoint_contexts``) decides per operation what the forward keeps:

- the output of every *odd* matrix product of the block's forward (its 1st, 3rd, 5th, ...: a Llama block's
  ``q_proj``, ``v_proj``, ``gate_proj`` and ``down_proj``), counted afresh for each block's call (torchtitan counts
  the recompute's products apart; torch 2.13 no longer asks the policy in the recompute, which replays the
  forward's decisions);
- the output of the attention kernel (scaled-dot-product attention, whichever backend), of a reduce-scatter and
  of ``max``;
- nothing else: everything else is recomputed in the backward pass.

Sources: torchtitan's ``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370 (Dec 2024, the commit its
published Llama 3.1 measurements cite: ``_save_list`` and ``_apply_ac_to_transformer_block``), and
``torchtitan/distributed/activation_checkpoint.py`` (``SelectiveAC``, 2026), which keeps the same rule with more
attention backends. The CPU's flash-attention kernel (``_scaled_dot_product_flash_attention_for_cpu``, what fake and
CPU tensors dispatch to) is kept as the CUDA flash kernel is: the same policy on the device the runtime runs.

The embedding and the head are not blocks: torchtitan does not checkpoint them, and neither does this. A checkpointed
head would keep its vocabulary projection's output (a kept matrix product) beside the copy the loss takes of it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["selective_contexts", "KEPT_OPERATIONS"]


def _ops(*names: str) -> frozenset[Any]:
    """The ``aten``/``_c10d_functional`` overloads named (``namespace.op``), those this torch has."""
    found = []
    for name in names:
        namespace, op = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None:
            found.append(packet.default)
    return frozenset(found)


_MATMULS = _ops("aten.mm", "aten.linear")
"""What torchtitan counts as a matrix product (``linear`` where a backend keeps it whole; on CPU and CUDA it
decomposes into ``mm``)."""

KEPT_OPERATIONS: frozenset[Any] = _MATMULS | _ops(
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_attention_math", "_c10d_functional.reduce_scatter_tensor", "aten.max")
"""Operations whose outputs a selective checkpoint keeps (matrix products: every second one only)."""


def selective_contexts() -> tuple[Any, Any]:
    """The forward and recompute contexts of one checkpointed block's call (``checkpoint(..., context_fn=...)``),
    with a fresh count of matrix products ([Note: torchtitan's selective checkpointing])."""
    products = 0

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        nonlocal products
        if func in _MATMULS:
            products += 1
            return CheckpointPolicy.MUST_SAVE if products % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in KEPT_OPERATIONS else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

