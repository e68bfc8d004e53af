"""Running a stage's action list on a simulated device without tracing the blocks that repeat.

[Note: skipping repeated blocks] A simulated device (runtime/sim.py) traces every operation of every
micro-batch on fake tensors, so a plan's cost grew with its micro-batch count: 512 micro-batches of one
sample, common in deep pipelines, cost 64 times 8. Yet in 1F1B's steady state every pair ``F j+w, B j``
does the same work on the same shapes. What it does to memory is a short list of events on storages
(allocate n bytes under a category, free, re-tag, resize: runtime/memory.py ``StorageTracker.begin_trace``),
and only the caching allocator's block layout (runtime/cuda_allocator.py), which drifts from pair to pair as
blocks split and merge, differs between pairs. So the action list runs as written until a repetition is
SEEN, never assumed:

- a *block* is ``block`` consecutive actions; its *form* is each action's kind and micro-batch relative to
  the block's first, with the micro-batch step from the block before it (1F1B's steady pairs all have one
  form: ``(F, 0), (B, -w)``, step 1);
- between blocks of one form, each block is traced: the live storages' *structure* at its start (each one's
  own bytes and category in allocation order, not its block) and its events, storages named by their place;
- when two traced blocks in a row started from the structure the device is in now and made the same events,
  the following blocks of that form are not traced but *replayed*: their events applied to the storages and
  to the allocator model, which gives every block its own bytes, peaks and layout exactly as tracing would;
  then the program's tensors take over the replayed storages by place in allocation order (``adopt``), and
  the actions after them run with micro-batches renumbered down by the replayed count (the stash holds the
  renumbered micro-batches; every micro-batch has the same shape).

Replaying costs the allocator's bookkeeping, not the operators' dispatch. Where the structure never repeats
(GPipe's forwards grow the stash; a warm-up, a drain) everything is traced. Only blocks that backward as many
micro-batches as they forward are replayed: a run of forwards can leave the memory's structure as it was (a
recomputed first stage holding only the embedding stashes views of the batch, no storage of its own), yet its
stash grows, and renumbering after it sent Llama-3-8B's first stage, [0, 1) recomputed ahead of 17 stages with
16 micro-batches, to a backward of micro-batch -8 (a KeyError, benchmarks/instant_planning's random plans). The result (peaks, breakdown at the
peak, reserved peak, per-action timeline) equals a run that traced every action, byte for byte:
tests/runtime/test_repeats.py checks both on 1F1B, GPipe and 2BW plans, tensor, data and ZeRO stages,
recompute, CPU and CUDA terms.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from hybridplan.plan.schedule import Action

__all__ = ["run_actions", "Replayable", "BLOCK"]

BLOCK = 2
"""Actions per block: 1F1B's steady state alternates one forward and one backward."""


class Replayable(Protocol):
    """What :func:`run_actions` needs of a device's memory meter (runtime/memory.py ``StorageTracker``)."""

    def structure(self) -> Hashable: ...
    def begin_trace(self) -> None: ...
    def take_events(self) -> tuple[tuple[Any, ...], ...]: ...
    def end_trace(self) -> None: ...
    def replay(self, actions: Sequence[Sequence[tuple[Any, ...]]]) -> list[tuple[int, int, int]]: ...
    def snapshot(self) -> list[tuple[Any, Any]]: ...
    def adopt(self, snapshot: list[tuple[Any, Any]]) -> None: ...


def _form(actions: Sequence[Action], start: int, block: int) -> tuple[Any, ...] | None:
    """The form of the block at ``start`` (module note); None where no whole block follows a whole block."""
    if start < block or start + block > len(actions):
        return None
    base = actions[start].microbatch
    step = base - actions[start - block].microbatch
    return (step, tuple((a.kind, a.microbatch - base) for a in actions[start:start + block]))


def _stationary(form: tuple[Any, ...]) -> bool:
    """Whether a block of ``form`` backwards as many micro-batches as it forwards: only then is the stage after it
    the stage before it with its micro-batches renumbered, which a replay assumes of the program's state (the
    stash) beside the memory it replays (module note)."""
    kinds = [kind for kind, _ in form[1]]
    return kinds.count("F") == kinds.count("B")


def run_actions(
    actions: Sequence[Action],
    execute: Callable[[Action], tuple[int, int, int]],
    *,
    meter: Replayable | None = None,
    block: int = BLOCK,
    on_replay: Callable[[int], None] | None = None,
) -> list[tuple[int, int, int]]:
    """Run ``actions`` through ``execute`` (given the action to run, micro-batch renumbered), replaying the
    blocks that repeat (module note); returns each action's (level before, window peak, level after).

    Args:
        actions: the stage's action list.
        execute: runs one action on the device and returns its levels.
        meter: the device's meter; None traces every action.
        block: actions per block.
        on_replay: told how many actions were replayed, not traced, at each replay.
    """
    levels: list[tuple[int, int, int]] = []
    shift = 0
    traced: list[tuple[Hashable, Any, Any]] = []  # (structure at the start, events, form) of the blocks in a row
    i = 0
    while i < len(actions):
        form = _form(actions, i, block) if meter is not None else None
        if meter is None or form is None or not _stationary(form) or form != _form(actions, i - block, block):
            traced.clear()
            action = actions[i]
            levels.append(execute(Action(action.kind, action.microbatch - shift) if shift else action))
            i += 1
            continue
        structure = meter.structure()
        if len(traced) >= 2 and all(t[0] == structure and t[1] == traced[-1][1] and t[2] == form for t in traced[-2:]):
            count = 0
            while _form(actions, i + count * block, block) == form:
                count += 1
            snapshot = meter.snapshot()
            for _ in range(count):
                levels += meter.replay(traced[-1][1])
            meter.adopt(snapshot)
            shift += count * form[0]  # the micro-batches the replayed blocks advanced by
            i += count * block
            traced.clear()
            if on_replay is not None:
                on_replay(count * block)
            continue
        meter.begin_trace()
        try:
            events = []
            for action in actions[i:i + block]:
                levels.append(execute(Action(action.kind, action.microbatch - shift) if shift else action))
                events.append(meter.take_events())
        finally:
            meter.end_trace()
        traced.append((structure, tuple(events), form))
        i += block
    return levels
