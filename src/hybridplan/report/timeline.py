"""When each stage runs each micro-batch's forward and backward: a plan's schedule played out in time.

The time model (predict/time_model.py) gives one number per iteration, from a closed form (AMP's eq. 5 and
[Note: the round trip of 1F1B]); a picture needs every action's start. :func:`play` plays the schedule's
action lists (plan/schedule.py ``stage_actions``) with per-stage durations, under the dependencies the
schedule's dry-run checks (``check_schedule``): ``F j`` on stage ``s`` starts once stage ``s`` is free and
``F j`` of stage ``s - 1`` has ended and crossed the boundary; ``B j`` once ``F j`` ran on ``s`` and ``B j``
of stage ``s + 1`` has ended and crossed back. A stage's replicas (data and tensor) run the same list, so a
stage is one row. What a row does not fill between its first and last action is a bubble.

The durations come from the time model (:func:`model_durations`) or, without layer times, from unit times
(:func:`unit_durations`: forward 1 and backward 2 per layer, the ratio the time model's own unit test and
AMP's profiles use for a layer). Played out, the length of the timeline can differ from the time model's
closed form: eq. 5 bounds the steady state by the slowest stage, the play follows every dependency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridplan.plan import Plan
from hybridplan.plan.schedule import Action, check_schedule, stage_actions
from hybridplan.predict.time_breakdown import TimeBreakdown

__all__ = ["Box", "StageDurations", "Timeline", "play", "unit_durations", "model_durations", "UNIT_FORWARD",
           "UNIT_BACKWARD"]

UNIT_FORWARD = 1.0
"""Unit time of one layer's forward, without a time profile."""
UNIT_BACKWARD = 2.0
"""Unit time of one layer's backward: twice the forward (a backward computes the gradients of both the inputs
and the weights, two matrix products for the forward's one; the ratio AMP's cost model examples assume)."""


@dataclass(frozen=True)
class StageDurations:
    """How long one stage's actions take (seconds, or unit times)."""

    forward: float
    """One micro-batch's forward."""
    backward: float
    """One micro-batch's backward (with its recompute, where the stage recomputes)."""
    transfer: float = 0.0
    """One direction across the boundary to the NEXT stage (an activation forward, its gradient back)."""
    finish: float = 0.0
    """After the stage's last backward: its gradient sync and optimizer step (once per iteration)."""


@dataclass(frozen=True)
class Box:
    """One action of one stage in time: a forward ("F"), a backward ("B"), or the closing sync and step ("step",
    no micro-batch)."""

    stage: int
    kind: str
    microbatch: int | None
    start: float
    duration: float

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class Timeline:
    """Every box of one iteration, and what its times are."""

    boxes: tuple[Box, ...]
    num_stages: int
    unit: str
    """"s" (seconds of the time model), or "unit" (unit times per layer)."""
    source: str
    """Where the durations come from, for the picture's title."""

    @property
    def length(self) -> float:
        """From the first action's start to the last box's end."""
        return max((b.end for b in self.boxes), default=0.0)

    def busy(self, stage: int) -> float:
        """Time ``stage`` spends in its boxes."""
        return sum(b.duration for b in self.boxes if b.stage == stage)

    def bubble(self, stage: int) -> float:
        """Time ``stage`` waits within the iteration: its share of :attr:`length` outside its boxes."""
        return self.length - self.busy(stage)


def play(plan: Plan, durations: Sequence[StageDurations], *, unit: str, source: str) -> Timeline:
    """The plan's schedule played with ``durations`` (one per stage; module docstring).

    Raises:
        PlanError: if the durations do not match the stages (or the schedule deadlocks, which no registered
            schedule does).
    """
    from hybridplan.errors import PlanError

    if len(durations) != plan.num_stages:
        raise PlanError(f"{len(durations)} stage durations for a plan of {plan.num_stages} stages")
    p, m = plan.num_stages, plan.num_microbatches
    lists = [stage_actions(plan.schedule, p, s, m) for s in range(p)]
    ends: dict[tuple[int, Action], float] = {}
    free = [0.0] * p
    boxes: list[Box] = []
    for s, action in check_schedule(lists):  # an order in which every action's dependencies come first
        d = durations[s]
        if action.kind == "F":
            ready = 0.0 if s == 0 else ends[(s - 1, action)] + durations[s - 1].transfer
            length = d.forward
        else:
            ready = ends[(s, Action("F", action.microbatch))]
            if s < p - 1:
                ready = max(ready, ends[(s + 1, action)] + d.transfer)
            length = d.backward
        start = max(free[s], ready)
        boxes.append(Box(s, action.kind, action.microbatch, start, length))
        ends[(s, action)] = free[s] = start + length
    for s, d in enumerate(durations):
        if d.finish > 0:
            boxes.append(Box(s, "step", None, free[s], d.finish))
    return Timeline(tuple(boxes), p, unit, source)


def unit_durations(plan: Plan) -> list[StageDurations]:
    """Forward :data:`UNIT_FORWARD` and backward :data:`UNIT_BACKWARD` per layer of each stage (a recomputed stage's
    backward runs its forward again); no transfers, no step."""
    return [StageDurations(UNIT_FORWARD * s.num_layers,
                           (UNIT_BACKWARD + (UNIT_FORWARD if s.recompute == "full" else 0.0)) * s.num_layers)
            for s in plan.stages]


def model_durations(breakdown: TimeBreakdown) -> list[StageDurations]:
    """Each stage's durations from the time model's terms (predict/time_breakdown.py ``StageTime``).

    The collectives inside a stage's layers (tensor-parallel all-reduces, ZeRO-2/3's gathers and scatters) are
    one term per micro-batch in the model; they are drawn half in the forward and half in the backward (a
    Megatron block all-reduces twice in each: the model's own (2, 2), predict/time_model.py). A transfer is half
    of the boundary's two-way ``p2p_s``; the closing box is the stage's gradient sync and optimizer step.
    """
    out = []
    for t in breakdown.stages:
        inside = (t.tensor_comm_s + t.shard_comm_s) / 2
        out.append(StageDurations(t.forward_s + inside, t.backward_s + t.recompute_s + inside, t.p2p_s / 2,
                                  t.sync_s + t.optimizer_s))
    return out
