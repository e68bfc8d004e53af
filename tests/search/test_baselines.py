"""The baseline partitioners: upstream examples, brute force on small inputs, and the plans they make."""

from __future__ import annotations

import doctest
import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import Plan
from hybridplan.search import baselines
from hybridplan.search.baselines import (
    BASELINES,
    balance_by_parameters,
    balance_by_size,
    balance_by_time,
    balance_by_type,
    baseline_plan,
    equal_layers,
)

small_costs = st.lists(st.integers(0, 20), min_size=1, max_size=8)


def block_sums(costs: list[float], bounds: tuple[int, ...]) -> list[float]:
    return [sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])]


def all_partitions(num_layers: int, num_stages: int) -> list[tuple[int, ...]]:
    """Every way to cut the layers into non-empty stages: the brute force."""
    return [(0, *cuts, num_layers) for cuts in itertools.combinations(range(1, num_layers), num_stages - 1)]


def optimal_max(costs: list[float], num_stages: int) -> float:
    """The min-max optimum over all boundaries."""
    return min(max(block_sums(costs, b)) for b in all_partitions(len(costs), num_stages))


def assert_valid(bounds: tuple[int, ...], num_layers: int, num_stages: int) -> None:
    assert len(bounds) == num_stages + 1 and bounds[0] == 0 and bounds[-1] == num_layers
    assert all(a < b for a, b in zip(bounds, bounds[1:]))


def test_docstring_examples() -> None:
    result = doctest.testmod(baselines)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ equal layers (Megatron, Alpa, DeepSpeed uniform)
def test_equal_layers_divisible_is_megatrons_split() -> None:
    assert equal_layers(24, 4) == (0, 6, 12, 18, 24)
    assert equal_layers(5, 5) == (0, 1, 2, 3, 4, 5)
    assert equal_layers(7, 1) == (0, 7)


def test_equal_layers_remainder_goes_to_the_first_stages() -> None:
    assert equal_layers(10, 4) == (0, 3, 6, 8, 10)
    # DeepSpeed PR #4053's example: partition_uniform(num_items=38, num_parts=8)
    assert equal_layers(38, 8) == (0, 5, 10, 15, 20, 25, 30, 34, 38)


@given(st.integers(1, 60), st.data())
def test_equal_layers_is_optimal_for_unit_costs(num_layers: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, num_layers))
    bounds = equal_layers(num_layers, k)
    assert_valid(bounds, num_layers, k)
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    assert sizes[0] == math.ceil(num_layers / k)  # = the brute-force min-max of unit costs


# ------------------------------------------------------------------ torchgpipe
def test_torchgpipe_documented_examples() -> None:
    # torchgpipe tests/test_balance.py: blockpartition.solve([1..6], 2) == [[1, 2, 3, 4], [5, 6]]; solve([0, 0], 2)
    assert balance_by_time([1, 2, 3, 4, 5, 6], 2) == (0, 4, 6)
    assert balance_by_time([0, 0], 2) == (0, 1, 2)
    # test_balance_by_size_latent: growing activations -> [4, 2], shrinking -> [2, 4]
    assert balance_by_size([1, 2, 3, 4, 5, 6], 2) == (0, 4, 6)
    assert balance_by_size([6, 5, 4, 3, 2, 1], 2) == (0, 2, 6)


def test_torchgpipe_puts_the_remainder_of_equal_costs_in_the_last_stage() -> None:
    assert balance_by_time([3.0] * 10, 4) == (0, 2, 4, 6, 10)


def test_torchgpipe_is_not_min_max_optimal() -> None:
    # scaled costs [1/6, 0, 1]: the first split [5 | 4, 10] already has max <= min + 1, so it stops there
    costs = [5, 4, 10]
    bounds = balance_by_time(costs, 2)
    assert bounds == (0, 1, 3) and max(block_sums(costs, bounds)) == 14 > optimal_max(costs, 2) == 10


def test_torchgpipe_failures_on_ties_at_the_smallest_cost() -> None:
    with pytest.raises(PlanError, match=r"leaves stage\(s\) \[1\] without layers"):
        balance_by_time([0, 0, 1, 1], 3)  # torchgpipe returns balance [3, 0, 1]
    with pytest.raises(PlanError, match="does not converge"):
        balance_by_time([2, 0, 0, 0, 0, 2, 1, 3, 0, 0], 7)  # torchgpipe loops forever


@settings(max_examples=300, deadline=None)
@given(small_costs, st.data())
def test_torchgpipe_against_brute_force(costs: list[int], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(costs)))
    try:
        bounds = balance_by_time(costs, k)
    except PlanError:
        assert costs.count(min(costs)) >= 2  # it fails only on ties at the smallest cost
        return
    assert_valid(bounds, len(costs), k)
    assert max(block_sums(costs, bounds)) >= optimal_max(costs, k)
    low, spread = min(costs), max(costs) - min(costs)
    scaled = block_sums([(c - low) / spread if spread else 0.0 for c in costs], bounds)
    assert max(scaled) <= min(scaled) + 1 + 1e-9  # Bárány's guarantee, torchgpipe's stopping rule
    # only (c - min) / (max - min) matters: a positive affine map of the costs gives the same cut
    assert balance_by_size([3 * c + 7 for c in costs], k) == bounds


# ------------------------------------------------------------------ DeepSpeed
def test_deepspeed_documented_examples() -> None:
    # DeepSpeed tests/unit/runtime/utils/test_partition.py
    assert balance_by_parameters([1, 1, 1, 1], 4) == (0, 1, 2, 3, 4)
    assert balance_by_parameters([1, 1, 1, 1, 1], 4) in {(0, 1, 2, 3, 5), (0, 2, 3, 4, 5)}
    assert balance_by_parameters([0, 1, 2, 3, 3, 3], 4) == (0, 3, 4, 5, 6)
    assert balance_by_parameters([0.0, 1.1, 1.9, 3.0, 3.0, 3.0], 4) == (0, 3, 4, 5, 6)
    assert balance_by_parameters([0.0, 1.1, 30, 3.0], 3) == (0, 2, 3, 4)
    assert balance_by_parameters([1] * 8, 4) == (0, 2, 4, 6, 8)
    bert = [52559872] + [12596224] * 24 + [0, 52559872]  # embedding, 24 blocks, a weightless layer, head
    bounds = balance_by_parameters(bert, 8)
    assert bounds == (0, 1, 5, 9, 13, 17, 21, 26, 27)
    assert block_sums(bert, bounds) == [52559872] + [4 * 12596224] * 6 + [52559872]


def test_deepspeed_minimises_the_spread_not_the_maximum() -> None:
    # by hand: cuts (0,1,2,4) give 7, 7, 19 (spread 12, max 19); (0,2,3,4) give 14, 18, 1 (spread 17, max 18)
    costs = [7, 7, 18, 1]
    assert balance_by_parameters(costs, 3) == (0, 1, 2, 4)
    assert optimal_max(costs, 3) == 18


def test_deepspeed_ties_go_to_the_later_cut() -> None:
    assert balance_by_parameters([1] * 7, 3) == (0, 3, 5, 7)
    assert balance_by_parameters([0] * 6, 3) == (0, 4, 5, 6)


def test_deepspeed_type_regex() -> None:
    names = ["EmbeddingPipe"] + ["ParallelTransformerLayerPipe"] * 6 + ["LayerNorm", "LMHeadPipe"]
    bounds = balance_by_type(names, "ParallelTransformerLayer", 3)
    assert block_sums([1 if "Transformer" in n else 0 for n in names], bounds) == [2, 2, 2]


@settings(max_examples=300, deadline=None)
@given(small_costs, st.data())
def test_deepspeed_against_brute_force(costs: list[int], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(costs)))
    bounds = balance_by_parameters(costs, k)
    assert_valid(bounds, len(costs), k)
    candidates = all_partitions(len(costs), k)

    def spread(b: tuple[int, ...]) -> int:
        return max(block_sums(costs, b)) - min(block_sums(costs, b))

    assert spread(bounds) >= min(spread(b) for b in candidates)
    if k == 2:  # one cut: the greedy DP is exact, and so min-max optimal; ties go to the latest cut
        best = min(spread(b) for b in candidates)
        assert bounds == max(b for b in candidates if spread(b) == best)
        assert max(block_sums(costs, bounds)) == optimal_max(costs, 2)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("partition", [balance_by_time, balance_by_size, balance_by_parameters])
def test_bad_costs(partition: object) -> None:
    assert callable(partition)
    with pytest.raises(PlanError, match=r"\[1\] = -1 is not a finite number >= 0"):
        partition([1, -1, 2], 2)
    with pytest.raises(PlanError, match="not a finite"):
        partition([1, float("nan")], 1)
    with pytest.raises(PlanError, match="non-empty list"):
        partition([], 1)
    with pytest.raises(PlanError, match="cannot cut 2 layers into 3 non-empty stages"):
        partition([1, 2], 3)
    with pytest.raises(PlanError, match="positive integer"):
        partition([1, 2], 0)


def test_bad_layer_counts() -> None:
    with pytest.raises(PlanError, match="cannot cut 3 layers into 4"):
        equal_layers(3, 4)
    with pytest.raises(PlanError, match="positive integer"):
        equal_layers(0, 1)


# ------------------------------------------------------------------ plans
PLAN_ARGS = {"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4}


@pytest.mark.parametrize("name", list(BASELINES))
@pytest.mark.parametrize("shape", [(1, 4), (2, 2), (2, 4)])
def test_pipeline_only_plans_are_valid(name: str, shape: tuple[int, int]) -> None:
    cluster = Cluster.uniform(*shape)
    costs = [1.0 + (i % 3) for i in range(12)]
    plan = baseline_plan(name, num_layers=12, cluster=cluster, layer_costs=costs, **PLAN_ARGS)
    plan.validate(num_layers=12, cluster=cluster)
    assert [s.devices for s in plan.stages] == [(d,) for d in range(cluster.num_devices)]
    assert all(s.parallelism == "none" for s in plan.stages)
    assert Plan.from_dict(json.loads(plan.to_json())).extra == {"baseline": name}


@pytest.mark.parametrize("parallelism", ["data", "tensor"])
def test_alpa_like_plans_with_a_uniform_stage_degree(parallelism: str) -> None:
    cluster = Cluster.uniform(2, 4)
    plan = baseline_plan("equal", num_layers=6, cluster=cluster, stage_degrees=2, parallelism=parallelism, **PLAN_ARGS)
    assert [(s.start, s.stop, s.kind, s.devices) for s in plan.stages] == [
        (0, 2, parallelism, (0, 1)),
        (2, 4, parallelism, (2, 3)),
        (4, 5, parallelism, (4, 5)),
        (5, 6, parallelism, (6, 7)),
    ]
    one_stage_per_node = baseline_plan("torchgpipe-time", num_layers=6, cluster=cluster, stage_degrees=4,
                                       layer_costs=[1, 2, 3, 4, 5, 6], **PLAN_ARGS)
    assert [(s.start, s.stop, s.devices) for s in one_stage_per_node.stages] == [(0, 4, (0, 1, 2, 3)), (4, 6, (4, 5, 6, 7))]


def test_more_devices_than_layers_suggests_hybrid_plans() -> None:
    with pytest.raises(PlanError, match="8 stages on cluster 2x4, but the model has only 5 layers") as info:
        baseline_plan("equal", num_layers=5, cluster=Cluster.uniform(2, 4), **PLAN_ARGS)
    assert info.value.fix is not None and "hybrid plan" in info.value.fix and "stage_degrees=2" in info.value.fix


def test_plan_errors() -> None:
    cluster = Cluster.uniform(2, 4)
    with pytest.raises(UsageError, match="unknown baseline 'gpipe'"):
        baseline_plan("gpipe", num_layers=8, cluster=cluster, **PLAN_ARGS)
    with pytest.raises(PlanError, match="needs layer_costs"):
        baseline_plan("deepspeed-parameters", num_layers=8, cluster=cluster, **PLAN_ARGS)
    with pytest.raises(PlanError, match="layer_costs has 3 entries but the model has 8 layers"):
        baseline_plan("torchgpipe-size", num_layers=8, cluster=cluster, layer_costs=[1, 2, 3], **PLAN_ARGS)
    with pytest.raises(PlanError, match="span nodes"):
        baseline_plan("equal", num_layers=8, cluster=cluster, stage_degrees=3, **PLAN_ARGS)
    with pytest.raises(UsageError, match="unknown stage parallelism"):
        baseline_plan("equal", num_layers=8, cluster=cluster, stage_degrees=2, parallelism="pipe", **PLAN_ARGS)
    with pytest.raises(PlanError, match="does not divide the micro-batch size"):  # micro-batch 2, data x4
        baseline_plan("equal", num_layers=8, cluster=cluster, stage_degrees=4, schedule="gpipe",
                      global_batch_size=8, num_microbatches=4)


@pytest.mark.parametrize("shape", [(1, 4), (2, 2), (4, 4), (2, 8)])
def test_uniform_3d_shapes_against_brute_force(shape: tuple[int, int]) -> None:
    """Every (pp, tp, dp) with pp * tp * dp = devices, tp inside a node, stages tiling whole nodes."""
    cluster = Cluster.uniform(*shape)
    n, k = cluster.num_devices, shape[1]
    brute = [(pp, tp, dp) for pp in range(1, n + 1) for tp in range(1, n + 1) for dp in range(1, n + 1)
             if pp * tp * dp == n and k % tp == 0 and ((tp * dp) % k == 0 or k % (tp * dp) == 0) and pp <= 6]
    assert baselines.uniform_3d_shapes(cluster, 6) == sorted(brute)


def test_uniform_3d_plan_is_megatrons_layout() -> None:
    cluster = Cluster.uniform(4, 4)
    plan = baselines.uniform_3d_plan(num_layers=10, cluster=cluster, pipeline=2, tensor=2, schedule="1f1b",
                                     global_batch_size=64, num_microbatches=4)
    # equal layer counts; each stage 2 nodes wide: 4 replicas of tensor pairs, tensor-fastest device order
    assert [(s.start, s.stop, s.parallelism, s.degree, s.tensor_degree, s.zero) for s in plan.stages] == [
        (0, 5, "data+tensor", 8, 2, 1), (5, 10, "data+tensor", 8, 2, 1)]
    assert plan.stages[1].devices == tuple(range(8, 16))
    assert [plan.stages[0].tensor_group(r) for r in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    # no data group, no ZeRO: pure tensor stages; pure data stages keep ZeRO
    tensor_only = baselines.uniform_3d_plan(num_layers=10, cluster=cluster, pipeline=4, tensor=4, schedule="1f1b",
                                            global_batch_size=64, num_microbatches=4)
    assert {(s.parallelism, s.degree, s.zero) for s in tensor_only.stages} == {("tensor", 4, 0)}
    data_only = baselines.uniform_3d_plan(num_layers=10, cluster=cluster, pipeline=8, tensor=1, schedule="1f1b",
                                          global_batch_size=64, num_microbatches=4, zero=0)
    assert [(s.start, s.stop) for s in data_only.stages][:3] == [(0, 2), (2, 4), (4, 5)]
    assert {(s.parallelism, s.degree, s.zero) for s in data_only.stages} == {("data", 2, 0)}


def test_uniform_3d_plan_errors() -> None:
    cluster = Cluster.uniform(2, 4)
    with pytest.raises(PlanError, match="pipeline degree must be a positive divisor"):
        baselines.uniform_3d_plan(num_layers=8, cluster=cluster, pipeline=3, tensor=1, **PLAN_ARGS)
    with pytest.raises(PlanError, match="spans nodes"):  # a tensor group of 8 over two nodes
        baselines.uniform_3d_plan(num_layers=8, cluster=cluster, pipeline=1, tensor=8, **PLAN_ARGS)
    with pytest.raises(PlanError, match="does not divide the micro-batch size"):  # micro-batch 2, data x4
        baselines.uniform_3d_plan(num_layers=8, cluster=cluster, pipeline=2, tensor=1, schedule="gpipe",
                                  global_batch_size=8, num_microbatches=4)
