"""A writer of :class:`~hybridplan.profiling.stage_memo.StageMemo` entries for tests/profiling/test_stage_memo.py's
concurrent writers: a module of its own, so that a spawned process imports the memo alone (0.1 s), not the test
module's torch, campaign and predictor (seconds for each of the 4 writers on 2 cores)."""

from __future__ import annotations

from hybridplan.profiling.stage_memo import StageMemo


def write(directory: str, worker: int) -> None:
    """60 rounds of two entries: one of 10 keys every worker writes, and one of this worker's own."""
    memo = StageMemo(directory)
    for i in range(60):
        memo.put({"shared": i % 10}, {"value": i % 10, "pad": "x" * 2000})  # every worker writes the same 10 keys
        memo.put({"own": worker, "i": i}, {"value": i})
