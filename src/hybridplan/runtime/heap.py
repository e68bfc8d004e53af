"""Freezing the heap around a simulated device, and knowing that it is frozen without asking the collector.

[Note: the frozen set is counted by walking it] ``gc.get_freeze_count()`` is not a counter: CPython (3.11,
``Modules/gcmodule.c`` ``gc_get_freeze_count_impl``) returns ``gc_list_size`` of the permanent generation, a walk
over every frozen object's GC header. Inside :func:`frozen_heap` that is every object the process holds: 70 ms
for 3 million objects measured alone, and in a long profiling process (benchmarks/extension_gain's width
probes, a profile after another in one process) it took 47% of a MoE 1.3B profile's samples (py-spy, 45 s, at
``run_rank``'s question whether the heap was already frozen), the device's own work the other half. So a
block records that it froze the heap (:func:`heap_frozen` answers at once inside it) and asks the collector
only where no block is open, when the permanent generation is as a rule empty and the walk costs nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap", "heap_frozen"]

_frozen_here = False
"""Whether a :func:`frozen_heap` block of this process froze the heap and has not ended."""


def heap_frozen() -> bool:
    """Whether objects are frozen now: by a :func:`frozen_heap` block (known without a walk), else by someone
    else (``gc.get_freeze_count``: a walk of the frozen set, [Note: the frozen set is counted by walking it])."""
    return _frozen_here or gc.get_freeze_count() > 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive now frozen (``gc.freeze``) for the block.

    Each simulated device starts with a full collection of the cyclic garbage collector (runtime/rank.py
    ``run_rank``), which scans every object of the process: in a process that imported torch, several hundred
    thousand of them, 0.2 to 0.9 s a device on the 2-core test machine (measured with a timed ``gc.collect`` over
    ``measure_plan`` of the MLP on 2x2, 2026-11-25, machine shared). In the block those collections scan only
    what was made after it began (their garbage is still collected). Freezing moves the collector's lists
    without scanning them, so the block costs no collection of its own; garbage older than the block is kept
    until the block ends (a simulation's tensors are fake: it holds their metadata only) and collected after.
    A simulated device counts only storages made in its own run, so older objects never enter its bytes. Does
    nothing if objects are frozen already (someone else's frozen set is never released).
    """
    global _frozen_here
    if heap_frozen():
        yield
        return
    gc.freeze()
    _frozen_here = True
    try:
        yield
    finally:
        _frozen_here = False
        gc.unfreeze()
