import json

import pytest

from hybridplan.cluster import Cluster
from hybridplan.errors import PlanError
from hybridplan.models import get_model
from hybridplan.plan import Plan

EXAMPLE = {
    "schedule": "1f1b",
    "global_batch_size": 32,
    "num_microbatches": 8,
    "stages": [
        {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [3, 7], "parallelism": "none", "degree": 1, "devices": [2]},
        {"layers": [7, 10], "parallelism": "data", "degree": 1, "devices": [3]},
    ],
}


def plan(**changes):
    data = json.loads(json.dumps(EXAMPLE))
    data.update(changes)
    return Plan.from_dict(data)


def with_stage(i, **changes):
    data = json.loads(json.dumps(EXAMPLE))
    data["stages"][i].update(changes)
    return Plan.from_dict(data)


def test_example_is_valid_and_round_trips(tmp_path):
    p = plan()
    p.validate(model=get_model("gpt-tiny"), cluster=Cluster.parse("1x4"))
    assert p.microbatch_size == 4 and p.num_layers == 10 and p.num_devices == 4
    assert p.stage_of_device(2) == 1
    f = tmp_path / "p.json"
    p.save(f)
    assert Plan.load(f) == p
    assert json.loads(f.read_text())["stages"][0] == EXAMPLE["stages"][0]


def test_extra_fields_are_kept():
    data = json.loads(json.dumps(EXAMPLE))
    data["note"] = "mine"
    data["stages"][0]["label"] = "front"
    p = Plan.from_dict(data)
    assert p.to_dict()["note"] == "mine" and p.to_dict()["stages"][0]["label"] == "front"


@pytest.mark.parametrize(
    "make, cluster, message",
    [
        (lambda: with_stage(1, layers=[4, 7]), "1x4", "must start where stage 0 stops"),
        (lambda: with_stage(2, layers=[7, 9]), "1x4", "model has 10 layers"),
        (lambda: with_stage(0, layers=[0, 0]), "1x4", "must start where|empty"),
        (lambda: with_stage(1, parallelism="pipeline"), "1x4", "unknown parallelism"),
        (lambda: with_stage(1, parallelism="none", degree=2, devices=[2, 3]), "2x4", "needs degree 1"),
        (lambda: with_stage(0, devices=[0]), "1x4", "degree 2 but 1 device"),
        (lambda: with_stage(1, devices=[1]), "1x4", "device 1 is used by stage 0 and stage 1"),
        (lambda: with_stage(2, devices=[7]), "1x4", "does not exist on cluster 1x4"),
        (lambda: plan(schedule="interleaved"), "1x4", "unknown schedule"),
        (lambda: plan(global_batch_size=30), "1x4", "does not split into 8"),
        (lambda: with_stage(2, degree=3, devices=[3, 4, 5]), "2x4", "does not divide the micro-batch size 4"),
    ],
)
def test_rules(make, cluster, message):
    with pytest.raises(PlanError, match=message) as err:
        make().validate(model=get_model("gpt-tiny"), cluster=Cluster.parse(cluster))
    assert err.value.fix or "devices" in str(err.value)


def test_stage_spanning_nodes():
    p = with_stage(0, devices=[1, 2])
    p = Plan.from_dict({**p.to_dict(), "stages": [
        {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [1, 2]},
        {"layers": [3, 7], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [7, 10], "parallelism": "data", "degree": 1, "devices": [3]},
    ]})
    with pytest.raises(PlanError, match="spans nodes"):
        p.validate(cluster=Cluster.parse("2x2"))


def test_unused_devices():
    with pytest.raises(PlanError, match=r"device\(s\) \[4, 5\] of cluster 2x3 are not used"):
        plan().validate(cluster=Cluster.parse("2x3"))


def test_tensor_parallel_not_possible():
    bad = with_stage(0, degree=3, devices=[0, 1, 2])
    bad = Plan.from_dict({**bad.to_dict(), "stages": [
        {"layers": [0, 9], "parallelism": "tensor", "degree": 3, "devices": [0, 1, 2]},
        {"layers": [9, 10], "parallelism": "none", "degree": 1, "devices": [3]},
    ]})
    with pytest.raises(PlanError, match="cannot be tensor-parallel at degree 3"):
        bad.validate(model=get_model("gpt-tiny"), cluster=Cluster.parse("1x4"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"schedule": "1f1b"}', "lacks key"),
        ('{"schedule": "1f1b", "global_batch_size": "32", "num_microbatches": 8, "stages": [{}]}', "must be an integer"),
        ('{"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8, "stages": []}', "non-empty list"),
        ('{"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8, "stages": [{"layers": [0]}]}', "lacks key"),
        ('{"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8, "stages": '
         '[{"layers": [0, 1, 2], "parallelism": "none", "degree": 1, "devices": [0]}]}', "two integers"),
    ],
)
def test_malformed_files(tmp_path, text, message):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(PlanError, match=message):
        Plan.load(f)


def test_missing_file():
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load("/nonexistent/plan.json")
