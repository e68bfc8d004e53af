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
A process whose GPU other ranks share runs on gloo (runtime/shared_gpu.py): :func:`stage_through_host`
then gives its GPU tensors the CPU path, with a pinned host buffer, so that gloo never holds them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["all_reduce", "all_gather_into_tensor", "stage_through_host"]

_scratch: dict[tuple[Any, ...], torch.Tensor] = {}
_host_staging = False
"""Whether GPU tensors go through a host scratch buffer too (:func:`stage_through_host`)."""


def stage_through_host(enabled: bool) -> None:
    """Give this process's GPU tensors the CPU path (a host scratch buffer), or not (the default: straight
    to the collective). For a rank whose process group is gloo on a GPU other ranks share."""
    global _host_staging
    _host_staging = enabled


def _buffer(shape: torch.Size, dtype: torch.dtype, tag: tuple[Any, ...], pinned: bool = False) -> torch.Tensor:
    """The scratch buffer for ``tag`` (in pinned host memory for a GPU tensor); call with the dispatch
    modes disabled."""
    key = (tuple(shape), dtype, *tag)
    buf = _scratch.get(key)
    if buf is None:
        buf = torch.empty(shape, dtype=dtype, pin_memory=pinned)
        _scratch[key] = buf
    return buf


def _direct(t: torch.Tensor) -> bool:
    return _is_fake(t) or (t.device.type != "cpu" and not _host_staging)


def _is_fake(t: torch.Tensor) -> bool:
    return type(t).__name__ == "FakeTensor"


def all_reduce(t: torch.Tensor, group: Any = None, op: Any = None) -> torch.Tensor:
    """Reduce ``t`` over ``group`` in place (``op``: ``dist.ReduceOp``, the sum by default) and return it."""
    op = dist.ReduceOp.SUM if op is None else op
    if _direct(t):
        dist.all_reduce(t, op=op, group=group)
        return t
    with _disable_current_modes():  # not program memory: invisible to memory trackers
        buf = _buffer(t.shape, t.dtype, ("all_reduce", id(group)), pinned=t.is_cuda)
        buf.copy_(t)
        dist.all_reduce(buf, op=op, group=group)
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
        src = _buffer(t.shape, t.dtype, ("gather_src", id(group)), pinned=t.is_cuda)
        dst = _buffer(out.shape, out.dtype, ("gather_dst", id(group)), pinned=t.is_cuda)
        src.copy_(t)
        _all_gather(dst, src, group=group)
        out.copy_(dst)
    return out
