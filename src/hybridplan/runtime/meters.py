"""Memory meters that see a device's allocations by other means than tracking tensors: the CUDA caching allocator's
counters (:class:`CudaMemoryMeter`), or none at all (:class:`NullMeter`).

They offer the interface of runtime/memory.py's ``StorageTracker``, which counts every tensor itself (a CPU device,
a simulated one), so runtime/rank.py drives any of the three alike; registration, phases and forgetting are no-ops
here, since the allocator (or nobody) counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["CudaMemoryMeter", "NullMeter"]


class _PassiveMeter:
    """A meter that sees allocations by other means: registration, phases and forgetting are no-ops."""

    phase = "other"
    capacity_bytes: int | None = None
    peak_by_category: dict[str, int] = {}
    by_category: dict[str, int] = {}

    def __enter__(self) -> _PassiveMeter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def track(self, t: Any, category: str | None = None) -> None:
        return None

    def track_all(self, objects: Iterable[Any], category: str) -> None:
        return None

    def retag(self, t: Any, category: str) -> None:
        return None

    def forget(self, t: Any) -> None:
        return None

    def host_resident(self, t: Any) -> None:
        return None

    def overhead_bytes(self) -> int | None:
        """Device memory outside the tensor allocator (None: not measured)."""
        return None

    def workspaces(self) -> dict[str, int] | None:
        """The library workspaces held now (None: not known; a real CUDA device's are inside its allocator's
        counters, not told apart: profiling/statistics.py [Note: workspaces are per device])."""
        return None

    @property
    def reserved_peak(self) -> int | None:
        """Peak bytes the allocator reserved in this window (None: not measured)."""
        return None

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        yield

    @contextmanager
    def paused(self) -> Iterator[None]:
        yield


class CudaMemoryMeter(_PassiveMeter):
    """The same interface over the CUDA caching allocator's counters (``max_memory_allocated``).

    The allocator sees every tensor by itself. A capacity (the device's whole memory, as nvidia-smi
    counts it) is enforced with ``torch.cuda.set_per_process_memory_fraction``, which limits what the
    allocator reserves: to the capacity less ``outside_bytes``, the memory expected outside the
    allocator (runtime/gpu_memory.py ``estimate_overhead_bytes``).
    """

    def __init__(self, device: torch.device, capacity_bytes: int | None = None, *, outside_bytes: int = 0) -> None:
        self.device = device
        self.capacity_bytes = capacity_bytes
        self._earlier_peak = 0  # peak of the windows closed since reset_peak
        self._earlier_reserved = 0
        self.phase = "other"
        self.peak_by_category: dict[str, int] = {}
        self.by_category: dict[str, int] = {}
        if capacity_bytes is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, (capacity_bytes - outside_bytes) / total)), device)

    @property
    def current(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    @property
    def peak(self) -> int:
        return max(self._earlier_peak, self.window_peak)

    @property
    def window_peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))

    @property
    def reserved_peak(self) -> int | None:
        """``max_memory_reserved`` over the windows since :meth:`reset_peak`."""
        return max(self._earlier_reserved, int(torch.cuda.max_memory_reserved(self.device)))

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._earlier_peak = 0
        self._earlier_reserved = 0

    def start_window(self) -> int:
        """Close the running window (keeping its peak) and open a new one: the allocator's peak counter
        is global, so per-action peaks need a reset at each action."""
        self._earlier_peak = max(self._earlier_peak, self.window_peak)
        self._earlier_reserved = max(self._earlier_reserved, int(torch.cuda.max_memory_reserved(self.device)))
        torch.cuda.reset_peak_memory_stats(self.device)
        return self.current

    def overhead_bytes(self) -> int | None:
        """Device memory in use that the caching allocator did not reserve: the CUDA context, NCCL's
        buffers and other libraries' own allocations (and other processes' memory, on a shared GPU).
        Measured as ``total - free`` (``torch.cuda.mem_get_info``) minus ``memory_reserved``."""
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total - free - torch.cuda.memory_reserved(self.device))


class NullMeter(_PassiveMeter):
    """No memory measurement (``track_memory=False``): every reading is 0."""

    current = 0
    peak = 0
    window_peak = 0

    def reset_peak(self) -> None:
        return None

    def start_window(self) -> int:
        return 0
