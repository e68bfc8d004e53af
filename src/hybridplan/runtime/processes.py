"""The real-process backend: spawn one process per device, watch them, end the run on the first failure,
aggregate.

The launcher owns the rendezvous store (a TCPStore on a free port), so ranks never race for a port.
Each rank (runtime/worker.py) writes a small report file and exits with 0 (ok), 1 (failed) or 3 (out of
memory; runtime/result.py). As soon as one rank exits non-zero, dies by a signal, or the run passes its
timeout, the launcher terminates every other rank (SIGTERM, then SIGKILL after a grace period) and
returns the root cause: an out-of-memory report first, else the earliest failure.

If the launcher itself dies (``kill -9``, SIGTERM, a crash), its cleanup never runs: each rank then
sees the launcher's pid exit and ends itself within a moment, and the forkserver, which forked the
ranks, ends with the launcher (runtime/lifeline.py says how and why). A launcher that lives on keeps
its forkserver for its next run.

A CUDA run of more ranks than visible GPUs is run with the GPUs shared (runtime/shared_gpu.py), and the
launcher says so.

Callers go through the front door, :func:`hybridplan.runtime.launch.launch`, which picks this backend
for ``RunConfig.backend == "real"``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.context import ForkServerContext, ForkServerProcess
from pathlib import Path

import torch.distributed as dist

from hybridplan.models.boundaries import boundary_specs
from hybridplan.models.zoo import resolve_model
from hybridplan.runtime.config import RunConfig, validate_config
from hybridplan.runtime.gpu_check import require_gpu
from hybridplan.runtime.scratch import scratch_dir
from hybridplan.runtime.result import (
    RankFailure,
    RankReport,
    RunResult,
    aggregate,
    failed_result,
    report_from_dict,
    root_cause,
)
from hybridplan.runtime.shared_gpu import with_shared_gpu_if_needed
from hybridplan.runtime.worker import spawn_entry

__all__ = ["run_processes"]

_GRACE_S = 2.0
"""Seconds a terminated rank gets to exit after SIGTERM before SIGKILL."""
_SETTLE_S = 0.5
"""Seconds to wait after a failure for ranks failing at the same time (see :func:`_watch`)."""


def run_processes(
    cfg: RunConfig,
    *,
    on_event: Callable[[str], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> RunResult:
    """Train ``cfg.plan`` for ``cfg.iterations`` iterations with one local process per device.

    Args:
        cfg: the run.
        on_event: called with short progress messages (process start, end, failures).
        on_start: called with the process ids of the ranks once they are started.

    Returns:
        The aggregated result; ``status`` is "ok", "oom" or "failed" (never raises for a failed run).

    Raises:
        HybridPlanError: if the configuration itself is invalid, or it is a CUDA run and PyTorch sees no GPU here
            (nothing is started then).
    """
    validate_config(cfg)
    if cfg.device_type == "cuda":  # before any rank starts, each to fail at its first CUDA call
        require_gpu("the run")
    # More ranks than GPUs: share them (runtime/shared_gpu.py), said even to a caller that asked for no events.
    cfg = with_shared_gpu_if_needed(cfg, say=on_event or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    specs = boundary_specs(resolve_model(cfg.model))
    say = on_event or (lambda _msg: None)
    world = cfg.plan.num_devices
    ctx = _context()
    me = os.getpid()  # the ranks end when this process does, however it ends (runtime/lifeline.py)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    started = time.perf_counter()
    with scratch_dir("run") as report_dir:  # a killed launcher's folder is removed by the next one
        procs = [
            ctx.Process(target=spawn_entry, args=(rank, world, cfg, store.port, report_dir, me, specs), daemon=True)
            for rank in range(world)
        ]
        try:
            for p in procs:
                p.start()
            say(f"started {world} processes")
            if on_start is not None:
                on_start([p.pid for p in procs if p.pid is not None])
            outcome = _watch(procs, deadline=started + cfg.timeout_s)
        finally:
            _terminate(procs)
        wall = time.perf_counter() - started
        reports = [_read_report(Path(report_dir) / f"rank{r}.json") for r in range(world)]
    if outcome == "timeout":
        running = [r for r, rep in enumerate(reports) if rep is None]
        return failed_result(cfg, "failed", f"timed out after {cfg.timeout_s:.0f} s (ranks still running: {running})", wall)
    if isinstance(outcome, list):
        return root_cause(cfg, reports, wall, failed=outcome, crashed=lambda rank: _how_it_ended(procs[rank]))
    finished = [rep for rep in reports if isinstance(rep, RankReport)]
    if len(finished) < world:  # every rank exited 0, so each wrote a finished report: a guard, not a case
        missing = [r for r, rep in enumerate(reports) if not isinstance(rep, RankReport)]
        return failed_result(cfg, "failed", f"devices {missing} exited with code 0 without a report", wall)
    return aggregate(cfg, finished, wall_seconds=wall)


def _context() -> ForkServerContext:
    """A forkserver that has imported torch once: each rank starts in ~0.1 s instead of re-importing it.

    The server process is single-threaded when it forks (it only imported modules), which is what makes
    forking after importing torch safe; it lives as long as this process, so later runs reuse it. It is
    the ranks' parent, not this process: see [Note: ranks are the forkserver's children] in
    runtime/lifeline.py for how ranks and server still end with this process.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.distributed.tensor", "hybridplan.runtime.worker"])
    return ctx


def _watch(procs: list[ForkServerProcess], *, deadline: float) -> list[int] | str | None:
    """Wait until all ranks exit 0 (None), some fail (their ranks, in the order seen), or the deadline
    passes ("timeout").

    After the first failure, waits a moment more so that ranks failing at the same time (e.g. the
    peers of a crashed rank) are told apart from those the launcher terminates.
    """
    pending = {p.sentinel: r for r, p in enumerate(procs)}
    failed: list[int] = []
    while pending:
        left = deadline - time.perf_counter()
        if left <= 0:
            return failed or "timeout"
        ready = wait(list(pending), timeout=min(left, 1.0 if not failed else _SETTLE_S))
        if not ready and failed:
            return failed
        for sentinel in ready:
            if not isinstance(sentinel, int):  # wait() returns the sentinels it was given
                raise RuntimeError(f"wait() returned {sentinel!r}, not a process sentinel")
            rank = pending.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                failed.append(rank)
    return failed or None


def _terminate(procs: list[ForkServerProcess]) -> None:
    """End every rank still running: SIGTERM, then SIGKILL after :data:`_GRACE_S`."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    end = time.perf_counter() + _GRACE_S
    for p in alive:
        p.join(max(0.0, end - time.perf_counter()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join()


def _read_report(path: Path) -> RankReport | RankFailure | None:
    """The report a rank wrote, or None if it wrote none (still running, or died first)."""
    try:
        return report_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError):  # json.JSONDecodeError is a ValueError
        return None


def _how_it_ended(proc: ForkServerProcess) -> tuple[str, int | None]:
    """How a rank that left no report ended, for :func:`~hybridplan.runtime.result.root_cause`."""
    code = proc.exitcode
    if code is None:  # _watch joined every rank it reports as failed
        raise RuntimeError("a rank reported as failed is still running")
    return (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"), code
