"""What the benchmark scripts share (workflows/runs.py): results kept between runs, plans measured on simulated
devices against their predictions, and search-space answers turned into plans.

The measured plans use the MLP's memory profile of ``mlp_files`` (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.errors import UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.search import PlanSpace, enumerate_plans
from hybridplan.workflows.runs import MeasuredPlan, ResultStore, devices_json, measure_plan, plan_from_choices
from hybridplan.workflows.validate import DeviceMemory
from tests.cli.conftest import MIXED, MLP


def test_result_store_resumes(tmp_path):
    store = ResultStore(tmp_path / "r.json")
    store.put("a", {"x": 1})
    assert "a" in ResultStore(tmp_path / "r.json") and json.loads((tmp_path / "r.json").read_text()) == {"a": {"x": 1}}


def test_result_store_replaces_a_key_and_leaves_no_temporary_file(tmp_path):
    store = ResultStore(tmp_path / "r.json")
    store.put("a", 1)
    store.put("b", [2])
    store.put("a", 3)
    again = ResultStore(tmp_path / "r.json")
    assert again["a"] == 3 and again["b"] == [2] and "c" not in again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_measured_plan_peaks_and_their_json_form():
    devices = (DeviceMemory(0, 0, 10, 12), DeviceMemory(1, 1, 30, None), DeviceMemory(2, 1, None, 7))
    measured = MeasuredPlan(Plan.from_dict(MIXED), "ok", None, devices)
    assert measured.peak("predicted") == 30 and measured.peak("measured") == 12  # unknown values left out
    assert MeasuredPlan(Plan.from_dict(MIXED), "failed", "x", ()).peak("measured") is None
    assert devices_json(devices)[1] == {"device": 1, "stage": 1, "predicted": 30, "measured": None}


def test_a_search_space_answer_becomes_the_plan_of_its_stages():
    space = PlanSpace(5, 1, 4)
    for choices in list(enumerate_plans(space))[::37]:
        plan = plan_from_choices(space, choices, schedule="gpipe", global_batch_size=16, num_microbatches=4)
        plan.validate(num_layers=5, cluster=space.cluster())
        assert [(s.start, s.stop, s.degree) for s in plan.stages] == [
            (c.start, c.stop, space.configs[c.config].degree) for c in choices]
        devices = [d for s in plan.stages for d in s.devices]
        assert len(devices) == len(set(devices))  # each device in one stage
        assert (plan.schedule, plan.global_batch_size, plan.num_microbatches) == ("gpipe", 16, 4)


def test_measuring_without_a_profile_needs_the_model():
    with pytest.raises(UsageError, match="needs the model"):
        measure_plan(None, Plan.from_dict(MIXED), cluster=Cluster.parse("1x4"), backend="sim")


def test_a_plan_is_measured_and_paired_with_its_prediction(mlp_files):
    plan = Plan.from_dict(MIXED)
    measured = measure_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse("1x4"), backend="sim", model=MLP)
    assert measured.status == "ok" and [d.device for d in measured.devices] == [0, 1, 2, 3]
    predicted = MemoryPredictor.from_db(mlp_files / "p.sqlite").predict(plan)
    assert [d.predicted for d in measured.devices] == [d.peak_memory_bytes for d in predicted.devices]
    assert all(d.measured and d.measured > 0 for d in measured.devices)


def test_a_plan_the_profile_cannot_predict_is_still_measured(mlp_files):
    """The profile holds no data-parallel statistics (pipeline and tensor x2 only)."""
    plan = Plan.from_dict({**MIXED, "stages": [
        {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [2]}]})
    measured = measure_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse("1x3"), backend="sim", model=MLP)
    assert measured.status == "ok" and measured.peak("predicted") is None
    assert [d.stage for d in measured.devices] == [0, 0, 1] and all(d.measured > 0 for d in measured.devices)
