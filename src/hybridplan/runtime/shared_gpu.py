"""Several ranks on one GPU: a testing and profiling mode (``RunConfig.share_gpu``, ``--share-gpu``).

A multi-stage plan needs a rank per device, and the real runtime gives every rank its own GPU. On a
machine with fewer GPUs than ranks this mode runs the plan anyway, one process per rank as always, so that
a plan's numerics and each rank's device memory can be checked on a one-GPU machine. Measured on an H100
(../shared/notes/gpu-h100-facts.md, "Several ranks on one GPU"):

- NCCL refuses two ranks on one GPU ("Duplicate GPU detected" at the first collective), so every process
  group is gloo (runtime/rank.py ``process_group_backend``);
- gloo does all_reduce, broadcast, all_gather(_into_tensor) and reduce_scatter_tensor on CUDA tensors, but
  a send or receive of a CUDA tensor aborts the sender ("writev: Bad address"), so the point-to-point
  transfers between stages are staged through host memory (:func:`isend` and :func:`receive_into`): the
  rows are copied into a host buffer, sent and received on gloo, and copied back to the device;
- the collectives of hybridplan's own layers (hybridplan/collectives.py: tensor-parallel all-reduces and
  all-gathers, the data-parallel gradient sum) go through a host scratch buffer too
  (``collectives.stage_through_host``), as they do on CPU, so the caller's device tensor never reaches
  gloo and is freed when the program drops it ([Note: gloo keeps tensors alive]); PyTorch's own
  collectives (DTensor's, FSDP2's, ``ZeroRedundancyOptimizer``'s broadcasts) run on gloo with the CUDA
  tensors, which it supports.

What each rank measures stays its own: every rank is its own process with its own CUDA caching allocator,
so ``max_memory_allocated`` is that rank's peak. The staging buffers are host memory (pinned on a GPU),
which the device allocator never counts; on CPU (where the mode stages all the same, which is how its
code is tested) they are made with the dispatch modes disabled, so the exact tracker (runtime/memory.py)
never sees them either, and a rank's peak equals the one of the unstaged path byte for byte. The memory
used outside the allocator (``total - free - reserved``) is the GPU's, shared by all ranks, so it is not
reported per device in this mode. Iteration times are not representative (the ranks take turns on one GPU
and every transfer crosses the host): a result marks them so (``iteration_seconds_representative``).

A CUDA run whose plan has more ranks than visible GPUs turns the mode on by itself
(:func:`with_shared_gpu_if_needed`, called by the launcher), and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.result import SHARED_GPU_NOTE

__all__ = ["isend", "receive_into", "needs_shared_gpu", "with_shared_gpu_if_needed"]



def _host_like(t: torch.Tensor) -> torch.Tensor:
    """An empty host tensor of ``t``'s shape and dtype: pinned when ``t`` is on a GPU (copies to and from
    pinned memory need no bounce buffer in the driver)."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.device.type == "cuda")


def isend(piece: torch.Tensor, dst: int, tag: int, *, staged: bool) -> tuple[Any, Any]:
    """Post the send of ``piece`` to rank ``dst``; return ``(work, keep)``: wait on ``work``, and hold
    ``keep`` until then (the caller's ``piece`` and, when ``staged``, the host copy gloo reads from).

    ``staged``: copy ``piece`` to a host buffer first (synchronously) and send that; the buffer is not
    program memory, so no memory tracker sees it. Holding ``piece`` as the unstaged path does keeps the
    device memory the same on both paths.
    """
    if not staged:
        return dist.isend(piece, dst=dst, tag=tag), piece
    with _disable_current_modes():  # host staging: invisible to memory trackers
        host = _host_like(piece)
        host.copy_(piece)
        work = dist.isend(host, dst=dst, tag=tag)
    return work, (piece, host)


def receive_into(buf: torch.Tensor, parts: list[tuple[int, int, int]], tag: int, *, staged: bool) -> None:
    """Receive rows ``[start, stop)`` of ``buf`` from rank ``src`` for every ``(start, stop, src)`` in
    ``parts`` (posted together, then waited for).

    ``staged``: receive into a host buffer of ``buf``'s shape and copy it to ``buf`` at the end.
    """
    if not staged:
        _receive_all(buf, parts, tag)
        return
    with _disable_current_modes():  # host staging: invisible to memory trackers
        host = _host_like(buf)
        _receive_all(host, parts, tag)
        buf.copy_(host)


def _receive_all(buf: torch.Tensor, parts: list[tuple[int, int, int]], tag: int) -> None:
    works = [dist.irecv(buf[start:stop], src=src, tag=tag) for start, stop, src in parts]
    for w in works:
        if w is not None:  # None only for a rank outside the group, and the default group holds every rank
            w.wait()


def needs_shared_gpu(ranks: int, gpus: int) -> bool:
    """Whether ``ranks`` processes need to share GPUs when ``gpus`` are visible (none visible: no GPU run
    at all, which fails elsewhere with CUDA's own message)."""
    return 0 < gpus < ranks


def with_shared_gpu_if_needed(cfg: RunConfig, *, gpus: int | None = None,
                              say: Callable[[str], None] | None = None) -> RunConfig:
    """``cfg`` with the mode on when it is a real CUDA run of more ranks than visible GPUs (``gpus``; default
    ``torch.cuda.device_count()``), said through ``say`` in capitals; else ``cfg`` unchanged.

    Without the mode such a run would fail at its first collective after 12-16 s (NCCL's "Duplicate GPU
    detected"); with it, it trains and measures each rank's memory, and its times say they are not
    representative.
    """
    if cfg.share_gpu or cfg.backend != "real" or cfg.device_type != "cuda":
        return cfg
    visible = torch.cuda.device_count() if gpus is None else gpus
    ranks = cfg.plan.num_devices
    if not needs_shared_gpu(ranks, visible):
        return cfg
    if say is not None:
        say(f"NOTE: the plan has {ranks} ranks and {visible} GPU{'s' if visible > 1 else ''} {'are' if visible > 1 else 'is'}"
            f" visible: SHARED-GPU MODE IS ON ({SHARED_GPU_NOTE}). Pass --share-gpu to ask for it explicitly.")
    return replace(cfg, share_gpu=True)
