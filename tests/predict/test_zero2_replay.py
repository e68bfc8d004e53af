"""[Note: predicting ZeRO-2 from the ZeRO-3 scenario] (predict/zero2_replay.py): the gathered backward's transient
and the replay of a ZeRO-2 stage's actions, by hand."""

from __future__ import annotations

import numpy as np

from hybridplan.predict.zero2_replay import Zero2Transients, gathered_backward_transient, zero2_peak


def test_gathered_backward_transient_by_hand():
    # suffixes' backward transients (layers 0.., 1.., 2..) 50, 70, 40: layer 2 sets 40 - 5, layer 1 70 - (20 + 5)
    assert gathered_backward_transient([50, 70, 40], [10, 20, 5], 0) == 45
    # 50, 30, 40: layer 1 raises nothing; layer 0 raises it to 50, which is 50 - 35 = 15 under ZeRO-2; layer 2's 35
    assert gathered_backward_transient([50, 30, 40], [10, 20, 5], 0) == 35


def test_zero2_replay_by_hand():
    """static 100, activation 10, gradient 6, gathered 50; transients F 7 (gathering) / 3 (gathered), first B 4,
    gathered B 2, B 8 (resharded), step 1."""
    q = np.array([100, 0, 10, 6, 3, 20, 8, 1])
    t = Zero2Transients(gathering_forward=7, gathered_forward=3, first_backward=4, gathered_backward=2)
    # GPipe F0 F1 B0 B1: F0 gathers (107, level 160), F1 (163, 170), B0 frees them (174, 170 + 6 - 10 - 50 = 116),
    # B1 finds them resharded (124, 106), step 107
    assert zero2_peak(q, t, 50, "gpipe", 0, 2) == 174
    # 1F1B, one stage after: F0 F1 B0 F2 B1 B2 (3 micro-batches): F0 107 -> 160, F1 163 -> 170, B0 174 -> 116,
    # F2 gathers again 123 -> 176, B1 gathered 178 -> 116, B2 resharded 114 -> 96
    assert zero2_peak(q, t, 50, "1f1b", 1, 3) == 178


def _replayed(q, t, gathered, schedule, stages_after, m):
    """The Note's replay action by action (the reference the coefficient rows must equal)."""
    from hybridplan.plan.schedule import stage_actions
    from hybridplan.profiling.quantities import INDEX

    after = 0 if schedule == "gpipe" else min(stages_after, m)
    level, peak, held, first = q[INDEX["static"]] + q[INDEX["data"]], -np.inf, False, True
    for a in stage_actions(schedule, after + 1, 0, m):
        if a.kind == "F":
            peak = max(peak, level + (t.gathered_forward if held else t.gathering_forward))
            level += q[INDEX["activation"]] + (0 if held else gathered)
            held = True
        else:
            if first:
                peak = max(peak, level + (t.first_backward if held else q[INDEX["first_backward_transient"]]))
                level += q[INDEX["gradient"]]
            else:
                peak = max(peak, level + (t.gathered_backward if held else q[INDEX["backward_transient"]]))
            level -= q[INDEX["activation"]] + (gathered if held else 0)
            held, first = False, False
    return max(peak, level - q[INDEX["data"]] + q[INDEX["step_transient"]])


def test_the_coefficient_rows_equal_the_replay_on_every_position():
    """zero2_peak is max(C @ x) with C built once per action list; on random quantities (byte counts) it equals the
    action-by-action replay, both schedules, 1-6 micro-batches, every position."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        q = rng.integers(0, 10**9, 8).astype(float)
        t = Zero2Transients(*(float(v) for v in rng.integers(0, 10**8, 4)))
        gathered = float(rng.integers(0, 10**9))
        for schedule in ("gpipe", "1f1b"):
            for m in range(1, 7):
                for after in range(8):
                    assert zero2_peak(q, t, gathered, schedule, after, m) == _replayed(q, t, gathered, schedule, after, m)


def test_an_unknown_quantity_leaves_out_only_the_moments_that_need_it():
    """A NaN the replay does not use (the forward transient) changes nothing; one it uses (the step's transient)
    leaves out that moment only, as the action-by-action replay's ``max`` does."""
    q = np.array([100, 0, 10, 6, 3, 20, 8, 1], dtype=float)
    t = Zero2Transients(gathering_forward=7, gathered_forward=3, first_backward=4, gathered_backward=2)
    unused = q.copy()
    unused[4] = np.nan
    assert zero2_peak(unused, t, 50, "gpipe", 0, 2) == zero2_peak(q, t, 50, "gpipe", 0, 2) == 174
    no_step = q.copy()
    no_step[7] = np.nan
    assert zero2_peak(no_step, t, 50, "1f1b", 1, 3) == _replayed(no_step, t, 50, "1f1b", 1, 3) == 178


def test_an_infinite_transient_is_a_moment_like_any_other():
    """A transient of -inf (no layer sets it) is a moment that never sets the peak; +inf one that always does."""
    q = np.array([100, 0, 10, 6, 3, 20, 8, 1], dtype=float)
    for first in (-np.inf, np.inf):
        t = Zero2Transients(gathering_forward=7, gathered_forward=3, first_backward=first, gathered_backward=2)
        assert zero2_peak(q, t, 50, "1f1b", 1, 3) == _replayed(q, t, 50, "1f1b", 1, 3)
