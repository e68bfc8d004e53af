"""The fastest plans that fit in memory and the memory/time frontier (workflows/plan_throughput.py), on the MLP's
memory and time profiles of ``mlp_files`` (tests/conftest.py)."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.workflows.plan_memory import plan_memory
from hybridplan.workflows.plan_throughput import fits_at_target, plan_throughput
from hybridplan.workflows.sources import Sources
from tests.cli.conftest import MIXED, MLP

CLUSTER = Cluster.parse("1x4")


def _sources(files, db: bool = True) -> Sources:
    return Sources.open(files / "p.sqlite" if db else None, time_profile=str(files / "t.json"), model=MLP)


def test_candidates_fastest_first_each_priced_by_both_models(mlp_files):
    with _sources(mlp_files) as sources:
        answer = plan_throughput(sources, CLUSTER)
    profile, predictor = TimeProfile.load(mlp_files / "t.json"), MemoryPredictor.from_db(mlp_files / "p.sqlite")
    seconds = [c.seconds for c in answer.candidates]
    assert seconds == sorted(seconds) and answer.best is answer.candidates[0] and answer.global_batch_size == 32
    for c in answer.candidates:
        assert c.seconds == pytest.approx(predict_iteration_time(c.plan, profile, CLUSTER).total_s, rel=1e-12)
        assert c.peak == predictor.predict(c.plan).peak_memory_bytes
        assert c.plan.extra["predicted_iteration_s"] == c.seconds and c.plan.extra["predicted_peak_bytes"] == c.peak
        assert c.plan.extra["model"] == MLP and c.plan.extra["cluster"] == "1x4"
        assert c.samples_per_s == pytest.approx(32 / c.seconds)


def test_a_capacity_keeps_only_the_plans_that_fit(mlp_files):
    with _sources(mlp_files) as sources:
        everything = plan_throughput(sources, CLUSTER).candidates
    peaks = sorted({c.peak for c in everything})
    capacity = peaks[len(peaks) // 2]
    with _sources(mlp_files) as sources:
        kept = plan_throughput(sources, Cluster.parse("1x4", device_memory=int(capacity))).candidates
    assert kept and all(c.peak <= capacity for c in kept)
    assert {c.plan.stages for c in kept} == {c.plan.stages for c in everything if c.peak <= capacity}
    with _sources(mlp_files) as sources, pytest.raises(UsageError, match="no feasible plan"):
        plan_throughput(sources, Cluster.parse("1x4", device_memory="1KiB"))


def test_the_frontier_is_non_dominated_and_reaches_the_memory_minimal_plan(mlp_files):
    with _sources(mlp_files) as sources:
        front = plan_throughput(sources, CLUSTER, objective="pareto").candidates
    points = [(c.peak, c.seconds) for c in front]
    assert [p[0] for p in points] == sorted(p[0] for p in points)
    assert [p[1] for p in points] == sorted((p[1] for p in points), reverse=True)
    lowest = plan_memory(mlp_files / "p.sqlite", CLUSTER).prediction.peak_memory_bytes
    assert points[0][0] <= lowest  # the CAPTURE search's answer is a candidate, so nothing on the front is above it
    with _sources(mlp_files, db=False) as sources, pytest.raises(UsageError, match="needs memory predictions"):
        plan_throughput(sources, CLUSTER, objective="pareto", global_batch_size=32)


def test_the_2bw_planner_plans_for_its_own_schedule(mlp_files):
    with _sources(mlp_files) as sources:
        answer = plan_throughput(sources, CLUSTER, mode="2bw")
    assert answer.candidates and all(c.plan.schedule == "2bw" and c.label.startswith("2bw w=") for c in answer.candidates)
    with _sources(mlp_files) as sources, pytest.raises(UsageError, match="whose schedule is '2bw', not 'gpipe'"):
        plan_throughput(sources, CLUSTER, mode="2bw", schedule="gpipe")


def test_fits_at_target_keeps_the_micro_batch_count_and_the_capacity(mlp_files):
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    plan = Plan.from_dict(MIXED)
    peak = predictor.predict(plan).peak_memory_bytes
    fits = fits_at_target(predictor, get_model(MLP), CLUSTER, capacity=peak)
    assert fits(plan) and not fits_at_target(predictor, get_model(MLP), CLUSTER, capacity=peak - 1)(plan)
    assert not fits(Plan.from_dict({**MIXED, "num_microbatches": 4}))  # another micro-batch count
    assert not fits_at_target(predictor, get_model(MLP), Cluster.parse("1x3"), capacity=peak)(plan)  # no device 3
