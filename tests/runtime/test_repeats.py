"""A simulated device that replays the blocks of actions that repeat reports what tracing every action reports.

runtime/repeats.py [Note: skipping repeated blocks]: each plan below is simulated twice, once replaying the
steady state's repeated blocks and once tracing every action (``skip_repeats=False``), and every field of the
report but the wall times must be equal: peaks, reserved peaks (the allocator's layout drifts from block to
block, so its replay must give each block its own bytes), static and data bytes, breakdown at the peak, and
the per-action timeline. Where 1F1B has a steady state, blocks must actually have been replayed, and a long
run must trace a bounded number of actions.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.plan.schedule import Action, stage_actions
from hybridplan.runtime import executor as executor_module
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.repeats import run_actions
from hybridplan.runtime.sim import simulate_stage


def _plan(schedule: str, micro: int, stages: list[dict[str, Any]], batch: int | None = None) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch or micro * 2, "num_microbatches": micro,
                           "stages": stages})


def _stage(start: int, stop: int, devices: list[int], kind: str = "none", **extra: Any) -> dict[str, Any]:
    return {"layers": [start, stop], "parallelism": kind, "degree": len(devices), "devices": devices, **extra}


CASES = [
    pytest.param("gpt-tiny", "cpu", "fp32", False,
                 _plan("1f1b", 8, [_stage(0, 5, [0, 1], "data"), _stage(5, 10, [2])]), True, id="gpt-cpu-1f1b-data"),
    pytest.param("hf:llama-tiny", "cuda", "bf16", True,
                 _plan("1f1b", 8, [_stage(0, 2, [0, 1], "data", zero=3), _stage(2, 4, [2, 3], "tensor")]), True,
                 id="llama-cuda-1f1b-zero3-tensor-recompute"),
    pytest.param("hf:llama-tiny", "cuda", "bf16", False,
                 _plan("1f1b", 8, [_stage(0, 2, [0, 1, 2, 3], "data+tensor", tensor_degree=2, zero=2),
                                    _stage(2, 4, [4, 5], "data", zero=1)], batch=16), True,
                 id="llama-cuda-1f1b-data-tensor-zero2-zero1"),
    pytest.param("hf:llama-tiny", "cuda", "bf16", False,
                 _plan("2bw", 8, [_stage(0, 2, [0]), _stage(2, 4, [1])]), True, id="llama-cuda-2bw"),
    pytest.param("hf:llama-tiny", "cuda", "bf16", False,
                 _plan("gpipe", 8, [_stage(0, 2, [0]), _stage(2, 4, [1])]), False, id="llama-cuda-gpipe"),
]


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The counts of actions replayed, not traced, in the runs of the test."""
    counts: list[int] = []

    def counting(actions: Any, execute: Any, **kw: Any) -> Any:
        return run_actions(actions, execute, on_replay=counts.append, **kw)

    monkeypatch.setattr(executor_module, "run_actions", counting)
    return counts


@pytest.mark.parametrize("model,device,precision,recompute,plan,steady", CASES)
def test_replayed_blocks_report_what_tracing_reports(replays: list[int], model: str, device: str, precision: str,
                                                     recompute: bool, plan: Plan, steady: bool) -> None:
    cfg = RunConfig(model=model, plan=plan, cluster=Cluster.uniform(1, plan.num_devices, device_type=device),
                    backend="sim", device_type=device, precision=precision, activation_checkpointing=recompute)
    for index, stage in enumerate(plan.stages):
        for rank in stage.devices[:1]:  # what replaying does is per device: one of each stage
            replayed = simulate_stage(cfg, index, rank=rank)
            traced = simulate_stage(cfg, index, rank=rank, skip_repeats=False)
            assert replace(replayed, seconds=[]) == replace(traced, seconds=[]), f"stage {index} device {rank}"
            assert len(replayed.timeline) == len(traced.timeline) == 2 * plan.num_microbatches + 1
    if steady:
        assert sum(replays) > 0
    else:
        assert replays == []


def test_a_long_run_traces_a_bounded_number_of_actions(replays: list[int]) -> None:
    """64 micro-batches on a two-stage 1F1B pipeline: most of each iteration's 128 actions are replayed."""
    plan = _plan("1f1b", 64, [_stage(0, 2, [0]), _stage(2, 4, [1])])
    cfg = RunConfig(model="hf:llama-tiny", plan=plan, cluster=Cluster.uniform(1, 2, device_type="cuda"),
                    backend="sim", device_type="cuda", precision="bf16")
    for index in range(2):
        replays.clear()
        report = simulate_stage(cfg, index, iterations=2)
        assert len(report.timeline) == 129
        assert len(replays) == 2  # once per iteration
        assert all(count >= 100 for count in replays)


class _SameEveryTime:
    """A meter whose structure and events never change: every block looks like the one before it."""

    def structure(self) -> Hashable:
        return ()

    def begin_trace(self) -> None:
        pass

    def take_events(self) -> tuple[tuple[Any, ...], ...]:
        return ()

    def end_trace(self) -> None:
        pass

    def replay(self, actions: Sequence[Sequence[tuple[Any, ...]]]) -> list[tuple[int, int, int]]:
        return [(0, 0, 0)] * len(actions)

    def snapshot(self) -> list[tuple[Any, Any]]:
        return []

    def adopt(self, snapshot: list[tuple[Any, Any]]) -> None:
        pass


@pytest.mark.parametrize("schedule, stages, stage", [("gpipe", 1, 0), ("1f1b", 18, 0), ("1f1b", 4, 1)])
def test_only_blocks_that_keep_the_stash_are_replayed(schedule: str, stages: int, stage: int) -> None:
    """A run of forwards may leave the memory's structure as it was (a recomputed stage of the embedding alone
    stashes views of the batch) while the stash grows: replaying it and renumbering the actions after it backwarded
    micro-batch -8 on Llama-3-8B's first stage of 18 with 16 micro-batches. Every backward must find its forward."""
    actions = stage_actions(schedule, stages, stage, 16)
    stash: set[int] = set()
    replayed: list[int] = []

    def execute(action: Action) -> tuple[int, int, int]:
        if action.kind == "F":
            stash.add(action.microbatch)
        else:
            stash.remove(action.microbatch)  # a KeyError where renumbering lost the forward
        return (0, 0, 0)

    levels = run_actions(actions, execute, meter=_SameEveryTime(), on_replay=replayed.append)
    assert len(levels) == len(actions) and not stash
    steady = sum(1 for a, b in zip(actions, actions[1:]) if (a.kind, b.kind) == ("F", "B"))
    assert bool(replayed) == (steady > 4)  # 1F1B's steady pairs still replay
