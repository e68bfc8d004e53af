"""The nearest plan each engine runs: expected plans written by hand from the rules of the module docstring."""

from __future__ import annotations

import pytest

from hybridplan.plan import Plan
from hybridplan.workflows.export import ENGINES, nearest_plan
from tests.workflows.export.plans import uniform

MIXED = Plan.from_dict({"schedule": "gpipe", "global_batch_size": 32, "num_microbatches": 8, "stages": [
    {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
    {"layers": [3, 7], "parallelism": "data", "degree": 2, "devices": [2, 3], "recompute": "full"},
    {"layers": [7, 10], "parallelism": "data", "degree": 2, "devices": [4, 5], "zero": 1}]})


@pytest.mark.parametrize("engine", ENGINES)
def test_a_uniform_plan_is_its_own_nearest(engine):
    plan = uniform([0, 4, 10], d=2)
    near, changes = nearest_plan(plan, engine)
    assert changes == [] and near == plan


def test_torchtitan_keeps_gpipe_and_megatron_deepspeed_run_1f1b():
    plan = uniform([0, 5, 10], schedule="gpipe")
    assert nearest_plan(plan, "torchtitan")[1] == []
    for engine in ("megatron", "deepspeed"):
        near, changes = nearest_plan(plan, engine)
        assert near.schedule == "1f1b" and len(changes) == 1 and "gpipe -> 1f1b" in changes[0]


def test_mixed_plan_nearest_for_megatron():
    near, changes = nearest_plan(MIXED, "megatron")
    # 6 devices / 3 stages = 2 per stage; the stages are 1x2 (3 layers), 2x1 (4 layers) and 2x1 (3 layers): data x2
    # is closest (7 layers away from 1x2 ... weighted: 3 layers differ for 2x1, 7 for 1x2).
    assert [(s.start, s.stop, s.data_degree, s.tensor_degree) for s in near.stages] == [(0, 3, 2, 1), (3, 7, 2, 1), (7, 10, 2, 1)]
    assert [s.devices for s in near.stages] == [(0, 1), (2, 3), (4, 5)]
    assert {s.zero for s in near.stages} == {1} and {s.recompute for s in near.stages} == {"full"}
    assert near.schedule == "1f1b" and len(changes) == 4
    near.validate(num_layers=10)


def test_deepspeed_drops_tensor_parallelism():
    near, changes = nearest_plan(uniform([0, 5, 10], t=2), "deepspeed")
    assert [(s.data_degree, s.tensor_degree) for s in near.stages] == [(2, 1), (2, 1)]
    assert "no tensor parallelism" in changes[0]


def test_zero_mapping_per_engine():
    plan = uniform([0, 5, 10], d=2, zero=3)
    assert {s.zero for s in nearest_plan(plan, "torchtitan")[0].stages} == {3}
    assert {s.zero for s in nearest_plan(plan, "deepspeed")[0].stages} == {1}  # ZeRO-2/3 not with DeepSpeed's pipeline
    single = uniform([0, 10], d=4, zero=3)
    assert nearest_plan(single, "deepspeed")[1] == []  # ... but without pipelining
    assert {s.zero for s in nearest_plan(uniform([0, 5, 10], d=2, zero=1), "torchtitan")[0].stages} == {2}


def test_left_over_devices_are_named():
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 5], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [5, 10], "parallelism": "none", "degree": 1, "devices": [2]}]})
    near, changes = nearest_plan(plan, "megatron")
    assert near.num_devices == 2 and "1 device(s) left idle" in changes[0]


def test_a_data_degree_must_divide_the_microbatch():
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 3, "num_microbatches": 1, "stages": [
        {"layers": [0, 5], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [5, 10], "parallelism": "tensor", "degree": 2, "devices": [2, 3]}]})
    near, _ = nearest_plan(plan, "deepspeed")  # data 2 does not divide 3: one device per stage is left
    assert [(s.data_degree, s.tensor_degree) for s in near.stages] == [(1, 1), (1, 1)]
    assert near.num_devices == 2


def test_grids_the_model_refuses_are_passed_over():
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
        {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 10], "parallelism": "tensor", "degree": 4, "devices": [2, 3, 4, 5]}]})
    # 6 devices / 2 stages = 3 per stage: data 3 does not divide the micro-batch of 4, so tensor x3; by hand, the
    # 2-device pairs weigh 2 layers x (1 + 1) + 8 layers x (0 + 1) = 12 for tensor x2, 8 x (1 + 2) = 24 for data x2
    near, _ = nearest_plan(plan, "megatron")
    assert {(s.data_degree, s.tensor_degree) for s in near.stages} == {(1, 3)}
    near, changes = nearest_plan(plan, "megatron", accept=lambda p: p.stages[0].tensor_degree != 3)
    assert {(s.data_degree, s.tensor_degree) for s in near.stages} == {(1, 2)} and "2 device(s) left idle" in changes[0]
    near, _ = nearest_plan(plan, "megatron", accept=lambda p: p.stages[0].tensor_degree == 1 and p.stages[0].data_degree == 1)
    assert {(s.data_degree, s.tensor_degree) for s in near.stages} == {(1, 1)}


def test_selective_recompute_is_torchtitans_alone():
    plan = uniform([0, 5, 10], d=2, recompute="selective")
    assert nearest_plan(plan, "torchtitan")[1] == []
    for engine in ("megatron", "deepspeed"):
        near, changes = nearest_plan(plan, engine)
        assert {s.recompute for s in near.stages} == {"full"} and len(changes) == 1 and "selective" in changes[0]
