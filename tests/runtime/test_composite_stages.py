"""Composite stages train the same math as one device (real processes, gloo): data x tensor in one stage,
replicas on different nodes, recompute chosen per stage; and the simulator counts them as the real runtime does."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.runtime.result import RunResult
from tests.runtime.util import assert_same_training

pytestmark = pytest.mark.distributed


def plan_of(schedule: str, batch: int, micro: int, stages: list[tuple[int, int, str, list[int], dict[str, Any]]]) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch, "num_microbatches": micro, "stages": [
        {"layers": [a, b], "parallelism": kind, "degree": len(devs), "devices": devs, **more}
        for a, b, kind, devs, more in stages]})


TP2 = {"tensor_degree": 2}
DATA_TENSOR_THEN_DEVICE = plan_of("1f1b", 16, 4, [(0, 4, "data+tensor", [0, 1, 2, 3], TP2), (4, 10, "none", [4], {})])


@functools.cache
def _data_tensor_then_device() -> RunResult:
    """The real run of :data:`DATA_TENSOR_THEN_DEVICE` on 1x5 (3 iterations), asserted to train as one device does;
    once per module: the simulator's check below reads its peaks."""
    return assert_same_training("gpt-tiny", DATA_TENSOR_THEN_DEVICE, "1x5")


def test_gpt_data_tensor_stage_then_pipeline_1f1b():
    """2 replicas of a tensor x2 group feed one device: the replicas' rows merge, their gradients split back."""
    _data_tensor_then_device()


def test_gpt_tensor_then_data_tensor_across_nodes_gpipe():
    """tensor x2 -> 2 replicas of tensor x2 on two different nodes (3 nodes of 2 devices)."""
    plan = plan_of("gpipe", 16, 4, [(0, 3, "tensor", [0, 1], {}), (3, 10, "data+tensor", [2, 3, 4, 5], TP2)])
    assert_same_training("gpt-tiny", plan, "3x2")


def test_conv_data_tensor_and_data_1f1b():
    """Wide-ResNet (convolutions, GroupNorm): data x2 + tensor x2, then data x2."""
    plan = plan_of("1f1b", 16, 4, [(0, 3, "data+tensor", [0, 1, 2, 3], TP2), (3, 7, "data", [4, 5], {})])
    assert_same_training("wresnet-tiny", plan, "1x6")


def test_recompute_chosen_per_stage_trains_the_same():
    plan = plan_of("1f1b", 16, 4, [(0, 5, "data", [0, 1], {"recompute": "full"}), (5, 10, "tensor", [2, 3], {})])
    assert_same_training("gpt-tiny", plan, "1x4")


def _peaks(plan: Plan, cluster: str, backend: str, iterations: int = 2) -> list[int]:
    result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=iterations,
                              backend=backend))
    assert result.ok, result.reason
    return [d.peak_memory_bytes for d in result.devices]


def test_recompute_lowers_only_its_own_stage():
    base = [(0, 5, "none", [0], {}), (5, 10, "none", [1], {})]
    plain = _peaks(plan_of("1f1b", 16, 4, base), "1x2", "sim")
    recomputed = _peaks(plan_of("1f1b", 16, 4, [(0, 5, "none", [0], {"recompute": "full"}), base[1]]), "1x2", "sim")
    assert recomputed[0] < plain[0]  # stage 0 keeps only its layers' inputs for the 2 micro-batches in flight
    assert recomputed[1] == plain[1]


def test_simulated_data_tensor_stage_equals_the_real_one():
    """The simulator runs one device per stage: every rank of a data x tensor stage holds the same bytes. The real
    run is test_gpt_data_tensor_stage_then_pipeline_1f1b's (3 iterations; simulated as many)."""
    real = [d.peak_memory_bytes for d in _data_tensor_then_device().devices]
    assert real[:4] == [real[0]] * 4
    assert _peaks(DATA_TENSOR_THEN_DEVICE, "1x5", "sim", iterations=3) == real
