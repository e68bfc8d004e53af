"""The memory-minimising plan from a profile database (workflows/plan_memory.py), on the MLP's memory profile of
``mlp_files`` (tests/conftest.py: 1x4, global batch 32 in 2 micro-batches, pipeline and tensor x2 statistics)."""

from __future__ import annotations

import pytest

from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.plan_memory import held_fixed, plan_memory
from tests.cli.conftest import MIXED, MLP


@pytest.fixture(scope="module")
def db(mlp_files):
    return mlp_files / "p.sqlite"


def _plan(*stages: tuple[int, int, str, list[int]]) -> Plan:
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 2, "stages": [
        {"layers": [a, b], "parallelism": kind, "degree": len(devices), "devices": devices} for a, b, kind, devices in stages]})


def test_the_answer_is_annotated_and_predicted_as_the_predictor_predicts_it(db):
    answer = plan_memory(db, Cluster.parse("1x4"))
    answer.plan.validate(num_layers=5, cluster=Cluster.parse("1x4"))
    predicted = MemoryPredictor.from_db(db).predict(answer.plan)
    assert answer.prediction.peak_memory_bytes == predicted.peak_memory_bytes
    assert answer.plan.extra == {"model": MLP, "cluster": "1x4", "predicted_peak_bytes": predicted.peak_memory_bytes}
    assert answer.model == MLP and answer.cluster.shape == "1x4" and answer.tried == ()
    assert (answer.plan.schedule, answer.plan.global_batch_size, answer.plan.num_microbatches) == ("1f1b", 32, 2)


def test_no_plan_tried_here_is_lower(db):
    best = plan_memory(db, Cluster.parse("1x4")).prediction.peak_memory_bytes
    predictor = MemoryPredictor.from_db(db)
    others = [Plan.from_dict(MIXED), _plan((0, 5, "none", [0])),
              _plan((0, 1, "none", [0]), (1, 2, "none", [1]), (2, 3, "none", [2]), (3, 5, "none", [3])),
              _plan((0, 3, "tensor", [0, 1]), (3, 5, "tensor", [2, 3]))]
    assert all(best <= predictor.predict(p).peak_memory_bytes for p in others)


def test_the_solvers_agree_and_each_is_told_what_is_held_fixed(db):
    notes: list[str] = []
    exact = plan_memory(db, Cluster.parse("1x4"), say=notes.append)
    exhaustive = plan_memory(db, Cluster.parse("1x4"), mode="exhaustive")
    assert exact.plan.stages == exhaustive.plan.stages
    assert exact.search.solver != exhaustive.search.solver
    assert any("held fixed: schedule 1f1b, global batch 32 in 2 micro-batches of 16" in n for n in notes)
    assert held_fixed(MemoryPredictor.from_db(db, num_microbatches=4)).startswith(
        "held fixed: schedule 1f1b, global batch 32 in 4 micro-batches of 8")


def test_targets_other_than_the_profiles_are_searched(db):
    answer = plan_memory(db, Cluster.parse("1x2"), schedule="gpipe", global_batch_size=16, num_microbatches=4)
    plan = answer.plan
    assert (plan.schedule, plan.global_batch_size, plan.num_microbatches, plan.num_devices <= 2) == ("gpipe", 16, 4, True)


def test_a_best_plan_over_the_capacity_is_refused_naming_the_device_and_the_excess(db):
    peak = plan_memory(db, Cluster.parse("1x4")).prediction.peak_memory_bytes
    with pytest.raises(PlanError, match=r"does not fit: device \d+ \(stage \d+\) needs .*, 1 B more than its") as e:
        plan_memory(db, Cluster.parse("1x4", device_memory=peak - 1))
    assert "so no plan of this search fits" in e.value.message
    # the remedies: the next micro-batch count that divides 32 is 4, 8 samples each instead of 16
    assert "--num-microbatches 4: 8 samples each instead of 16" in e.value.fix
    assert plan_memory(db, Cluster.parse("1x4", device_memory=peak)).prediction.peak_memory_bytes == peak


def test_fewest_devices_tries_the_smaller_meshes_first(db):
    one = plan_memory(db, Cluster.parse("1x1")).prediction.peak_memory_bytes
    two = plan_memory(db, Cluster.parse("1x2")).prediction.peak_memory_bytes
    assert two < one
    answer = plan_memory(db, Cluster.parse("1x4", device_memory=(one + two) // 2), fewest=True)
    assert answer.cluster.shape == "1x2" and answer.plan.num_devices <= 2
    assert [(t.num_nodes, t.devices_per_node, t.fits) for t in answer.tried] == [(1, 1, False), (1, 2, True)]
    with pytest.raises(UsageError, match="needs a device capacity"):
        plan_memory(db, Cluster.parse("1x4"), fewest=True)
