"""Measured layer times at one micro-batch size, and the time at any other size.

A :class:`TimingTable` holds, for one device type, tensor-parallel degree and micro-batch size, the forward and
backward seconds of every layer on ONE device of that type, for one micro-batch of that many samples (and,
where measured, the optimizer step's seconds per byte and the per-iteration overhead).
:func:`scale_to_samples` reads the times at a size between or beyond the measured ones.

[Note: time vs micro-batch size] A micro-batch size between two profiled sizes is interpolated linearly
between them (piecewise-linear in samples through the measured points). Outside the profiled range a layer
takes ``max(F, c * b)`` seconds for ``b`` samples: the roofline form (Williams, Waterman and Patterson,
"Roofline: an insightful visual performance model", CACM 52(4), 2009: attainable time is the larger of a
memory-bound and a compute-bound time), with a fixed cost ``F`` that does not shrink with the batch (reading
the layer's weights, launching its kernels: the memory-bound roof of a small batch) and a per-sample cost
``c`` (the compute-bound roof). ``c`` is the per-sample time of the nearest profiled size (so the curve is
continuous there); ``F`` is where the line through the two smallest profiled sizes meets zero samples, kept
within [0, the smallest time profiled], and 0 with a single profiled size. So a profile with ONE size scales
proportionally to the samples, as AMP's cost model assumes (seed 002 section 3.4 and its ``cost_homo.py``),
which is how imported PipeDream and AMP profiles are read; above the largest profiled size every profile
scales proportionally from it (``c * b`` exceeds ``F`` there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TimingTable", "scale_to_samples"]


@dataclass(frozen=True, kw_only=True)
class TimingTable:
    """Per-layer seconds on one device of ``device_type`` for a micro-batch of ``micro_batch_size`` samples."""

    device_type: str
    tensor_degree: int
    micro_batch_size: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    optimizer_s_per_byte: float | None = None
    """Seconds of the optimizer step per byte of parameters on the device (None: not measured)."""
    overhead_s: float | None = None
    """Seconds per iteration of a stage beyond its layers and its optimizer step (None: not measured)."""

    @property
    def key(self) -> tuple[str, int, int]:
        """``(device_type, tensor_degree, micro_batch_size)``, unique within a profile."""
        return (self.device_type, self.tensor_degree, self.micro_batch_size)


def scale_to_samples(sizes: Sequence[float], values: Sequence[np.ndarray], samples: float) -> np.ndarray:
    """Seconds at ``samples`` per micro-batch from seconds measured at ``sizes`` ([Note: time vs micro-batch
    size]): piecewise-linear between measured sizes, ``max(F, c * samples)`` outside them.

    Args:
        sizes: measured micro-batch sizes, ascending and distinct.
        values: per size, an array of seconds (one per layer, or a single number).
        samples: the micro-batch size wanted (> 0, may be fractional).

    Example:
        >>> [float(x) for x in scale_to_samples([2.0, 4.0], [np.array([3.0]), np.array([5.0])], 1.0)]  # F = 1
        [1.5]
        >>> [float(x) for x in scale_to_samples([2.0, 4.0], [np.array([3.0]), np.array([5.0])], 8.0)]
        [10.0]
    """
    arrays = [np.asarray(v, dtype=float) for v in values]
    for size, v in zip(sizes, arrays):
        if size == samples:
            return v
    if sizes[0] < samples < sizes[-1]:
        hi = next(i for i, s in enumerate(sizes) if s > samples)
        s0, s1 = sizes[hi - 1], sizes[hi]
        w = (samples - s0) / (s1 - s0)
        return arrays[hi - 1] + w * (arrays[hi] - arrays[hi - 1])
    if len(sizes) > 1:
        slope = (arrays[1] - arrays[0]) / (sizes[1] - sizes[0])
        fixed = np.clip(arrays[0] - sizes[0] * slope, 0.0, np.min(arrays, axis=0))
    else:
        fixed = np.zeros_like(arrays[0])
    nearest = 0 if samples < sizes[0] else len(sizes) - 1
    return np.maximum(fixed, arrays[nearest] * (samples / sizes[nearest]))
