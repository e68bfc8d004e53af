"""The outcome of a run: what each rank reports, and the run's result (status, losses, iteration time,
per-device peak memory); how the launcher combines the first into the second.

A rank ends with one report: a :class:`RankReport` if it trained every iteration, else a
:class:`RankFailure`; and with an exit code (:data:`EXIT_OK`, :data:`EXIT_FAILED`, :data:`EXIT_OOM`, or
:data:`EXIT_LAUNCHER_GONE` when it ended itself because its launcher died). Reports travel as JSON: in a
file per rank to the local launcher (runtime/processes.py), through ``all_gather_object`` to rank 0 under
torchrun (runtime/torchrun.py); the simulator (runtime/sim.py) makes them in process. :func:`aggregate`
turns one finished report per rank into the :class:`RunResult`; :func:`failed_result` is the result of a
run that failed.

JSON form of a result (other tools rely on these keys; more are added)::

    {"status": "ok" | "oom" | "failed", "reason": str | null, "iteration_seconds": float | null,
     "losses": [float, ...],
     "devices": [{"device": 0, "stage": 0, "peak_memory_bytes": int, ...}, ...]}

A simulated run (``backend="sim"``) has the same form with ``iteration_seconds`` null and no losses. A run
whose ranks shared a GPU (runtime/shared_gpu.py) has ``"iteration_seconds_representative": false`` and
``config.share_gpu`` true; its summary says so.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from hybridplan.errors import HybridPlanError
from hybridplan.units import format_bytes

if TYPE_CHECKING:
    from hybridplan.runtime.config import RunConfig

__all__ = [
    "DeviceResult",
    "RunResult",
    "STATUSES",
    "RankReport",
    "RankFailure",
    "FailureStatus",
    "report_from_dict",
    "aggregate",
    "failed_result",
    "root_cause",
    "save_report",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_OOM",
    "EXIT_LAUNCHER_GONE",
    "SHARED_GPU_NOTE",
]

SHARED_GPU_NOTE = ("several ranks share one GPU (--share-gpu): gloo process groups, transfers staged through host"
                   " memory; per-device peaks are each rank's own, iteration times are NOT representative")
"""What the output says of a run in the shared-GPU mode (runtime/shared_gpu.py)."""

STATUSES = ("ok", "oom", "failed")

EXIT_OK = 0
"""Exit code of a rank that trained every iteration and wrote its :class:`RankReport`."""
EXIT_FAILED = 1
"""Exit code of a rank that failed (any exception but running out of memory) and wrote its :class:`RankFailure`."""
EXIT_OOM = 3
"""Exit code of a rank that ran out of device memory; also read from a rank that died without a report."""
EXIT_LAUNCHER_GONE = 4
"""Exit code of a rank ended because its launcher died (runtime/lifeline.py; no one reads it: the launcher is gone)."""

_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "pair.cc")
"""gloo's messages of a rank whose peer went away: a consequence of another rank's failure, not a cause."""

FailureStatus = Literal["oom", "failed"]
"""How a rank failed: out of device memory, or anything else."""


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """What one rank measured over a run it finished (runtime/rank.py ``run_rank``).

    Per-iteration lists run warm-up first. The memory lists are empty when memory is not tracked.
    """

    status: ClassVar[str] = "ok"
    rank: int
    """The device index."""
    stage: int
    """Index of the rank's stage in the plan."""
    rank_in_stage: int
    """Position of the rank among its stage's devices."""
    node: int
    """The node (machine) the device is on."""
    in_flight: int
    """Most micro-batches alive at once on this rank under the schedule."""
    iteration_peaks: list[int]
    """Peak tensor bytes of every iteration."""
    static: list[int]
    """Live bytes at the start of every iteration (parameters, optimizer state, buffers)."""
    data: list[int]
    """Bytes of the rank's share of the batch in every iteration."""
    breakdowns: list[dict[str, int]]
    """Bytes per category at every iteration's peak (runtime/memory.py CATEGORIES)."""
    seconds: list[float]
    """Wall time of every iteration (a simulated rank: the simulation's own time)."""
    losses: list[float]
    """The rank's weighted share of every iteration's loss (0 off the last stage); empty when simulated."""
    timeline: list[dict[str, Any]]
    """Per action of the last iteration: ``{"action", "before", "peak", "after"}`` bytes."""
    overhead_bytes: int | None
    """GPU memory outside the caching allocator (runtime/gpu_memory.py): measured on a real CUDA device,
    modelled on a simulated one; None on a CPU."""
    layer_seconds: list[dict[str, list[list[float]]]]
    """With ``RunConfig.layer_timing``: per iteration, per-layer seconds of every micro-batch; else empty."""
    reserved_peaks: list[int] = field(default_factory=list)
    """CUDA only (real or simulated): peak bytes the caching allocator reserved in every iteration; else empty."""
    workspaces: dict[str, int] | None = None
    """Simulated CUDA only: the library workspaces held at the start of the last iteration, part of its
    ``static`` (``{"cublas/forward": bytes, ...}``); None where not known (a CPU, a real CUDA device)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"status": "ok", "rank": ..., ...}`` (one key per field)."""
        return {"status": self.status, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankReport:
        """Parse :meth:`to_dict` output.

        Raises:
            ValueError: if ``data`` is not a finished rank's report.
        """
        if data.get("status") != cls.status:
            raise ValueError(f"not a finished rank's report: status {data.get('status')!r}")
        try:
            return cls(**{k: v for k, v in data.items() if k != "status"})
        except TypeError as e:
            raise ValueError(f"not a finished rank's report: {e}") from None


@dataclass(frozen=True, kw_only=True)
class RankFailure:
    """The report of a rank that failed: its exception, for the launcher to find the run's root cause."""

    status: FailureStatus
    """"oom" if the rank ran out of device memory, else "failed"."""
    rank: int
    """The device index."""
    reason: str
    """``"device <rank>: <exception type>: <message>"``; the launcher adds the stage."""
    time: float
    """When it failed (``time.time()``): the earliest failure is the likeliest cause."""
    traceback: str
    """The end of the formatted traceback (for debugging; not part of the result)."""

    def __post_init__(self) -> None:
        if self.status not in get_args(FailureStatus):
            raise ValueError(f"status {self.status!r} of a failed rank is not one of {list(get_args(FailureStatus))}")

    @property
    def exit_code(self) -> int:
        """The exit code the rank ends with: :data:`EXIT_OOM` or :data:`EXIT_FAILED`."""
        return EXIT_OOM if self.status == "oom" else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``{"status", "rank", "reason", "time", "traceback"}``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankFailure:
        """Parse :meth:`to_dict` output.

        Raises:
            ValueError: if ``data`` is not a failed rank's report.
        """
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"not a failed rank's report: {e}") from None


def report_from_dict(data: dict[str, Any]) -> RankReport | RankFailure:
    """A rank's report from its JSON form, finished or failed by its ``"status"``.

    Raises:
        ValueError: if ``data`` is neither.
    """
    return RankReport.from_dict(data) if data.get("status") == RankReport.status else RankFailure.from_dict(data)


def save_report(report: RankReport | RankFailure, report_dir: str | Path) -> None:
    """Write a rank's report to ``rank<N>.json`` in ``report_dir``, atomically: a launcher that reads the
    file never sees half of it."""
    path = Path(report_dir) / f"rank{report.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.to_dict()))
    tmp.replace(path)


@dataclass
class DeviceResult:
    """One device's measurements."""

    device: int
    stage: int
    peak_memory_bytes: int | None
    """Peak tensor memory during a measured iteration (max over measured iterations)."""
    node: int = 0
    rank_in_stage: int = 0
    static_memory_bytes: int | None = None
    """Live bytes at the start of the last measured iteration (parameters, optimizer state, buffers)."""
    data_bytes: int | None = None
    """Bytes of this device's share of the batch held during the iteration (first and last stage)."""
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    """Bytes per category at the peak (see runtime.memory.CATEGORIES)."""
    iteration_peaks: list[int] = field(default_factory=list)
    """Peak of every iteration, warm-up first."""
    in_flight: int = 0
    """Most micro-batches alive at once on this device under the schedule."""
    iteration_seconds: list[float] = field(default_factory=list)
    """Wall time of every iteration on this rank, warm-up first."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """Per action of the last iteration: {"action", "before", "peak", "after"} bytes."""
    overhead_bytes: int | None = None
    """GPU memory outside the caching allocator (CUDA context, libraries' kernels, NCCL buffers): measured
    on a real CUDA run, modelled on a simulated one (runtime/gpu_memory.py); not part of
    ``peak_memory_bytes``. None on CPU."""
    reserved_peak_bytes: int | None = None
    """CUDA: peak bytes the caching allocator reserved (``max_memory_reserved``; simulated: its replay), the
    highest of the measured iterations. None on CPU."""
    total_peak_bytes: int | None = None
    """CUDA: the device memory in use at the peak as nvidia-smi shows it, ``reserved_peak_bytes +
    overhead_bytes``; a plan fits a CUDA device when this does. None on CPU."""
    layer_seconds: list[dict[str, list[list[float]]]] = field(default_factory=list)
    """With ``RunConfig.layer_timing``: per iteration (warm-up first), ``{"forward": rows, "backward": rows}``
    with one row of per-layer seconds per micro-batch (runtime/layer_timer.py); else empty."""


@dataclass
class RunResult:
    """The result of ``hybridplan run``."""

    status: str
    reason: str | None
    iteration_seconds: float | None
    losses: list[float]
    devices: list[DeviceResult]
    config: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float | None = None
    iteration_seconds_representative: bool = True
    """False when the times do not stand for the plan's devices: its ranks shared a GPU
    (``config["share_gpu"]``, runtime/shared_gpu.py), taking turns on it and staging every transfer
    through host memory."""

    @property
    def ok(self) -> bool:
        """Whether the run finished."""
        return self.status == "ok"

    @property
    def peak_memory_bytes(self) -> int | None:
        """The largest device peak."""
        peaks = [d.peak_memory_bytes for d in self.devices if d.peak_memory_bytes is not None]
        return max(peaks) if peaks else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "status": self.status,
            "reason": self.reason,
            "iteration_seconds": self.iteration_seconds,
            "losses": self.losses,
            "devices": [asdict(d) for d in self.devices],
            "config": self.config,
            "plan": self.plan,
            "wall_seconds": self.wall_seconds,
            "iteration_seconds_representative": self.iteration_seconds_representative,
        }

    def save(self, path: str | Path) -> None:
        """Write the JSON form."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Parse the JSON form."""
        try:
            devices = [DeviceResult(**d) for d in data["devices"]]
            return cls(
                status=data["status"],
                reason=data["reason"],
                iteration_seconds=data["iteration_seconds"],
                losses=list(data["losses"]),
                devices=devices,
                config=data.get("config", {}),
                plan=data.get("plan", {}),
                wall_seconds=data.get("wall_seconds"),
                iteration_seconds_representative=bool(data.get("iteration_seconds_representative", True)),
            )
        except (KeyError, TypeError) as e:
            raise HybridPlanError(f"not a run result: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        """Read a result file."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise HybridPlanError(f"cannot read run result {str(path)!r}: {e}") from None

    def summary(self) -> str:
        """A table for terminals."""
        lines = [f"status: {self.status}" + (f" ({self.reason})" if self.reason else "")]
        if self.config.get("share_gpu"):
            lines.append(f"MODE: {SHARED_GPU_NOTE}")
        if self.iteration_seconds is not None:
            lines.append(f"iteration time: {self.iteration_seconds:.3f} s (mean of measured iterations"
                         + ("; NOT representative: the ranks shared a GPU)" if not self.iteration_seconds_representative
                            else ")"))
        if self.losses:
            lines.append("losses: " + ", ".join(f"{v:.6f}" for v in self.losses))
        if self.devices:
            # CUDA devices: the tensor peak (max_memory_allocated), the allocator's reserved peak, the memory
            # outside it and their total (what nvidia-smi shows, what must fit the device)
            cuda = any(d.overhead_bytes is not None for d in self.devices)
            lines.append(
                f"{'device':>6} {'node':>4} {'stage':>5} {'in-flight':>9} {'tensor peak' if cuda else 'peak memory':>14}"
                f" {'static':>12}" + (f" {'reserved':>12} {'outside':>12} {'total':>12}" if cuda else "")
            )
            for d in sorted(self.devices, key=lambda d: d.device):
                lines.append(
                    f"{d.device:>6} {d.node:>4} {d.stage:>5} {d.in_flight:>9} {format_bytes(d.peak_memory_bytes):>14}"
                    f" {format_bytes(d.static_memory_bytes):>12}"
                    + (f" {format_bytes(d.reserved_peak_bytes):>12} {format_bytes(d.overhead_bytes):>12}"
                       f" {format_bytes(d.total_peak_bytes):>12}" if cuda else "")
                )
        return "\n".join(lines)


def failed_result(cfg: RunConfig, status: str, reason: str, wall: float | None) -> RunResult:
    """The result of a run that failed with ``status`` ("oom" or "failed") for ``reason``: no devices, no losses."""
    return RunResult(
        status=status,
        reason=reason,
        iteration_seconds=None,
        losses=[],
        devices=[],
        config=cfg.describe(),
        plan=cfg.plan.to_dict(),
        wall_seconds=wall,
        iteration_seconds_representative=not cfg.share_gpu,
    )


def aggregate(cfg: RunConfig, reports: Sequence[RankReport], *, wall_seconds: float | None) -> RunResult:
    """Combine the reports of every rank (in rank order) into the run result.

    The loss of an iteration is the sum of the last stage's shares (one rank's if it is tensor-parallel:
    every rank there computes the full loss). The iteration time is the mean over measured iterations
    (all but the warm-up) of the slowest rank's; a device's peak is its highest measured iteration's.
    A simulated run's reports carry no losses and no meaningful times: its result has ``losses == []``
    and ``iteration_seconds`` None.
    """
    plan = cfg.plan
    last = plan.stages[-1]
    owners = [last.tensor_group(r)[0] for r in range(last.data_degree)]  # one rank per replica
    losses: list[float] = []
    if all(len(reports[r].losses) == cfg.iterations for r in owners):
        losses = [sum(reports[r].losses[it] for r in owners) for it in range(cfg.iterations)]
    measured = range(1, cfg.iterations) if cfg.iterations > 1 else range(cfg.iterations)
    iteration_seconds = None
    if cfg.backend != "sim":
        iteration_seconds = statistics.fmean(max(rep.seconds[it] for rep in reports) for it in measured)
    devices = []
    for rep in reports:
        peaks = rep.iteration_peaks
        peak = best = reserved = total = None
        if peaks:
            best = max(measured, key=lambda it: peaks[it])
            peak = peaks[best]
        if rep.reserved_peaks:
            reserved = max(rep.reserved_peaks[it] for it in measured)
            total = reserved + rep.overhead_bytes if rep.overhead_bytes is not None else None
        devices.append(
            DeviceResult(
                device=rep.rank,
                stage=rep.stage,
                peak_memory_bytes=peak,
                node=rep.node,
                rank_in_stage=rep.rank_in_stage,
                static_memory_bytes=rep.static[-1] if rep.static else None,
                data_bytes=rep.data[-1] if rep.data else None,
                peak_breakdown={k: v for k, v in rep.breakdowns[best].items() if v} if best is not None else {},
                iteration_peaks=peaks,
                in_flight=rep.in_flight,
                iteration_seconds=rep.seconds,
                timeline=rep.timeline,
                overhead_bytes=rep.overhead_bytes,
                layer_seconds=rep.layer_seconds,
                reserved_peak_bytes=reserved,
                total_peak_bytes=total,
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
        iteration_seconds_representative=not cfg.share_gpu,
    )


def root_cause(
    cfg: RunConfig,
    reports: Sequence[RankReport | RankFailure | None],
    wall: float,
    *,
    failed: Sequence[int],
    crashed: Callable[[int], tuple[str, int | None]],
) -> RunResult:
    """The result of a failed run: the failure that caused it, from the ranks that ended badly.

    In order: an out-of-memory report (it makes its peers fail too); a rank that died without a report
    (a crash: its peers then see closed connections); a failure report that is not merely a peer's
    lost connection; any failure report.

    Args:
        cfg: the run.
        reports: each rank's report, None where a rank wrote none.
        wall: the run's wall-clock seconds.
        failed: the ranks that ended badly, in the order the launcher saw them.
        crashed: how a failed rank without a report ended: a phrase ("exited with code 1", "was killed by
            signal 9") and its exit code where known (:data:`EXIT_OOM` makes the run "oom").
    """
    failures: list[RankFailure] = [rep for r in failed if isinstance(rep := reports[r], RankFailure)]
    ooms = [rep for rep in failures if rep.status == "oom"]
    if ooms:
        return _from_report(cfg, min(ooms, key=lambda rep: rep.time), wall)
    without = [r for r in failed if not isinstance(reports[r], RankFailure)]
    if without:
        rank = without[0]
        how, code = crashed(rank)
        status = "oom" if code == EXIT_OOM else "failed"
        return failed_result(cfg, status, f"device {rank} (stage {cfg.plan.stage_of_device(rank)}) {how} without a report", wall)
    causes = [rep for rep in failures if not any(c in rep.reason for c in _CONSEQUENCES)]
    return _from_report(cfg, min(causes or failures, key=lambda rep: rep.time), wall)


def _from_report(cfg: RunConfig, report: RankFailure, wall: float) -> RunResult:
    """The run's result from the failure report that caused it, with the device's stage added."""
    rank = report.rank
    stage = cfg.plan.stage_of_device(rank)
    reason = report.reason.replace(f"device {rank}:", f"device {rank} (stage {stage}):", 1)
    return failed_result(cfg, report.status, reason, wall)
