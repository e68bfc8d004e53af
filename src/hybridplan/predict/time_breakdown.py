"""The predicted iteration time of a plan, per stage and in total: what
:func:`~hybridplan.predict.time_model.predict_iteration_time` returns.

The terms are those of the time model (:mod:`hybridplan.predict.time_model`); this module only holds them,
adds them up and shows them (JSON form, terminal table). The Notes its fields cite are in
predict/time_model.py, predict/communication.py (per-message latency; ZeRO and recompute) and
predict/stage_compute.py (devices that share CPU cores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridplan.plan import spec

__all__ = ["StageTime", "TimeBreakdown"]


@dataclass(frozen=True)
class StageTime:
    """One stage's share of the iteration (seconds; per micro-batch except ``sync_s``)."""

    start: int
    stop: int
    kind: str
    devices: tuple[int, ...]
    forward_s: float
    backward_s: float
    tensor_comm_s: float
    p2p_s: float
    """Forward activation + backward gradient across the boundary to the NEXT stage (0 for the last)."""
    sync_s: float
    """Data-parallel gradient all-reduce, once per iteration."""
    optimizer_s: float = 0.0
    """The optimizer step, once per iteration ([Note: the terms AMP leaves out])."""
    overhead_s: float = 0.0
    """Per-iteration seconds beyond layers and step, once per iteration."""
    sharing: float = 1.0
    """The CPU core-sharing factor already applied to the stage's seconds ([Note: devices that share CPU cores])."""
    recompute_s: float = 0.0
    """The forward run again in the backward of a recomputed stage, per micro-batch ([Note: ZeRO and recompute
    in time])."""
    shard_comm_s: float = 0.0
    """ZeRO-2/3's parameter all-gathers and gradient reduce-scatter, per micro-batch."""
    p2p_latency_s: float = 0.0
    """Of ``p2p_s``: the per-message latency of both directions, per micro-batch ([Note: per-message latency])."""
    p2p_messages: int = 0
    """Messages across the boundary to the next stage per iteration, both directions, all ranks."""
    sync_latency_s: float = 0.0
    """Of ``sync_s``: the per-message latency of the gradient all-reduces."""
    sync_messages: int = 0
    """Ring steps one rank of the stage makes per iteration in the gradient all-reduces (collectives x 2(d-1))."""

    @property
    def compute_s(self) -> float:
        """``t_i`` of eq. 5: forward + backward + tensor-parallel all-reduces (+ recompute and ZeRO-2/3's
        collectives, where the stage has them)."""
        return self.forward_s + self.backward_s + self.tensor_comm_s + self.recompute_s + self.shard_comm_s


@dataclass(frozen=True)
class TimeBreakdown:
    """Predicted iteration time, per stage and in total."""

    stages: tuple[StageTime, ...]
    num_microbatches: int
    microbatch_size: int
    pipeline_s: float
    sync_s: float
    overlap_p2p: bool = True
    schedule: str = "1f1b"
    """The schedule the pipeline term models; "2bw" has no per-iteration flush."""
    optimizer_s: float = 0.0
    """The slowest stage's optimizer step ([Note: the terms AMP leaves out])."""
    overhead_s: float = 0.0
    """The largest per-iteration overhead of a stage."""

    @property
    def total_s(self) -> float:
        """Seconds per iteration: pipeline + the slowest data-parallel sync (eq. 4) + the slowest optimizer step
        + the largest per-iteration overhead."""
        return self.pipeline_s + self.sync_s + self.optimizer_s + self.overhead_s

    @property
    def bottleneck_stage(self) -> int:
        """Index of the stage with the largest ``t_i``."""
        return int(np.argmax([s.compute_s for s in self.stages]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (seconds)."""
        return {
            "total_s": self.total_s,
            "pipeline_s": self.pipeline_s,
            "sync_s": self.sync_s,
            "optimizer_s": self.optimizer_s,
            "overhead_s": self.overhead_s,
            "num_microbatches": self.num_microbatches,
            "microbatch_size": self.microbatch_size,
            "overlap_p2p": self.overlap_p2p,
            "schedule": self.schedule,
            "stages": [
                {
                    "layers": [s.start, s.stop], "kind": s.kind, "devices": list(s.devices),
                    "forward_s": s.forward_s, "backward_s": s.backward_s, "tensor_comm_s": s.tensor_comm_s,
                    "p2p_s": s.p2p_s, "sync_s": s.sync_s, "optimizer_s": s.optimizer_s, "overhead_s": s.overhead_s,
                    "core_sharing": s.sharing, "recompute_s": s.recompute_s, "shard_comm_s": s.shard_comm_s,
                    "p2p_latency_s": s.p2p_latency_s, "p2p_messages": s.p2p_messages,
                    "sync_latency_s": s.sync_latency_s, "sync_messages": s.sync_messages,
                }
                for s in self.stages
            ],
        }

    def table(self) -> str:
        """A terminal table in milliseconds, one row per stage, then the totals."""
        head = (f"{'stage':>5} {'layers':>9} {'kind':>11} {'devices':>8} {'fwd ms':>9} {'bwd ms':>9} {'tp ms':>8} {'p2p ms':>8}"
                f" {'sync ms':>9} {'step ms':>8} {'other ms':>8}")
        rows = [head, "-" * len(head)]
        for i, s in enumerate(self.stages):
            mark = "*" if i == self.bottleneck_stage else " "
            rows.append(
                f"{i:>4}{mark} {f'[{s.start},{s.stop})':>9} {s.kind:>11} {len(s.devices):>8} {s.forward_s * 1e3:>9.2f}"
                f" {s.backward_s * 1e3:>9.2f} {s.tensor_comm_s * 1e3:>8.2f} {s.p2p_s * 1e3:>8.2f} {s.sync_s * 1e3:>9.2f}"
                f" {s.optimizer_s * 1e3:>8.2f} {s.overhead_s * 1e3:>8.2f}"
            )
        extra = [(i, s) for i, s in enumerate(self.stages) if s.recompute_s or s.shard_comm_s]
        for i, s in extra:
            rows.append(f"(stage {i}: + recompute {s.recompute_s * 1e3:.2f} ms, + ZeRO collectives"
                        f" {s.shard_comm_s * 1e3:.2f} ms per micro-batch)")
        if any(s.p2p_latency_s > 0 or s.sync_latency_s > 0 for s in self.stages):
            rows.append("per-message latency (in p2p and sync): " + "; ".join(
                f"stage {i}: p2p {s.p2p_latency_s * 1e3:.2f} ms per micro-batch ({s.p2p_messages} messages per iteration),"
                f" sync {s.sync_latency_s * 1e3:.2f} ms ({s.sync_messages} ring steps)"
                for i, s in enumerate(self.stages) if s.p2p_latency_s > 0 or s.sync_latency_s > 0))
        shared = max(s.sharing for s in self.stages)
        if shared > 1:
            rows.append(f"(the plan's processes share the host's CPU cores: stage seconds up to x{shared:.2f})")
        flush = "" if spec(self.schedule).flushes else f" (no flush: {self.schedule})"
        rows.append(
            f"{self.num_microbatches} micro-batches of {self.microbatch_size}: pipeline{flush} {self.pipeline_s * 1e3:.1f} ms"
            f" + sync {self.sync_s * 1e3:.1f} ms + optimizer step {self.optimizer_s * 1e3:.1f} ms + other per-iteration"
            f" {self.overhead_s * 1e3:.1f} ms = {self.total_s * 1e3:.1f} ms per iteration (* = bottleneck stage)"
        )
        return "\n".join(rows)
