"""Pipeline schedules as lists of actions, with a dry-run checker.

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
  two weight versions per stage, gradients computed on the older one (runtime/weight_stash.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hybridplan.errors import PlanError

__all__ = ["Action", "ONE_F_ONE_B", "stage_actions", "max_in_flight", "check_schedule", "in_flight_count"]

ONE_F_ONE_B: tuple[str, ...] = ("1f1b", "flush", "2bw")
"""Schedules that run the 1F1B action order (PipeDream-Flush is 1F1B; PipeDream-2BW adds a weight stash)."""

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
    if not 0 <= stage < num_stages:
        raise PlanError(f"stage {stage} out of range for a pipeline of {num_stages} stages")
    if schedule == "gpipe":
        return [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]
    if schedule in ONE_F_ONE_B:
        warmup = min(num_stages - stage - 1, m)
        actions = [Action("F", j) for j in range(warmup)]
        for j in range(m - warmup):
            actions.append(Action("F", warmup + j))
            actions.append(Action("B", j))
        actions += [Action("B", j) for j in range(m - warmup, m)]
        return actions
    raise PlanError(f"unknown schedule {schedule!r}", fix="use 'gpipe', '1f1b', 'flush' or '2bw'")


def in_flight_count(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> int:
    """Micro-batches whose activations are alive at once on ``stage`` (the schedule's memory driver)."""
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
