"""The CUDA caching allocator's reserved peak of a device, predicted from the excess a profile measured.

[Note: predicting the reserved peak] What a CUDA device holds in the caching allocator is its reserved memory
(``max_memory_reserved``), not its tensor peak (``max_memory_allocated``): the allocator reserves segments
(``cudaMalloc``) of 2 MiB for requests of at most 1 MiB, 20 MiB for requests under 10 MiB, and the request
rounded up to 2 MiB above that, splits them between requests, and keeps every freed block cached for later
ones (c10/cuda/CUDACachingAllocator.cpp; replayed in runtime/cuda_allocator.py, [Note: the caching allocator
model]). Every segment is a multiple of 2 MiB (``kSmallBuffer``, ``kLargeBuffer``, ``kRoundLarge``), so the
reserved peak is too, and it is at least the tensor peak rounded up to whole 2 MiB: that rounding is the
least the allocator can reserve. What it reserves beyond that least, the EXCESS (a whole number of 2 MiB), is
the cached blocks too small or too scattered for a later request (fragmentation), and the 20 MiB segments
that 1-10 MiB requests leave partly empty. The excess depends on the order and sizes of every allocation of
the stage, which the per-action quantities of a profile do not keep, so it is measured, not derived:

- every profiling run on a (real or simulated) CUDA device records, per measured device, the tensor peak and
  the reserved peak of the same iterations (profiling/store.py ``reserved_peaks``; a simulated profiling run
  records its own, with its two micro-batches, three for a ZeRO-3 stage with a stage after it:
  profiling/execution.py); its excess is ``reserved - round_up(tensor, 2 MiB)``;
- a stage's excess is the excess of the profiled span of its scenario (kind, degree) nearest to it: the same
  span where it was profiled, else the one with the fewest layers moved at either end (the larger excess on a
  tie, the safer side); a degree above the profiled ones takes the largest profiled degree's;
- at the target micro-batch size the excess is the one measured at the nearest profiled micro-batch size (the
  larger on a tie), not a straight line through the two: an excess is a whole number of segments left over by the
  order of the allocations, and a line through two such steps, extrapolated to the target (twice the larger
  profiled size in a default campaign), multiplies a one-segment difference (benchmarks/reserved_prediction:
  errors up to +6 MiB with the line, +2 MiB with the nearest size, on the same plans);
- the reserved peak is the predicted tensor peak plus that excess, rounded up to a multiple of 2 MiB.

A profile taken on CPU devices has no reserved term (a CPU has no caching allocator); one taken on CUDA
before the ``reserved_peaks`` table existed has no measurements of it: :func:`reserved_excess` returns None for
both, and the predictor says the reserved peak is not predicted (its total is then a lower bound).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hybridplan.runtime.cuda_allocator import ROUND_LARGE

if TYPE_CHECKING:
    from hybridplan.profiling.database import ProfileDB

__all__ = ["ReservedExcess", "reserved_peak_from"]

PeakRow = tuple[str, int, int, int, int, int, int, int]
"""``(kind, degree, batch_size, microbatch_size, start, stop, tensor_bytes, reserved_bytes)``: one measured device
(profiling/store.py ``reserved_peaks``)."""


def reserved_peak_from(tensor_peak: float, excess: float) -> int:
    """The reserved peak of a device whose tensor peak is ``tensor_peak`` and whose allocator reserves ``excess``
    bytes of excess: their sum rounded up to a whole number of 2 MiB (every segment is a multiple of
    ``ROUND_LARGE``, runtime/cuda_allocator.py); ``excess`` 0 gives the least the allocator can reserve.

    Example:
        >>> [reserved_peak_from(t, g) >> 20 for t, g in ((1, 0), (2 << 20, 0), (3 << 20, 1 << 20), (3 << 20, 1))]
        [2, 2, 4, 4]
    """
    need = max(0, int(round(tensor_peak + max(0.0, excess))))
    return -(-need // ROUND_LARGE) * ROUND_LARGE


class ReservedExcess:
    """The reserved excess a CUDA profile measured, per scenario and span (see [Note: predicting the reserved peak]).

    Args:
        rows: the profile's measured peaks (``ProfileStore.reserved_peaks``); several devices measuring one span
            at one size keep the largest excess.

    Example (pipeline spans [0, 2) and [2, 4) at micro-batch sizes 2 and 4; excess 2 and 6 MiB, then 0 twice):
        >>> M = 2**20
        >>> g = ReservedExcess([("none", 1, 8, 2, 0, 2, 3 * M, 6 * M), ("none", 1, 16, 4, 0, 2, 5 * M - 1, 12 * M),
        ...                   ("none", 1, 8, 2, 2, 4, M, 2 * M), ("none", 1, 16, 4, 2, 4, M + 1, 2 * M)])
        >>> [g.excess(0, 2, "none", 1, 8) / M, g.excess(0, 3, "none", 1, 3) / M, g.excess(3, 4, "none", 1, 1) / M]
        [6.0, 6.0, 0.0]
    """

    def __init__(self, rows: Iterable[PeakRow]) -> None:
        self._excess: dict[tuple[str, int], dict[int, dict[tuple[int, int], int]]] = {}
        self._asked: dict[tuple[int, int, str, int, int], float | None] = {}
        for kind, degree, _batch, micro, start, stop, tensor, reserved in rows:
            nbytes = max(0, reserved - reserved_peak_from(tensor, 0))
            key = ("none", 1) if degree == 1 else (kind, degree)
            spans = self._excess.setdefault(key, {}).setdefault(micro, {})
            spans[(start, stop)] = max(nbytes, spans.get((start, stop), nbytes))

    def __bool__(self) -> bool:
        return bool(self._excess)

    def _key(self, kind: str, degree: int) -> tuple[str, int] | None:
        """The measured scenario for ``kind`` x ``degree``: itself, or above the profiled degrees the largest."""
        if degree == 1:
            return ("none", 1) if ("none", 1) in self._excess else None
        if (kind, degree) in self._excess:
            return (kind, degree)
        below = [d for k, d in self._excess if k == kind and d < degree]
        return (kind, max(below)) if below else None

    @staticmethod
    def _nearest(spans: dict[tuple[int, int], int], start: int, stop: int) -> int:
        """The excess of the measured span nearest ``[start, stop)``: fewest layers moved at both ends, the larger on a tie."""
        return min(spans.items(), key=lambda kv: (abs(kv[0][0] - start) + abs(kv[0][1] - stop), -kv[1]))[1]

    def excess(self, start: int, stop: int, kind: str, degree: int, microbatch_size: int) -> float | None:
        """Predicted excess (bytes reserved beyond the tensor peak rounded up to 2 MiB) of a ``kind`` x ``degree``
        stage of layers ``[start, stop)`` at ``microbatch_size`` samples per micro-batch (None: the scenario was not
        measured)."""
        asked = (start, stop, kind, degree, microbatch_size)
        if asked not in self._asked:  # a search asks each stage of many plans, every device alike
            key = self._key(kind, degree)
            if key is None:
                self._asked[asked] = None
            else:
                _, spans = min(self._excess[key].items(), key=lambda kv: (abs(kv[0] - microbatch_size), -kv[0]))
                self._asked[asked] = float(self._nearest(spans, start, stop))
        return self._asked[asked]


def reserved_excess(db: ProfileDB) -> ReservedExcess | None:
    """The excess a CUDA profile measured; None for a CPU profile or one written before reserved peaks were recorded."""
    if db.run_options.get("device_type", "cpu") != "cuda":
        return None
    excess = ReservedExcess(db.reserved_peaks)
    return excess if excess else None
