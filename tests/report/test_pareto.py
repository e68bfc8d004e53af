"""The memory/time front (report/pareto.py): every strategy of the throughput search priced by the memory
predictor and the time model, the non-dominated ones flagged, the user's plans marked at their own prices.

Uses the MLP's memory and time profiles of ``mlp_files`` (tests/conftest.py)."""

from __future__ import annotations

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.report.pareto import memory_time_front, plan_label
from tests.cli.conftest import MIXED


def test_plan_label_names_each_stage_in_order():
    assert plan_label(Plan.from_dict(MIXED)) == "[0,2) tensor2 | [2,3) none1 | [3,5) none1"


@pytest.fixture(scope="module")
def front(mlp_files):
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    profile = TimeProfile.load(mlp_files / "t.json")
    cluster = Cluster.parse("1x4")
    view, unpriced = memory_time_front(predictor, profile, cluster, title="mlp", marks={"mixed": Plan.from_dict(MIXED)})
    return view, unpriced, predictor, profile, cluster


def test_every_point_is_priced_by_both_models(front):
    view, unpriced, predictor, profile, cluster = front
    assert view.title == "mlp" and view.points and unpriced >= 0
    for p in view.points:
        plan = Plan.from_dict(p.plan)
        assert p.peak_memory_bytes == predictor.predict(plan).peak_memory_bytes
        assert p.iteration_s == pytest.approx(predict_iteration_time(plan, profile, cluster).total_s, rel=1e-12)


def test_the_flagged_points_are_exactly_the_non_dominated_ones(front):
    points = front[0].points

    def dominated(p):
        return any(q.peak_memory_bytes <= p.peak_memory_bytes and q.iteration_s <= p.iteration_s
                   and (q.peak_memory_bytes, q.iteration_s) != (p.peak_memory_bytes, p.iteration_s) for q in points)

    assert any(p.frontier for p in points)
    for p in points:
        if p.frontier:
            assert not dominated(p), p.label
        else:  # beaten, or a duplicate of a frontier point
            assert dominated(p) or any(q.frontier and (q.peak_memory_bytes, q.iteration_s) ==
                                       (p.peak_memory_bytes, p.iteration_s) for q in points), p.label


def test_a_marked_plan_is_priced_like_the_others_and_not_on_the_front(front):
    view, _, predictor, profile, cluster = front
    (mark,) = view.marks
    plan = Plan.from_dict(MIXED)
    assert mark.label == "mixed" and mark.frontier is False and mark.plan == plan.to_dict()
    assert mark.peak_memory_bytes == predictor.predict(plan).peak_memory_bytes
    assert mark.iteration_s == predict_iteration_time(plan, profile, cluster).total_s
