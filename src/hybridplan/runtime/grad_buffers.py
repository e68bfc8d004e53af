"""Where gradients accumulate over micro-batches: in autograd's ``.grad``, or in a persistent fp32 buffer.

[Note: fp32 gradient buffers] This runtime, like plain PyTorch, lets autograd accumulate each
micro-batch's gradient into ``param.grad``, in the parameter's dtype, and frees it at the start of the
next iteration (``zero_grad(set_to_none=True)``): between iterations a device holds no gradients, and in
mixed precision its gradients are 2 bytes per parameter. Megatron-LM and DeepSpeed hold them otherwise
(docs/engines.md gives the sources):

- Megatron-LM gives every parameter a ``main_grad``, a view into a contiguous gradient buffer that is
  allocated once and kept; a hook after each parameter's gradient is accumulated adds the low-precision
  ``.grad`` into it and frees the ``.grad`` (megatron/core/distributed/distributed_data_parallel.py,
  ``_make_backward_post_hook``). With bf16 the buffer is fp32 by default, and the data-parallel all-reduce
  runs on it ("accumulate and all-reduce gradients in fp32 for bfloat16 data type",
  megatron/training/arguments.py); the optimizer steps from it without another copy.
- DeepSpeed's ``BF16_Optimizer`` (bf16 with ``data_types.grad_accum_dtype`` fp32 and ZeRO stage 1) keeps a
  flat fp32 gradient buffer for the whole model and adds each low-precision gradient into it
  (deepspeed/runtime/bf16_optimizer.py ``_update_hp_grad``).

``grad_accumulation="fp32-buffer"`` (``RunConfig.grad_accumulation``) runs that: :class:`Fp32GradBuffers`
gives every trainable parameter a ``main_grad`` (fp32, shaped like the parameter; a DTensor's is a DTensor
with the same placements), zeroes it at the start of each iteration instead of freeing it, adds each
micro-batch's gradient into it and frees the ``.grad`` as soon as it is accumulated. The data-parallel
all-reduce then sums the fp32 buffers (:func:`reduced_gradient`); the optimizer steps from them
(runtime/precision.py ``MixedPrecisionAdamW`` reads ``main_grad``; an fp32 parameter's ``.grad`` is
pointed at its buffer, as Megatron's ``FP32Optimizer`` does). One buffer per parameter rather than one flat
buffer: the bytes are the same but for the flat buffer's alignment padding (a few elements per bucket), and
per-parameter buffers keep a tensor-parallel shard's placement.

Memory per parameter in bf16/fp16 mixed precision: 2 (parameter) + 4 (fp32 gradient) + 4 (master) + 8
(moments) = 18 bytes, Megatron's documented figure for "bf16 parameters, fp32 gradients" without the
distributed optimizer, against 2 + 2 + 12 = 16 with autograd's gradients (ZeRO's count). All 18 persist
between iterations, where autograd's 2 bytes of gradient do not: the static memory grows by 4 bytes per
parameter. In fp32 training the buffer is the fp32 gradient itself, kept: 4 + 4 + 8 = 16 bytes
(Megatron's "fp32 parameters, fp32 gradients").
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import nn

__all__ = ["GradAccumulation", "GRAD_ACCUMULATIONS", "Fp32GradBuffers", "reduced_gradient", "main_grad"]

GradAccumulation = Literal["autograd", "fp32-buffer"]
"""How gradients accumulate over micro-batches: "autograd" (``param.grad`` in the parameter's dtype, freed
between iterations: this runtime's own way) or "fp32-buffer" (a persistent fp32 ``main_grad`` per parameter:
Megatron-LM's and DeepSpeed's BF16_Optimizer's; [Note: fp32 gradient buffers])."""

GRAD_ACCUMULATIONS: tuple[GradAccumulation, ...] = get_args(GradAccumulation)
"""The choices ``RunConfig.grad_accumulation`` accepts."""


def main_grad(p: torch.Tensor) -> torch.Tensor | None:
    """``p``'s persistent fp32 gradient buffer, or None where gradients accumulate in ``p.grad``."""
    buffer: torch.Tensor | None = getattr(p, "main_grad", None)
    return buffer


def _accumulate(p: torch.Tensor) -> None:
    """Post-accumulate-grad hook: add the micro-batch's gradient into the buffer and free it."""
    buffer = main_grad(p)
    if buffer is not None and p.grad is not None:
        buffer.add_(p.grad)
        p.grad = None


def reduced_gradient(p: torch.Tensor) -> torch.Tensor:
    """The gradient a data-parallel all-reduce sums for ``p``: its fp32 buffer if it has one (Megatron and
    DeepSpeed reduce the fp32 buffer), else its ``.grad``, made zeros where this replica produced none."""
    buffer = main_grad(p)
    if buffer is not None:
        return buffer
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


class Fp32GradBuffers(torch.optim.Optimizer):
    """A stage's optimizer whose parameters accumulate their gradients in persistent fp32 buffers.

    Wraps the stage's optimizer (``optim``, as ZeRO-1's wrapper does, so runtime/sharding.py
    ``optimizer_state`` finds its state): makes the buffers, ``zero_grad`` zeroes them as well as freeing
    ``.grad``, and ``step`` lets an fp32 parameter's ``.grad`` be its buffer before stepping (a low-precision
    parameter's optimizer reads ``main_grad`` itself). See [Note: fp32 gradient buffers].

    Args:
        optimizer: the stage's optimizer, built over ``params`` (cast to the low precision already).
        params: the stage's trainable parameters.
        meter: the rank's memory meter; the buffers are filed under "gradients".

    Example:
        >>> m = nn.Linear(4, 2)
        >>> opt = Fp32GradBuffers(torch.optim.AdamW(m.parameters()), list(m.parameters()))
        >>> m(torch.ones(3, 4)).sum().backward()
        >>> m.weight.grad is None, m.weight.main_grad.dtype, float(m.bias.main_grad[0])
        (True, torch.float32, 3.0)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], meter: Any = None) -> None:
        if not params:
            raise ValueError("fp32 gradient buffers need at least one trainable parameter")
        self.optim = optimizer
        self._params = params
        super().__init__(params, {})  # (for the step hooks: runtime/layer_timer.py times step())
        for p in params:
            # plain attribute, as Megatron names it; a DTensor parameter's buffer is a DTensor of its placements
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)  # type: ignore[attr-defined]
            if meter is not None:
                meter.retag(p.main_grad, "gradients")  # type: ignore[attr-defined]
            p.register_post_accumulate_grad_hook(_accumulate)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free ``.grad`` and zero the buffers (Megatron's ``zero_grad_buffer``): they are kept, not freed."""
        self.optim.zero_grad(set_to_none=set_to_none)
        for p in self._params:
            p.grad = None
            p.main_grad.zero_()  # type: ignore[attr-defined]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure: the runtime passes none
        """Step the wrapped optimizer on the buffers' gradients."""
        for p in self._params:
            if p.dtype == torch.float32:
                p.grad = p.main_grad  # type: ignore[attr-defined]  # the same dtype: the buffer is the gradient
        self.optim.step()
        for p in self._params:
            p.grad = None  # (the buffers keep the gradients; a .grad pointing at one would be a second name)
