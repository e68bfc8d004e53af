"""The schedule played out in time (report/timeline.py): boxes worked out by hand from the schedule's rules."""

from __future__ import annotations

import pytest

from hybridplan.plan import Plan
from hybridplan.report.timeline import StageDurations, model_durations, play, unit_durations


def _plan(schedule: str = "1f1b", layers: tuple[int, int] = (1, 1), m: int = 2, recompute: str = "none") -> Plan:
    a, b = layers
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 2 * m, "num_microbatches": m, "stages": [
        {"layers": [0, a], "parallelism": "none", "degree": 1, "devices": [0], "recompute": recompute},
        {"layers": [a, a + b], "parallelism": "none", "degree": 1, "devices": [1]}]})


def _boxes(timeline) -> dict[tuple[int, str], tuple[float, float]]:
    return {(b.stage, f"{b.kind}{'' if b.microbatch is None else b.microbatch}"): (b.start, b.end)
            for b in timeline.boxes}


def test_1f1b_on_two_stages_with_unit_times():
    """Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1; forward 1, backward 2 (one layer each). By hand: stage 1's
    F0 waits for stage 0's F0 (ends at 1); stage 0's B0 for stage 1's B0 (ends at 4); stage 1's F1 for its own B0."""
    timeline = play(_plan(), unit_durations(_plan()), unit="unit", source="unit")
    assert _boxes(timeline) == {
        (0, "F0"): (0, 1), (0, "F1"): (1, 2), (0, "B0"): (4, 6), (0, "B1"): (7, 9),
        (1, "F0"): (1, 2), (1, "B0"): (2, 4), (1, "F1"): (4, 5), (1, "B1"): (5, 7)}
    assert timeline.length == 9
    assert (timeline.bubble(0), timeline.bubble(1)) == (3, 3)  # 9 minus 1 + 1 + 2 + 2 busy


def test_gpipe_runs_every_forward_first_and_a_transfer_delays_the_receiver():
    plan = _plan("gpipe")
    timeline = play(plan, [StageDurations(1, 2, transfer=0.5), StageDurations(1, 2)], unit="s", source="t")
    got = _boxes(timeline)
    assert got[(1, "F0")] == (1.5, 2.5)  # stage 0's F0 ends at 1, crosses in 0.5
    assert got[(1, "F1")] == (2.5, 3.5)
    assert got[(1, "B1")] == (5.5, 7.5) and got[(1, "B0")] == (3.5, 5.5)  # GPipe: B0 then B1, after all forwards
    assert got[(0, "B0")] == (6.0, 8.0)  # stage 1's B0 ends at 5.5, its gradient crosses back in 0.5


def test_unit_times_count_layers_and_recompute_adds_a_forward():
    plan = _plan(layers=(3, 2), recompute="full")
    assert unit_durations(plan) == [StageDurations(3, 9), StageDurations(2, 4)]


def test_the_time_models_terms_become_the_boxes_and_the_closing_sync_and_step():
    from hybridplan.predict.time_breakdown import StageTime, TimeBreakdown

    stages = (StageTime(start=0, stop=1, kind="data", devices=(0, 1), forward_s=1.0, backward_s=2.0, tensor_comm_s=0.4,
                        p2p_s=0.6, sync_s=0.25, optimizer_s=0.5, recompute_s=1.0, shard_comm_s=0.2),
              StageTime(start=1, stop=2, kind="none", devices=(2,), forward_s=1.0, backward_s=2.0, tensor_comm_s=0.0,
                        p2p_s=0.0, sync_s=0.0))
    breakdown = TimeBreakdown(stages=stages, num_microbatches=2, microbatch_size=1, pipeline_s=0.0, sync_s=0.25)
    durations = model_durations(breakdown)
    assert durations[0] == StageDurations(1.3, 3.3, 0.3, 0.75)
    assert durations[1] == StageDurations(1.0, 2.0, 0.0, 0.0)
    timeline = play(_plan(), durations, unit="s", source="t")
    steps = [b for b in timeline.boxes if b.kind == "step"]
    last_backward = max(b.end for b in timeline.boxes if b.stage == 0 and b.kind == "B")
    assert len(steps) == 1 and steps[0].stage == 0 and steps[0].start == last_backward
    assert steps[0].duration == pytest.approx(0.75)
