import pytest

from hybridplan.errors import PlanError
from hybridplan.plan.schedule import Action, check_schedule, in_flight_count, max_in_flight, stage_actions


def test_action_round_trip():
    for text in ("F0", "B12"):
        assert str(Action.from_str(text)) == text
    with pytest.raises(ValueError):
        Action.from_str("X1")


def test_gpipe_order():
    assert " ".join(map(str, stage_actions("gpipe", 3, 1, 3))) == "F0 F1 F2 B0 B1 B2"


@pytest.mark.parametrize("p, m", [(1, 1), (2, 4), (4, 8), (4, 2), (5, 3), (8, 8)])
def test_1f1b_structure(p, m):
    for s in range(p):
        actions = stage_actions("1f1b", p, s, m)
        assert sorted(a for a in actions if a.kind == "F") == [Action("F", j) for j in range(m)]
        assert [a for a in actions if a.kind == "B"] == [Action("B", j) for j in range(m)]
        # each backward follows its own forward
        assert all(actions.index(Action("F", j)) < actions.index(Action("B", j)) for j in range(m))
        # PipeDream-Flush keeps at most p - s micro-batches in flight on stage s
        assert max_in_flight(actions) == min(p - s, m)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (3, 2), (6, 6)])
def test_schedules_do_not_deadlock(schedule, p, m):
    order = check_schedule([stage_actions(schedule, p, s, m) for s in range(p)])
    assert len(order) == 2 * p * m


def test_gpipe_in_flight_is_all_microbatches():
    assert [in_flight_count("gpipe", 4, s, 8) for s in range(4)] == [8, 8, 8, 8]
    assert [in_flight_count("1f1b", 4, s, 8) for s in range(4)] == [4, 3, 2, 1]


def test_checker_reports_deadlock():
    # stage 1 wants B0 before its own F0 has run: impossible
    bad = [[Action("F", 0), Action("B", 0)], [Action("B", 0), Action("F", 0)]]
    with pytest.raises(PlanError, match="deadlocks after 1 of 4 actions: stage 0 at B0, stage 1 at B0"):
        check_schedule(bad)


def test_unknown_schedule():
    with pytest.raises(PlanError, match="unknown schedule"):
        stage_actions("zb", 2, 0, 2)


def test_the_registry_is_the_schedule_type():
    from typing import get_args

    from hybridplan.plan.schedule import SCHEDULE_SPECS, SCHEDULES, Schedule, as_schedule, spec

    assert tuple(SCHEDULE_SPECS) == SCHEDULES == get_args(Schedule)
    assert [s for s in SCHEDULES if spec(s).weight_versions == 2] == ["2bw"]
    assert [s for s in SCHEDULES if not spec(s).flushes] == ["2bw"]
    assert {s: spec(s).order for s in SCHEDULES} == {"gpipe": "gpipe", "1f1b": "1f1b", "flush": "1f1b", "2bw": "1f1b"}
    assert as_schedule("flush") == "flush"
    with pytest.raises(PlanError, match="unknown schedule 'zero-bubble'"):
        as_schedule("zero-bubble")
