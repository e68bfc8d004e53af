"""What the memory predictor returns: each device's predicted memory, and a plan's.

The result types of :meth:`~hybridplan.predict.memory.MemoryPredictor.predict`, read by the workflows, the search's
feasibility check and the reports; kept apart from the predictor so that those readers depend on a plain record,
and so that what a predicted CUDA device's numbers mean ([Note: predicting a CUDA device]) is stated where they are
held.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DevicePrediction", "PlanPrediction"]


@dataclass
class DevicePrediction:
    """Predicted memory of one device.

    [Note: predicting a CUDA device] From a profile taken on (simulated or real) CUDA devices, the peak is in
    the caching allocator's terms (blocks and cuBLAS workspaces: runtime/gpu_memory.py), what
    ``max_memory_allocated`` shows. The allocator's RESERVED peak is that peak plus the excess the profile
    measured (reserved beyond the tensor peak rounded up to 2 MiB) for the nearest profiled span of the stage's
    scenario, rounded up to whole 2 MiB ([Note: predicting the reserved peak] in predict/reserved.py). The
    memory outside the allocator is added from the plan (``estimate_overhead_bytes``: the context, every library
    a zoo model may load, the device's NCCL communicators), so ``total_bytes`` = reserved + outside is what must
    fit the device. A CUDA profile written before reserved peaks were recorded does not predict the reserved
    peak (``reserved_peak_bytes`` None); its ``total_bytes`` is tensor peak + outside, a lower bound.
    """

    device: int
    stage: int
    peak_memory_bytes: int
    in_flight: int
    quantities: dict[str, int] = field(default_factory=dict)
    overhead_bytes: int | None = None
    """CUDA: memory outside the caching allocator, estimated (runtime/gpu_memory.py); None on a CPU."""
    reserved_peak_bytes: int | None = None
    """CUDA: the allocator's predicted reserved peak; None on a CPU or from a profile that did not record reserved
    peaks (see [Note: predicting a CUDA device])."""
    total_bytes: int | None = None
    """CUDA: ``reserved_peak_bytes + overhead_bytes`` (``peak_memory_bytes + overhead_bytes``, a lower bound, when
    the reserved peak is not predicted), the device memory the plan needs; None on a CPU."""

    @property
    def needed_bytes(self) -> int:
        """What must fit the device's capacity: the total on CUDA, the tensor peak on a CPU."""
        return self.peak_memory_bytes if self.total_bytes is None else self.total_bytes


@dataclass
class PlanPrediction:
    """Predicted per-device peaks of a plan."""

    devices: list[DevicePrediction]
    method: str

    @property
    def peak_memory_bytes(self) -> int:
        return max(d.peak_memory_bytes for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "peak_memory_bytes": self.peak_memory_bytes, "devices": [asdict(d) for d in self.devices]}
