"""A baseline partitioner's plan with its predictions (workflows/baseline.py), on the MLP's memory and time
profiles of ``mlp_files`` (tests/conftest.py; ``t.json``: forward 1, 0.1, 4, 0.1, 1 ms per layer at micro-batch 16,
backward twice the forward)."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.workflows.baseline import baseline_costs, plan_baseline
from hybridplan.workflows.sources import Sources
from tests.cli.conftest import MLP

CLUSTER = Cluster.parse("1x4")


def test_equal_layers_plan_with_its_time_and_memory(mlp_files):
    with Sources.open(mlp_files / "p.sqlite", time_profile=str(mlp_files / "t.json"), model=MLP) as sources:
        answer = plan_baseline("equal", sources, CLUSTER)
    plan = answer.plan
    # 5 layers on 4 devices, the remainder to the first stage; the profile's batch: 32 in 2 micro-batches
    assert [(s.start, s.stop, s.devices) for s in plan.stages] == [(0, 2, (0,)), (2, 3, (1,)), (3, 4, (2,)), (4, 5, (3,))]
    assert (plan.schedule, plan.global_batch_size, plan.num_microbatches) == ("1f1b", 32, 2)
    timed = predict_iteration_time(plan, TimeProfile.load(mlp_files / "t.json"), CLUSTER)
    predicted = MemoryPredictor.from_db(mlp_files / "p.sqlite").predict(plan)
    assert answer.time.total_s == timed.total_s and answer.prediction.peak_memory_bytes == predicted.peak_memory_bytes
    assert plan.extra == {"baseline": "equal", "model": MLP, "cluster": "1x4", "predicted_iteration_s": timed.total_s,
                          "predicted_peak_bytes": predicted.peak_memory_bytes}
    assert answer.name == "equal" and answer.model == MLP


def test_stages_of_several_devices(mlp_files):
    with Sources.open(mlp_files / "p.sqlite", model=MLP) as sources:
        answer = plan_baseline("equal", sources, CLUSTER, stage_degree=2, stage_parallelism="tensor")
    assert [(s.start, s.stop, s.parallelism, s.devices) for s in answer.plan.stages] == [
        (0, 3, "tensor", (0, 1)), (3, 5, "tensor", (2, 3))]
    assert answer.time is None  # no layer times given, none in the database
    assert answer.prediction is not None and "predicted_iteration_s" not in answer.plan.extra


def test_torchgpipe_time_weighs_each_layer_by_its_forward_and_backward(mlp_files):
    profile = TimeProfile.load(mlp_files / "t.json")
    costs = baseline_costs("torchgpipe-time", get_model(MLP), profile, CLUSTER, 16)
    # forward + backward = 3 x forward: 3, 0.3, 12, 0.3, 3 ms
    assert costs == pytest.approx([3e-3, 3e-4, 1.2e-2, 3e-4, 3e-3], rel=1e-12)
    assert baseline_costs("equal", get_model(MLP), profile, CLUSTER, 16) is None
    with pytest.raises(UsageError, match="no time profile was given"):
        baseline_costs("torchgpipe-time", get_model(MLP), None, CLUSTER, 16)
    with pytest.raises(UsageError, match="the time profile has 5 layers, gpt-tiny 10"):
        baseline_costs("torchgpipe-time", get_model("gpt-tiny"), profile, CLUSTER, 16)


def test_the_micro_batch_count_must_be_known(mlp_files):
    with Sources.open(None, time_profile=str(mlp_files / "t.json"), model=MLP) as sources:
        with pytest.raises(UsageError, match="micro-batch count is unknown"):
            plan_baseline("equal", sources, CLUSTER, global_batch_size=32)
        answer = plan_baseline("equal", sources, CLUSTER, global_batch_size=32, num_microbatches=4)
    assert answer.prediction is None and answer.plan.num_microbatches == 4  # no database: no memory prediction
