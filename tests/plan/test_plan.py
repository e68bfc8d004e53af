import json

import pytest

from hybridplan.errors import PlanError
from hybridplan.models import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from tests.paths import GPT_PLAN as EXAMPLE


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


def test_annotations_are_kept():
    """hybridplan's own annotations and the user's ``x-`` keys, in a plan and in a stage, survive a round trip."""
    data = json.loads(json.dumps(EXAMPLE))
    data["x-note"] = "mine"
    data["predicted_peak_bytes"] = 123
    data["stages"][0]["x-label"] = "front"
    p = Plan.from_dict(data)
    assert p.to_dict()["x-note"] == "mine" and p.to_dict()["stages"][0]["x-label"] == "front"
    assert Plan.from_dict(json.loads(p.to_json())).to_dict() == data


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: with_stage(0, zeroo=3), r"stage 0: unknown key\(s\) 'zeroo'"),
        (lambda: plan(notes="mine"), r"plan has unknown key\(s\) 'notes'"),
        (lambda: with_stage(0, parallelism="data+tensor", degree=2, tensor_degree=0), r"'tensor_degree' is 0, not a positive"),
        (lambda: plan(global_batch_size=10**30), r"'global_batch_size' is 1,000,000,000,000,000,000,000,000,000,000, more"
                                                 r" than 16,777,216"),
        (lambda: plan(global_batch_size=2**40, num_microbatches=2**40), r"'global_batch_size' is .* more than 16,777,216"),
        (lambda: plan(num_microbatches=2**20), r"'num_microbatches' is 1,048,576, more than 65,536"),
        (lambda: plan(global_batch_size=0), r"'global_batch_size' is 0, not a positive integer"),
        (lambda: plan(num_microbatches=True), r"'num_microbatches' is True, not a positive integer"),
        (lambda: with_stage(0, degree=10**9), r"'degree' is 1,000,000,000, more than 1,048,576"),
        (lambda: with_stage(2, layers=[7, 10**9]), r"'layers' must be \[start, stop\) as two integers from 0 to 1,048,576"),
        (lambda: with_stage(0, devices=[0, 2**40]), r"'devices' must be a list of device indices from 0 to 1,048,575"),
        (lambda: with_stage(0, devices=[-1, 0]), r"device indices from 0"),
    ],
)
def test_bad_plan_values_are_refused_at_load(make, message):
    with pytest.raises(PlanError, match=message) as err:
        make()
    assert err.value.fix


def test_plan_files_with_absurd_json_are_one_error(tmp_path):
    """Nesting deeper than the JSON reader recurses, and an integer of 5,000 digits (Python converts at most 4,300)."""
    (tmp_path / "deep.json").write_text("[" * 200_000)
    with pytest.raises(PlanError, match="nested deeper than the JSON reader allows"):
        Plan.load(tmp_path / "deep.json")
    text = json.dumps(EXAMPLE).replace('"layers": [7, 10]', '"layers": [7, ' + "1" * 5000 + "]")
    (tmp_path / "digits.json").write_text(text)
    with pytest.raises(PlanError, match=r"stage 2: 'layers' must be .* got \[7, an integer of 5,000 digits\]"):
        Plan.load(tmp_path / "digits.json")
    (tmp_path / "batch.json").write_text(json.dumps(EXAMPLE).replace('"global_batch_size": 32', '"global_batch_size": '
                                                                     + "3" * 5000))
    with pytest.raises(PlanError, match=r"'global_batch_size' is an integer of 5,000 digits, more than 16,777,216"):
        Plan.load(tmp_path / "batch.json")


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
        (lambda: with_stage(0, devices=[0, 0]), "1x4", "device 0 appears twice in stage 0"),
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
        ('{"schedule": "1f1b", "global_batch_size": "32", "num_microbatches": 8, "stages": [{}]}', "is .32., not a positive integer"),
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


# ---------------------------------------------------------------------- data x tensor stages (one plan type)
@pytest.mark.parametrize("parallelism, degree, tensor_degree, data, tensor", [
    ("none", 1, None, 1, 1),
    ("data", 4, None, 4, 1),
    ("tensor", 4, None, 1, 4),
    ("data+tensor", 4, 2, 2, 2),
    ("data+tensor", 8, 2, 4, 2),
])
def test_every_stage_has_a_data_and_a_tensor_degree(parallelism, degree, tensor_degree, data, tensor):
    stage = {"layers": [0, 10], "parallelism": parallelism, "degree": degree, "devices": list(range(degree))}
    if tensor_degree is not None:
        stage["tensor_degree"] = tensor_degree
    p = Plan.from_dict({**EXAMPLE, "global_batch_size": 64, "stages": [stage]})
    (s,) = p.stages
    assert (s.data_degree, s.tensor_degree) == (data, tensor)
    assert Plan.from_dict(p.to_dict()) == p and p.to_dict()["stages"][0] == stage  # the JSON form round-trips


def test_a_data_tensor_stage_lists_devices_tensor_fastest():
    p = Plan.from_dict({**EXAMPLE, "stages": [
        {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [4, 5, 6, 7]}]})
    (s,) = p.stages
    assert [s.tensor_group(r) for r in range(2)] == [(4, 5), (6, 7)]
    assert [s.data_group(k) for k in range(2)] == [(4, 6), (5, 7)]
    assert s.kind == "data+tensor" and "data x2 + tensor x2" in s.describe()


@pytest.mark.parametrize("stage, message", [
    ({"parallelism": "data+tensor", "degree": 4, "devices": [0, 1, 2, 3]}, "needs a tensor_degree dividing its degree 4"),
    ({"parallelism": "data+tensor", "degree": 4, "tensor_degree": 3, "devices": [0, 1, 2, 3]}, "dividing its degree 4, got 3"),
    ({"parallelism": "tensor", "degree": 2, "tensor_degree": 1, "devices": [0, 1]}, "does not go with parallelism 'tensor'"),
    ({"parallelism": "data", "degree": 2, "tensor_degree": "2", "devices": [0, 1]}, "'tensor_degree' is '2', not a positive integer"),
])
def test_bad_tensor_degrees(stage, message):
    with pytest.raises(PlanError, match="stage 0: ") as e:
        Plan.from_dict({**EXAMPLE, "stages": [{"layers": [0, 10], **stage}]})
    assert message in str(e.value)


def test_the_data_degree_of_a_composite_stage_must_divide_the_micro_batch():
    bad = Plan.from_dict({**EXAMPLE, "global_batch_size": 24, "stages": [  # micro-batches of 3 samples
        {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [0, 1, 2, 3]}]})
    with pytest.raises(PlanError, match="data-parallel degree 2 does not divide the micro-batch size 3"):
        bad.validate()


def test_uniform_is_amps_strategy():
    # AMP (pp=2, dp=2, tp=2, mbs=1), global batch 8: micro-batches of dp * mbs = 2 samples, 4 of them
    p = Plan.uniform(boundaries=[0, 4, 10], data_degree=2, tensor_degree=2, micro_batch_size=1, global_batch_size=8)
    assert (p.microbatch_size, p.num_microbatches, p.boundaries) == (2, 4, (0, 4, 10))
    assert [s.devices for s in p.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all((s.parallelism, s.data_degree, s.tensor_degree) == ("data+tensor", 2, 2) for s in p.stages)
    assert Plan.uniform(boundaries=[0, 10], data_degree=1, tensor_degree=2, micro_batch_size=4,
                        global_batch_size=8).stages[0].parallelism == "tensor"
    with pytest.raises(PlanError, match="does not split into micro-batches of 3 on 2 replicas"):
        Plan.uniform(boundaries=[0, 10], data_degree=2, tensor_degree=1, micro_batch_size=3, global_batch_size=8)


def test_check_fits_allows_replicas_across_nodes_but_not_missing_devices():
    p = Plan.uniform(boundaries=[0, 10], data_degree=2, tensor_degree=2, micro_batch_size=1, global_batch_size=8,
                     devices=[0, 1, 4, 5])
    p.check_fits(10, Cluster.parse("2x4"))  # replicas on two nodes: the cost model prices it
    with pytest.raises(PlanError, match=r"device\(s\) \[4, 5\] do not exist on cluster 1x4"):
        p.check_fits(10, Cluster.parse("1x4"))


def test_replicas_may_span_nodes_but_tensor_groups_may_not():
    stage = {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2}
    across = Plan.from_dict({**EXAMPLE, "stages": [{**stage, "devices": [0, 1, 2, 3]}]})
    across.validate(cluster=Cluster.parse("2x2"))  # replica (0, 1) on node 0, (2, 3) on node 1
    split = Plan.from_dict({**EXAMPLE, "stages": [{**stage, "devices": [0, 2, 1, 3]}]})
    with pytest.raises(PlanError, match=r"tensor group 0 \[0, 2\] spans nodes \[0, 1\]"):
        split.validate(cluster=Cluster.parse("2x2"))
    data = Plan.from_dict({**EXAMPLE, "stages": [{"layers": [0, 10], "parallelism": "data", "degree": 4,
                                                 "devices": [0, 1, 2, 3]}]})
    data.validate(cluster=Cluster.parse("4x1"))  # a data-parallel stage over four nodes


@pytest.mark.parametrize("stage, message", [
    ({"parallelism": "data", "degree": 2, "zero": 4, "devices": [0, 1]}, "zero must be one of [0, 1, 2, 3], got 4"),
    ({"parallelism": "data", "degree": 2, "zero": True, "devices": [0, 1]}, "'zero' must be an integer"),
    ({"parallelism": "data", "degree": 2, "recompute": "half", "devices": [0, 1]}, "unknown recompute 'half'"),
])
def test_bad_zero_and_recompute(stage, message):
    with pytest.raises(PlanError, match="stage 0: ") as e:
        Plan.from_dict({**EXAMPLE, "stages": [{"layers": [0, 10], **stage}]})
    assert message in str(e.value)


def test_zero_needs_data_parallelism_and_both_keys_round_trip():
    tensor = Plan.from_dict({**EXAMPLE, "stages": [
        {"layers": [0, 10], "parallelism": "tensor", "degree": 2, "zero": 1, "devices": [0, 1]}]})
    with pytest.raises(PlanError, match="ZeRO-1 shards over the data-parallel group"):
        tensor.validate()
    stage = {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "zero": 2,
             "recompute": "full", "devices": [0, 1, 2, 3]}
    p = Plan.from_dict({**EXAMPLE, "stages": [stage]})
    p.validate()
    (s,) = p.stages
    assert (s.zero, s.recompute) == (2, "full") and "ZeRO-2 recompute full" in s.describe()
    assert p.to_dict()["stages"][0] == stage and Plan.from_dict(p.to_dict()) == p


def test_unknown_schedule_and_parallelism_are_refused_on_construction():
    with pytest.raises(PlanError, match="unknown schedule 'zb'"):
        plan(schedule="zb")
    with pytest.raises(PlanError, match="stage 1: unknown parallelism 'pipe'"):
        with_stage(1, parallelism="pipe")
