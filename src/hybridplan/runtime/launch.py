"""Run a plan: spawn one process per device, watch them, end the run on the first failure, aggregate.

The launcher owns the rendezvous store (a TCPStore on a free port), so ranks never race for a port.
Each rank writes a small report file and exits with 0 (ok), 1 (failed) or 3 (out of memory). As soon
as one rank exits non-zero, dies by a signal, or the run passes its timeout, the launcher terminates
every other rank (SIGTERM, then SIGKILL after a grace period) and returns the root cause: an
out-of-memory report first, else the earliest failure.

If the launcher itself dies (``kill -9``, SIGTERM, a crash), its cleanup never runs: each rank then
sees the launcher's pid exit and ends itself within a moment, and the forkserver, which forked the
ranks, ends with the launcher (runtime/lifeline.py says how and why). A launcher that lives on keeps
its forkserver for its next run.

``RunConfig.backend == "sim"`` runs no process: :func:`launch` hands the run to the simulator
(runtime/sim.py), which executes every device's work on fake tensors in this process.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.result import DeviceResult, RunResult
from hybridplan.runtime.stage import boundary_specs
from hybridplan.runtime.worker import EXIT_OOM, resolve_model, spawn_entry

__all__ = ["launch", "aggregate", "validate_config", "BACKENDS"]

BACKENDS: tuple[str, ...] = ("real", "sim")
"""Runtime backends: real processes, or simulated devices on fake tensors (runtime/sim.py)."""

_GRACE_S = 2.0
_SETTLE_S = 0.5
_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "pair.cc")


def validate_config(cfg: RunConfig) -> None:
    """Check the plan against the model and cluster before starting any process.

    Raises:
        HybridPlanError: (PlanError, ModelError, ClusterError) naming the problem and the fix.
    """
    from hybridplan.errors import UsageError
    from hybridplan.runtime.precision import check_precision

    model = resolve_model(cfg.model)
    cfg.plan.validate(model=model, cluster=cfg.cluster)
    if cfg.iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {cfg.iterations}")
    if cfg.device_type not in ("cpu", "cuda"):
        raise UsageError(f"device type {cfg.device_type!r} is not supported", fix="use 'cpu' or 'cuda'")
    if cfg.backend not in BACKENDS:
        raise UsageError(f"backend {cfg.backend!r} is not supported", fix=f"use one of {list(BACKENDS)}")
    check_precision(cfg.precision, cfg.loss_scale)
    if cfg.layer_timing and cfg.backend != "real":
        raise UsageError(
            f"layer timing needs real devices, but the backend is {cfg.backend!r}: fake tensors take no time",
            fix="time layers with backend 'real'",
        )


def launch(
    cfg: RunConfig,
    *,
    on_event: Callable[[str], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> RunResult:
    """Train ``cfg.plan`` for ``cfg.iterations`` iterations with one local process per device, or
    simulate it in this process if ``cfg.backend == "sim"``.

    Args:
        cfg: the run.
        on_event: called with short progress messages (process start, end, failures).
        on_start: called with the process ids of the ranks once they are started (not for "sim").

    Returns:
        The aggregated result; ``status`` is "ok", "oom" or "failed" (never raises for a failed run).

    Raises:
        HybridPlanError: if the configuration itself is invalid (nothing is started then).
    """
    if cfg.backend == "sim":
        from hybridplan.runtime.sim import simulate

        return simulate(cfg, on_event=on_event)  # validates the configuration itself
    validate_config(cfg)
    specs = boundary_specs(resolve_model(cfg.model))
    say = on_event or (lambda _msg: None)
    world = cfg.plan.num_devices
    ctx = _context()
    me = os.getpid()  # the ranks end when this process does, however it ends (runtime/lifeline.py)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hybridplan-run-") as report_dir:
        procs = [
            ctx.Process(target=spawn_entry, args=(rank, world, cfg, store.port, report_dir, me, specs), daemon=True)
            for rank in range(world)
        ]
        try:
            for p in procs:
                p.start()
            say(f"started {world} processes")
            if on_start is not None:
                on_start([p.pid for p in procs])
            outcome = _watch(procs, deadline=started + cfg.timeout_s)
        finally:
            _terminate(procs)
        wall = time.perf_counter() - started
        reports = [_read_report(Path(report_dir) / f"rank{r}.json") for r in range(world)]
    if outcome == "timeout":
        running = [r for r, rep in enumerate(reports) if rep is None]
        return _failed(cfg, "failed", f"timed out after {cfg.timeout_s:.0f} s (ranks still running: {running})", wall)
    if outcome is not None:
        return _root_cause(cfg, procs, reports, wall, failed=list(outcome))
    return aggregate(cfg, reports, wall_seconds=wall)


def _context() -> Any:
    """A forkserver that has imported torch once: each rank starts in ~0.1 s instead of re-importing it.

    The server process is single-threaded when it forks (it only imported modules), which is what makes
    forking after importing torch safe; it lives as long as this process, so later runs reuse it. It is
    the ranks' parent, not this process: see [Note: ranks are the forkserver's children] in
    runtime/lifeline.py for how ranks and server still end with this process.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.distributed.tensor", "hybridplan.runtime.worker"])
    return ctx


def _watch(procs: list[Any], *, deadline: float) -> list[int] | str | None:
    """Wait until all ranks exit 0 (None), some fail (their ranks, in the order seen), or the deadline passes.

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
            rank = pending.pop(sentinel)
            procs[rank].join()
            if procs[rank].exitcode != 0:
                failed.append(rank)
    return failed or None


def _terminate(procs: list[Any]) -> None:
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


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _failed(cfg: RunConfig, status: str, reason: str, wall: float) -> RunResult:
    return RunResult(
        status=status,
        reason=reason,
        iteration_seconds=None,
        losses=[],
        devices=[],
        config=cfg.describe(),
        plan=cfg.plan.to_dict(),
        wall_seconds=wall,
    )


def _root_cause(
    cfg: RunConfig, procs: list[Any], reports: list[dict[str, Any] | None], wall: float, *, failed: list[int]
) -> RunResult:
    """The failure to report, from the ranks that ended badly before the launcher stopped the rest.

    In order: an out-of-memory report (it makes its peers fail too); a rank that died without a report
    (a crash: its peers then see closed connections); a failure report that is not merely a peer's
    lost connection; any failure report.
    """
    mine = [r for r in failed if reports[r] is not None]
    ooms = [reports[r] for r in mine if reports[r]["status"] == "oom"]
    if ooms:
        return _from_report(cfg, min(ooms, key=lambda r: r["time"]), wall)
    crashed = [r for r in failed if reports[r] is None]
    if crashed:
        rank = crashed[0]
        code = procs[rank].exitcode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        status = "oom" if code == EXIT_OOM else "failed"
        return _failed(cfg, status, f"device {rank} (stage {cfg.plan.stage_of_device(rank)}) {how} without a report", wall)
    causes = [reports[r] for r in mine if not any(c in reports[r]["reason"] for c in _CONSEQUENCES)]
    return _from_report(cfg, min(causes or [reports[r] for r in mine], key=lambda r: r["time"]), wall)


def _from_report(cfg: RunConfig, report: dict[str, Any], wall: float) -> RunResult:
    rank = report["rank"]
    stage = cfg.plan.stage_of_device(rank)
    reason = report["reason"].replace(f"device {rank}:", f"device {rank} (stage {stage}):", 1)
    return _failed(cfg, report["status"], reason, wall)


def aggregate(cfg: RunConfig, reports: list[dict[str, Any] | None], *, wall_seconds: float | None) -> RunResult:
    """Combine per-rank reports into the run result.

    A simulated run's reports carry no losses and no meaningful times: its result has ``losses == []``
    and ``iteration_seconds`` None.
    """
    plan = cfg.plan
    last = plan.stages[-1]
    owners = list(last.devices) if last.parallelism == "data" else [last.devices[0]]
    losses: list[float] = []
    if all(len(reports[r]["losses"]) == cfg.iterations for r in owners):
        losses = [sum(reports[r]["losses"][it] for r in owners) for it in range(cfg.iterations)]
    measured = range(1, cfg.iterations) if cfg.iterations > 1 else range(cfg.iterations)
    iteration_seconds = None
    if cfg.backend != "sim":
        iteration_seconds = statistics.fmean(max(rep["seconds"][it] for rep in reports) for it in measured)
    devices = []
    for rep in reports:
        peaks = rep["iteration_peaks"]
        peak = best = None
        if peaks:
            best = max(measured, key=lambda it: peaks[it])
            peak = peaks[best]
        devices.append(
            DeviceResult(
                device=rep["rank"],
                stage=rep["stage"],
                peak_memory_bytes=peak,
                node=rep["node"],
                rank_in_stage=rep["rank_in_stage"],
                static_memory_bytes=rep["static"][-1] if rep["static"] else None,
                data_bytes=rep["data"][-1] if rep["data"] else None,
                peak_breakdown={k: v for k, v in rep["breakdowns"][best].items() if v} if best is not None else {},
                iteration_peaks=peaks,
                in_flight=rep["in_flight"],
                iteration_seconds=rep["seconds"],
                timeline=rep["timeline"],
                overhead_bytes=rep.get("overhead_bytes"),
                layer_seconds=rep.get("layer_seconds", []),
            )
        )
    return RunResult(
        status="ok",
        reason=None,
        iteration_seconds=iteration_seconds,
        losses=losses,
        devices=devices,
        config=cfg.describe(),
        plan=plan.to_dict(),
        wall_seconds=wall_seconds,
    )
