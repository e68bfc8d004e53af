"""Pipeline schedules: a typed registry, and each schedule as lists of actions with a dry-run checker.

An action is a forward ``F`` or backward ``B`` of one micro-batch on one stage, written like
torch.distributed.pipelining's IR: ``"F3"`` / ``"B0"`` (:meth:`Action.from_str` parses it back). Every
rank of a stage executes the stage's list in order; the data- or tensor-parallel ranks of one stage
run the same list, which keeps their collectives in step.

- GPipe (Huang et al., 2019): all forwards, then all backwards; every micro-batch's activations are
  alive at the turn, so the in-flight count is m on every stage.
- 1F1B (PipeDream-Flush, Narayanan et al., 2021): stage s of p runs ``p - s - 1`` warm-up forwards,
  then alternates one forward and one backward, then drains the backwards; at most ``min(p - s, m)``
  micro-batches are in flight on stage s, which is why the first stage holds the most activations.
- "flush" (PipeDream-Flush, Narayanan et al., ICML 2021; seed 003: "simply GPipe with 1F1B scheduling") is
  1F1B under its paper's name: the same actions.
- "2bw" (PipeDream-2BW, same paper) runs the 1F1B order too; what differs is the weights, not the order:
  two weight versions per stage, gradients computed on the older one (runtime/weight_stash.py), and no
  pipeline flush between iterations.

What differs between schedules lives in one place, :data:`SCHEDULE_SPECS`: the action order, the weight
versions a stage keeps, and whether the pipeline flushes each iteration. Code asks the spec
(``spec(name).weight_versions == 2``), not the name.

This module imports no torch: plans, predictions and searches use it without the runtime.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast, get_args

from hybridplan.errors import PlanError
from hybridplan.limits import shown

__all__ = [
    "Schedule",
    "ScheduleSpec",
    "SCHEDULE_SPECS",
    "SCHEDULES",
    "ONE_F_ONE_B",
    "spec",
    "as_schedule",
    "Action",
    "stage_actions",
    "max_in_flight",
    "check_schedule",
    "in_flight_count",
]

Schedule = Literal["gpipe", "1f1b", "flush", "2bw"]
"""The pipeline schedules the runtime executes, the predictor replays and the cost model times."""

Order = Literal["gpipe", "1f1b"]
"""The two action orders: all forwards then all backwards, or one forward one backward."""


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """What a schedule does, as the runtime, the memory predictor and the time model need it."""

    name: Schedule
    """The schedule's name in plans and on the command line."""
    order: Order
    """Its action order (:func:`stage_actions`)."""
    weight_versions: int = 1
    """Weight versions a stage keeps: 2 for PipeDream-2BW's double buffering (runtime/weight_stash.py)."""
    flushes: bool = True
    """Whether the pipeline drains every iteration (AMP's eq. 5 counts the fill and drain); 2BW never does."""
    source: str = ""
    """Where the schedule is defined."""


SCHEDULE_SPECS: dict[Schedule, ScheduleSpec] = {
    "gpipe": ScheduleSpec(name="gpipe", order="gpipe", source="Huang et al., GPipe, NeurIPS 2019"),
    "1f1b": ScheduleSpec(name="1f1b", order="1f1b", source="Narayanan et al., PipeDream-Flush, ICML 2021"),
    "flush": ScheduleSpec(name="flush", order="1f1b", source="PipeDream-Flush under its paper's name (seed 003)"),
    "2bw": ScheduleSpec(name="2bw", order="1f1b", weight_versions=2, flushes=False,
                        source="Narayanan et al., PipeDream-2BW, ICML 2021 (seed 003)"),
}
"""Every schedule, by name (the keys are exactly :data:`Schedule`'s values)."""

SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
"""The schedule names, in registry order (for argparse choices and messages)."""

ONE_F_ONE_B: tuple[Schedule, ...] = tuple(n for n, s in SCHEDULE_SPECS.items() if s.order == "1f1b")
"""Schedules that run the 1F1B action order (PipeDream-Flush is 1F1B; PipeDream-2BW adds a weight stash)."""


def as_schedule(name: object) -> Schedule:
    """``name`` as a :data:`Schedule`.

    Raises:
        PlanError: for anything that is not a schedule name, listing them.
    """
    if not isinstance(name, str) or name not in SCHEDULE_SPECS:
        raise PlanError(f"unknown schedule {shown(name)}", fix=f"use one of {list(SCHEDULES)}")
    return cast(Schedule, name)


def spec(name: str) -> ScheduleSpec:
    """The :class:`ScheduleSpec` of schedule ``name`` (raises :class:`PlanError` for an unknown one)."""
    return SCHEDULE_SPECS[as_schedule(name)]


_ACTION = re.compile(r"^(F|B)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of a stage: forward (``"F"``) or backward (``"B"``) of ``microbatch``."""

    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"

    @classmethod
    def from_str(cls, text: str) -> Action:
        """Parse ``"F3"`` / ``"B0"``."""
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected e.g. 'F3' or 'B0')")
        return cls(match.group(1), int(match.group(2)))


def stage_actions(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> list[Action]:
    """The ordered actions of ``stage`` (0-based) in a pipeline of ``num_stages`` stages.

    Example:
        >>> " ".join(map(str, stage_actions("1f1b", 3, 0, 4)))
        'F0 F1 F2 B0 F3 B1 B2 B3'
    """
    m = num_microbatches
    order = spec(schedule).order
    if not 0 <= stage < num_stages:
        raise PlanError(f"stage {stage} out of range for a pipeline of {num_stages} stages")
    if order == "gpipe":
        return [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    warmup = min(num_stages - stage - 1, m)
    actions = [Action("F", j) for j in range(warmup)]
    for j in range(m - warmup):
        actions.append(Action("F", warmup + j))
        actions.append(Action("B", j))
    actions += [Action("B", j) for j in range(m - warmup, m)]
    return actions


@functools.lru_cache(maxsize=65536)
def in_flight_count(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> int:
    """Micro-batches whose activations are alive at once on ``stage`` (the schedule's memory driver; counted once
    per arguments: a search asks for every stage of thousands of plans, each a walk over the stage's actions)."""
    return max_in_flight(stage_actions(schedule, num_stages, stage, num_microbatches))


def max_in_flight(actions: Sequence[Action]) -> int:
    """Largest number of micro-batches forwarded but not yet backwarded at any point of ``actions``."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak


def check_schedule(per_stage: Sequence[Sequence[Action]]) -> list[tuple[int, Action]]:
    """Dry-run the stages' action lists together; return the global order in which they can execute.

    ``F j`` on stage s needs ``F j`` done on stage s-1; ``B j`` needs ``F j`` done on s and ``B j``
    done on s+1. Sends never block (the runtime posts them asynchronously).

    Raises:
        PlanError: on a deadlock, naming each stuck stage's next action.
    """
    done: set[tuple[int, Action]] = set()
    pos = [0] * len(per_stage)
    order: list[tuple[int, Action]] = []
    total = sum(len(a) for a in per_stage)
    last = len(per_stage) - 1
    while len(order) < total:
        progressed = False
        for s, actions in enumerate(per_stage):
            if pos[s] == len(actions):
                continue
            a = actions[pos[s]]
            if a.kind == "F":
                ready = s == 0 or (s - 1, Action("F", a.microbatch)) in done
            else:
                ready = (s, Action("F", a.microbatch)) in done and (
                    s == last or (s + 1, Action("B", a.microbatch)) in done
                )
            if ready:
                done.add((s, a))
                order.append((s, a))
                pos[s] += 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"stage {s} at {per_stage[s][pos[s]]}" for s in range(len(per_stage)) if pos[s] < len(per_stage[s]))
            raise PlanError(f"schedule deadlocks after {len(order)} of {total} actions: {stuck}")
    return order
