"""What each engine can express, and the nearest plan it can run.

The engines lay their devices out as one grid, ``pipeline x data x tensor``: every stage has the same data and
tensor degree (torchtitan ``ParallelDims``, Megatron-LM ``parallel_state``, DeepSpeed ``PipeDataParallelTopology``),
one ZeRO / FSDP setting and one activation-checkpointing setting for the whole model. A hybridplan plan may give
each stage its own. :func:`nearest_plan` turns a plan into one the engine runs, and says what it changed:

- the schedule: torchtitan runs GPipe and 1F1B (``pipeline_parallel_schedule``); Megatron-LM's non-interleaved
  schedule and DeepSpeed's ``TrainSchedule`` are 1F1B. PipeDream-Flush is 1F1B's order (plan/schedule.py).
  GPipe becomes 1F1B (the same training, fewer micro-batches in flight), 2BW becomes 1F1B (no stale weights);
- the degrees: stages of different degrees become the uniform grid with the SAME cuts on
  ``floor(devices / stages)`` devices per stage, split into the data x tensor pair closest to the plan's stages
  whose data degree divides the micro-batch (DeepSpeed's pipeline without Megatron-LM has no tensor parallelism:
  data only); left-over devices stay idle, and it says so;
- ZeRO: the largest stage's setting for all stages (the lower memory); torchtitan shards with FSDP2 only
  (2: ``fsdp_reshard_after_forward="never"``, 3: ``"always"``; 0: DDP replicas), so 1 becomes 2; DeepSpeed's
  pipeline engine accepts ZeRO-1 only ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
  deepspeed/runtime/pipe/engine.py), so 2 and 3 become 1 there; Megatron-LM's ``--use-distributed-optimizer`` is
  ZeRO-1, and 2 and 3 (Megatron-FSDP) are left to the user, so they become 1;
- recompute: one stage recomputed makes all recomputed (torchtitan ``activation_checkpoint``, Megatron-LM
  ``--recompute-granularity full``, DeepSpeed ``activation_checkpoint_interval`` apply to every block);
  "selective" (torchtitan's per-operation policy, runtime/checkpointing.py) is torchtitan's alone: elsewhere it
  becomes full (Megatron-LM's own "selective" recomputes the attention core only: another policy).

Each change lowers or keeps every device's memory except two: fewer devices per stage (the grid), and the
ZeRO-3 -> ZeRO-1 or 2 -> 1 step; check the nearest plan with ``hybridplan predict`` or ``estimate-memory``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, get_args

from hybridplan.plan import Plan, StagePlan
from hybridplan.plan.schedule import Schedule

__all__ = ["Engine", "ENGINES", "Capabilities", "CAPABILITIES", "nearest_plan"]

Engine = Literal["torchtitan", "megatron", "deepspeed"]
ENGINES: tuple[Engine, ...] = get_args(Engine)


@dataclass(frozen=True)
class Capabilities:
    """What one engine expresses (module docstring)."""

    schedules: tuple[Schedule, ...]
    tensor: bool
    zero: tuple[int, ...]
    """ZeRO stages with more than one pipeline stage."""
    zero_single_stage: tuple[int, ...]
    """ZeRO stages without pipelining."""
    zero_map: dict[int, int]
    """The nearest supported ZeRO stage of each unsupported one."""
    decoder_only: bool
    """Whether the model must be a decoder-only transformer."""
    selective: bool = False
    """Whether the engine runs torchtitan's per-operation selective recompute."""


CAPABILITIES: dict[Engine, Capabilities] = {
    "torchtitan": Capabilities(("gpipe", "1f1b", "flush"), True, (0, 2, 3), (0, 2, 3), {1: 2}, True, selective=True),
    "megatron": Capabilities(("1f1b", "flush"), True, (0, 1), (0, 1), {2: 1, 3: 1}, True),
    "deepspeed": Capabilities(("1f1b", "flush"), False, (0, 1), (0, 1, 2, 3), {2: 1, 3: 1}, False),
}


def nearest_plan(plan: Plan, engine: Engine, *, accept: Callable[[Plan], bool] | None = None) -> tuple[Plan, list[str]]:
    """The plan closest to ``plan`` that ``engine`` runs, and what was changed (empty: ``plan`` itself).

    ``accept`` says whether the model runs a grid (its layers' tensor-parallel support, checked by the caller,
    who has the model): grids it refuses are passed over for the next closest (``data x1 tensor x1`` is taken
    last whatever it says)."""
    cap = CAPABILITIES[engine]
    changes: list[str] = []
    schedule = plan.schedule
    if schedule not in cap.schedules:
        schedule = "1f1b"
        changes.append(f"schedule {plan.schedule} -> 1f1b ({engine} runs {', '.join(cap.schedules)})")
    out = replace(plan, schedule=schedule)
    degrees = {(s.data_degree, s.tensor_degree) for s in plan.stages}
    needs_grid = len(degrees) > 1 or (not cap.tensor and any(t > 1 for _, t in degrees))
    if needs_grid:
        pp = plan.num_stages
        per_stage = plan.num_devices // pp
        everyone = sorted(dev for s in plan.stages for dev in s.devices)
        for d, t in _grids(plan, per_stage, tensor=cap.tensor):
            devices = everyone[: pp * d * t]
            stages = tuple(StagePlan.of(s.start, s.stop, devices[k * d * t:(k + 1) * d * t], data_degree=d,
                                        tensor_degree=t, zero=s.zero if d > 1 else 0, recompute=s.recompute)
                           for k, s in enumerate(plan.stages))
            if accept is None or (d, t) == (1, 1) or accept(replace(out, stages=stages)):
                break
        out = replace(out, stages=stages)
        why = ("stages of different degrees " + ", ".join(f"{dd}x{tt}" for dd, tt in sorted(degrees))
               if len(degrees) > 1 else f"{engine}'s pipeline has no tensor parallelism (without Megatron-LM)")
        idle = plan.num_devices - pp * d * t
        changes.append(f"{why} -> every stage data x{d} tensor x{t}" + (f" ({idle} device(s) left idle)" if idle else ""))
    zeros = {s.zero for s in out.stages}
    z = max(zeros)
    allowed = cap.zero if out.num_stages > 1 else cap.zero_single_stage
    if z not in allowed:
        z = cap.zero_map[z]
    if zeros != {z}:
        changes.append(f"ZeRO {sorted(zeros)} per stage -> ZeRO-{z} on every stage"
                       + (f" ({engine} supports {list(allowed)}" + (" with pipelining)" if out.num_stages > 1 else ")")))
        out = replace(out, stages=tuple(replace(s, zero=z if s.data_degree > 1 else 0) for s in out.stages))
    recomputes = {s.recompute for s in out.stages}
    if "selective" in recomputes and not cap.selective:
        changes.append(f"selective recompute -> full recompute ({engine} does not run torchtitan's per-operation"
                       " policy)")
        out = replace(out, stages=tuple(replace(s, recompute="full" if s.recompute == "selective" else s.recompute)
                                        for s in out.stages))
        recomputes = {s.recompute for s in out.stages}
    if len(recomputes) > 1:
        changes.append("recompute on some stages -> recompute on every stage (one setting for the whole model)")
        out = replace(out, stages=tuple(replace(s, recompute="full") for s in out.stages))
    if changes:
        out = replace(out, extra={**plan.extra, "nearest_for": engine, "changes": changes})
    return out, changes


def _grids(plan: Plan, per_stage: int, *, tensor: bool) -> list[tuple[int, int]]:
    """The (data, tensor) pairs of ``k <= per_stage`` devices whose data degree divides the micro-batch, largest
    ``k`` first, then closest to the plan's stages (weighted by their layers); ends with ``(1, 1)``."""
    def distance(pair: tuple[int, int]) -> float:
        d, t = pair
        return sum(s.num_layers * (abs(math.log2(s.data_degree / d)) + abs(math.log2(s.tensor_degree / t)))
                   for s in plan.stages)

    out: list[tuple[int, int]] = []
    for k in range(per_stage, 0, -1):
        pairs = [(k // t, t) for t in range(1, k + 1) if k % t == 0 and (tensor or t == 1)]
        out += sorted(((d, t) for d, t in pairs if plan.microbatch_size % d == 0), key=lambda p: (distance(p), -p[1]))
    return out
