"""Collectives whose tensors live exactly as long as the Python program holds them.

[Note: gloo keeps tensors alive] ProcessGroupGloo runs a collective on a worker thread that releases its
reference to the tensors a moment AFTER ``wait()`` has returned. If the program drops its own last
reference in that window (autograd does, right after a backward function returns), the storage is
freed on gloo's thread at a time that varies from run to run, and the measured peak memory with it
(measured: +-16 KiB on a 2-way tensor-parallel stage of gpt-tiny in 2 of 6 runs).

On CPU these functions therefore never hand the caller's tensor to gloo: they copy it into a
persistent scratch buffer (one per shape, dtype and group), run the collective there, and copy the
result back. The caller's tensor then dies on the main thread, deterministically. The scratch buffer
is an artefact of running on gloo, not memory of the program: it is created, filled and read with the
dispatch modes (memory trackers) disabled, so no tracker ever counts it (a tracker that saw ``copy_``
return it would count it from its first use to the end of the process). On GPU, and on fake tensors
(simulated devices, runtime/sim.py), the tensor goes to the collective directly: the CUDA caching
allocator's own accounting is what ``max_memory_allocated`` reports, and a fake collective does nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["all_reduce", "all_gather_into_tensor"]

_scratch: dict[tuple[Any, ...], torch.Tensor] = {}


def _buffer(shape: torch.Size, dtype: torch.dtype, tag: tuple[Any, ...]) -> torch.Tensor:
    """The scratch buffer for ``tag``; call with the dispatch modes disabled."""
    key = (tuple(shape), dtype, *tag)
    buf = _scratch.get(key)
    if buf is None:
        buf = torch.empty(shape, dtype=dtype)
        _scratch[key] = buf
    return buf


def _direct(t: torch.Tensor) -> bool:
    return t.device.type != "cpu" or _is_fake(t)


def _is_fake(t: torch.Tensor) -> bool:
    return type(t).__name__ == "FakeTensor"


def all_reduce(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum ``t`` over ``group`` in place and return it."""
    if _direct(t):
        dist.all_reduce(t, group=group)
        return t
    with _disable_current_modes():  # not program memory: invisible to memory trackers
        buf = _buffer(t.shape, t.dtype, ("all_reduce", id(group)))
        buf.copy_(t)
        dist.all_reduce(buf, group=group)
        t.copy_(buf)
    return t


# torch 2.13 deprecates all_gather_into_tensor (a FutureWarning on every call) for all_gather_single, the
# same collective; older versions have only the former.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Concatenate every rank's ``t`` along dim 0 into ``out`` and return ``out``."""
    if _direct(t):
        _all_gather(out, t, group=group)
        return out
    with _disable_current_modes():  # not program memory: invisible to memory trackers
        src = _buffer(t.shape, t.dtype, ("gather_src", id(group)))
        dst = _buffer(out.shape, out.dtype, ("gather_dst", id(group)))
        src.copy_(t)
        _all_gather(dst, src, group=group)
        out.copy_(dst)
    return out
