"""The outcome of a run: status, losses, iteration time, and per-device peak memory.

JSON form (other tools rely on these keys; more are added)::

    {"status": "ok" | "oom" | "failed", "reason": str | null, "iteration_seconds": float | null,
     "losses": [float, ...],
     "devices": [{"device": 0, "stage": 0, "peak_memory_bytes": int, ...}, ...]}

A simulated run (``backend="sim"``) has the same form with ``iteration_seconds`` null and no losses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hybridplan.errors import HybridPlanError
from hybridplan.units import format_bytes

__all__ = ["DeviceResult", "RunResult", "STATUSES"]

STATUSES = ("ok", "oom", "failed")


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
    """GPU memory outside tensors (CUDA context, NCCL buffers): measured on a real CUDA run, estimated on
    a simulated one (runtime/gpu_memory.py); not part of ``peak_memory_bytes`` nor of the capacity
    check. None on CPU."""
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
        if self.iteration_seconds is not None:
            lines.append(f"iteration time: {self.iteration_seconds:.3f} s (mean of measured iterations)")
        if self.losses:
            lines.append("losses: " + ", ".join(f"{v:.6f}" for v in self.losses))
        if self.devices:
            overhead = any(d.overhead_bytes is not None for d in self.devices)
            lines.append(
                f"{'device':>6} {'node':>4} {'stage':>5} {'in-flight':>9} {'peak memory':>14} {'static':>12}"
                + (f" {'overhead':>12}" if overhead else "")
            )
            for d in sorted(self.devices, key=lambda d: d.device):
                lines.append(
                    f"{d.device:>6} {d.node:>4} {d.stage:>5} {d.in_flight:>9} {format_bytes(d.peak_memory_bytes):>14}"
                    f" {format_bytes(d.static_memory_bytes):>12}"
                    + (f" {format_bytes(d.overhead_bytes):>12}" if overhead else "")
                )
        return "\n".join(lines)
