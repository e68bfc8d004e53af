"""Measure the links the runtime uses: per-message latency and bandwidth of its own backend between two of
its own processes (``hybridplan profile --time``; the time model's Hockney terms, predict/communication.py).

Two ranks are started exactly as a run starts them (runtime/processes.py: the same forkserver, rendezvous
store, lifeline and process-group backend: gloo on CPU, NCCL on CUDA), and each times, after a warm-up:

- ``allreduce``: back-to-back all-reduces of a tensor of :data:`SMALL_BYTES` and of :data:`LARGE_BYTES`,
  through :func:`hybridplan.collectives.all_reduce` as the executor's gradient sync calls it (runtime/executor.py);
- ``p2p``: ping-pong round trips (rank 0 sends, rank 1 receives and sends back) of the same two sizes with
  ``dist.isend``/``dist.irecv``, as runtime/shared_gpu.py posts the pipeline's transfers.

Each number is the median over :data:`REPEATS` timed loops of :data:`CALLS` calls (a collective synchronises
the two ranks, so a loop times the calls themselves; the median drops the loops another process disturbed).
What the numbers mean (Hockney's model, ``T = alpha + n / beta``) is worked out by
:func:`hybridplan.profiling.links.link_costs`; this module only measures seconds.

CPU timings here, as every CPU timing of this project, are disturbed by whatever else runs on the host.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hybridplan.runtime.scratch import scratch_dir

__all__ = ["SMALL_BYTES", "LARGE_BYTES", "CALLS", "REPEATS", "probe_links"]

SMALL_BYTES = 4
"""One fp32 element: a message whose time is all latency."""

LARGE_BYTES = 4 * 2**20
"""4 MiB: gpt-tiny's largest parameter tensor (the 1024 x 256 embedding, 1 MiB) and its boundary activation
(32 x 128 x 256 fp32, 4 MiB) are of this order, so the bandwidth is measured where the runtime sends."""

CALLS = 20
"""Calls per timed loop."""

REPEATS = 5
"""Timed loops per size; the median is kept."""

_WARMUP = 5
"""Untimed calls first: gloo and NCCL connect lazily on the first message to a peer."""


def _timed(fn: Any, sync: Any) -> float:
    """Median seconds of one call of ``fn`` over :data:`REPEATS` loops of :data:`CALLS` calls."""
    for _ in range(_WARMUP):
        fn()
    sync()
    loops = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        sync()
        loops.append((time.perf_counter() - start) / CALLS)
    return float(statistics.median(loops))


def _wait(work: Any) -> None:
    if work is not None:  # None only for a rank outside the group; the default group holds both
        work.wait()


def _measure(rank: int, device: torch.device) -> dict[str, float]:
    from hybridplan import collectives

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    out: dict[str, float] = {}
    for name, nbytes in (("small", SMALL_BYTES), ("large", LARGE_BYTES)):
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        out[f"allreduce_{name}_s"] = _timed(lambda: collectives.all_reduce(t), sync)

        def ping_pong(t: torch.Tensor = t) -> None:
            if rank == 0:
                _wait(dist.isend(t, dst=1))
                _wait(dist.irecv(t, src=1))
            else:
                _wait(dist.irecv(t, src=0))
                _wait(dist.isend(t, dst=0))

        out[f"roundtrip_{name}_s"] = _timed(ping_pong, sync)
    return out


def _entry(rank: int, device_type: str, store_port: int, out_dir: str, launcher_pid: int, timeout_s: float) -> None:
    """A probe rank: join the group as a run's rank does, measure, write ``rank<N>.json``, exit."""
    from hybridplan.runtime.lifeline import tie_to_launcher
    from hybridplan.runtime.rank import process_group_backend, process_group_device

    tie_to_launcher(launcher_pid)
    torch.set_num_threads(1)
    code = 0
    try:
        store = dist.TCPStore("127.0.0.1", store_port, 3, is_master=False, timeout=timedelta(seconds=timeout_s))
        if device_type == "cuda":
            torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
            device = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        else:
            device = torch.device("cpu")
        dist.init_process_group(process_group_backend(device_type), store=store, rank=rank, world_size=2,  # type: ignore[arg-type]
                                timeout=timedelta(seconds=timeout_s), device_id=process_group_device(device))
        result: dict[str, Any] = {"backend": dist.get_backend(), **_measure(rank, device)}
    except BaseException as exc:  # the launcher must learn why
        result = {"error": f"{type(exc).__name__}: {exc}"}
        code = 1
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as runtime/worker.py: gloo's destructors may block on a peer that is gone


def probe_links(device_type: str = "cpu", *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Measure the backend between two local processes (module docstring).

    Returns:
        ``{"backend", "processes": 2, "small_bytes", "large_bytes", "allreduce_small_s", "allreduce_large_s",
        "roundtrip_small_s", "roundtrip_large_s"}``: seconds per call, the slower rank's.

    Raises:
        RuntimeError: if a rank failed, the probe passed ``timeout_s`` (its message says which), or CUDA has fewer
            than two GPUs.
    """
    from hybridplan.runtime.processes import _context, _terminate, _watch

    if device_type == "cuda" and torch.cuda.device_count() < 2:
        # two ranks on one GPU cannot form an NCCL group (runtime/shared_gpu.py); gloo there is not NCCL's link
        raise RuntimeError(f"measuring NCCL's links needs 2 GPUs, {torch.cuda.device_count()} visible")
    ctx = _context()
    me = os.getpid()
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    with scratch_dir("links") as out_dir:
        procs = [ctx.Process(target=_entry, args=(r, device_type, store.port, out_dir, me, timeout_s), daemon=True)
                 for r in range(2)]
        try:
            for p in procs:
                p.start()
            outcome = _watch(procs, deadline=time.perf_counter() + timeout_s)
        finally:
            _terminate(procs)
        reports = []
        for r in range(2):
            path = Path(out_dir, f"rank{r}.json")
            reports.append(json.loads(path.read_text()) if path.exists() else {"error": "no report"})
    if outcome is not None:
        why = "timed out" if outcome == "timeout" else "; ".join(f"rank {r}: {reports[r].get('error')}" for r in range(2))
        raise RuntimeError(f"the link probe failed: {why}")
    keys = ("allreduce_small_s", "allreduce_large_s", "roundtrip_small_s", "roundtrip_large_s")
    return {"backend": reports[0]["backend"], "processes": 2, "small_bytes": SMALL_BYTES, "large_bytes": LARGE_BYTES,
            **{k: max(float(rep[k]) for rep in reports) for k in keys}}
