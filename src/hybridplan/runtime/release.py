"""Dropping the values of a stage output once it is sent, keeping its autograd edge.

[Note: releasing the stage output] After its rows are sent, a stage's output is needed only for its
autograd edge, not its values (unless its producer saved it for backward). Like Megatron-LM's
``deallocate_output_tensor`` the executor drops the values and keeps the edge
(``torch.autograd.graph.get_gradient_edge``), so a micro-batch in flight costs its saved activations,
not also its output. Sends are asynchronous; the memory tracker stops counting a sent buffer when the
executor drops it (see runtime/memory.py).

Storages are compared by identity (``untyped_storage()._cdata``), not by data pointer: a fake tensor
(runtime/sim.py) has no data pointer, and identity is what "the same storage" means.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["release_output", "is_fake", "same_storage"]


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``FakeTensor`` (shape and dtype only: a simulated run)."""
    return type(t).__name__ == "FakeTensor"


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share one storage."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _saved_by_producer(y: torch.Tensor) -> bool:
    """Whether ``y``'s producing autograd node saved ``y``'s storage for its backward."""
    for name in dir(y.grad_fn):
        if not name.startswith("_saved_"):
            continue
        saved = getattr(y.grad_fn, name)
        items = saved if isinstance(saved, (tuple, list)) else (saved,)
        if any(isinstance(item, torch.Tensor) and same_storage(item, y) for item in items):
            return True
    return False


def release_output(y: torch.Tensor, x: torch.Tensor, meter: Any, *, checkpointed: bool = False) -> None:
    """Drop a sent stage output's values if nothing else needs them.

    Args:
        y: the stage's output (already sent).
        x: the stage's input (an identity stage returns it: then nothing is released).
        meter: the memory meter, told to stop counting the values.
        checkpointed: the stage's last layer runs under activation checkpointing, whose saved tensors are
            placeholders (reading one would recompute the layer); nothing in the region keeps ``y``
            then, so it is released without looking. Under the selective policy (runtime/checkpointing.py) the
            region keeps the outputs of its kept operations too, and none of them is a block's last: the zoo's and
            the HuggingFace blocks end with a residual sum or an activation.
    """
    if y._base is not None or y.grad_fn is None or same_storage(x, y):
        return
    if not checkpointed and _saved_by_producer(y):
        return
    old = y.detach()
    y.data = torch.empty((0,), dtype=y.dtype, device=y.device)
    meter.forget(old)
