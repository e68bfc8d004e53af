"""Stages across nodes (``PlanSpace(..., cross_node=True)``, [Note: stages across nodes]): data and data x tensor
stages over 2, 4, ... whole nodes, placed validly, searched exactly (the exact solver equals exhaustive
enumeration)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.plan import Cluster
from hybridplan.search import PlanSpace, count_plans, solve_exact, solve_exhaustive
from hybridplan.search.memory.configs import StageConfig, stage_configs
from hybridplan.search.memory.packing import place_stages
from hybridplan.search.memory.space import enumerate_plans
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel


def test_spanning_configs_come_after_the_others_and_cover_whole_nodes():
    plain = stage_configs(2, composite=True)
    spanning = stage_configs(2, composite=True, num_nodes=5, cross_node=True)
    assert spanning[: len(plain)] == plain
    # m = 2 and 4 nodes of 2 devices: data x4, data x8; data x tensor with tensor degree 2 at 4 and 8 devices
    assert spanning[len(plain):] == (StageConfig("data", 4), StageConfig("data", 8),
                                     StageConfig("data+tensor", 4, 2), StageConfig("data+tensor", 8, 2))
    assert stage_configs(2, num_nodes=1, cross_node=True) == stage_configs(2)


def test_crossing_nodes_adds_the_stages_over_both_nodes():
    # 2 layers on 2x1: one layer per node (1 plan); across nodes also data x2 over both layers: 2 plans
    assert count_plans(PlanSpace(2, 2, 1)) == 1
    assert count_plans(PlanSpace(2, 2, 1, cross_node=True)) == 2
    # 1 layer on 2x2: only across nodes (data x4, or data x2 + tensor x2 with the extended space)
    assert PlanSpace(1, 2, 2, cross_node=True).min_stages == 1
    assert count_plans(PlanSpace(1, 2, 2, cross_node=True)) == 1
    assert count_plans(PlanSpace(1, 2, 2, cross_node=True, composite=True)) == 2


@pytest.mark.parametrize("nodes, k", [(2, 2), (3, 2), (2, 3), (3, 3), (4, 2), (5, 1), (3, 6)])
def test_min_stages_is_the_fewest_stages_of_the_packing(nodes, k):
    space = PlanSpace(40, nodes, k, cross_node=True)
    pk = space.packing
    assert space.min_stages == pk.to_finish[pk.start]


@pytest.mark.parametrize("nodes, k, layers", [(2, 2, 4), (3, 2, 4), (2, 3, 4), (3, 3, 4), (4, 2, 3)])
def test_every_plan_places_validly_and_spanning_stages_take_whole_nodes(nodes, k, layers):
    """Each enumerated plan's placement uses every device once (Plan.validate's rule), keeps stages of at most k
    devices on one node and gives a larger stage whole nodes; tensor groups then stay inside a node."""
    space = PlanSpace(layers, nodes, k, cross_node=True, composite=True)
    spanning = 0
    for choices in enumerate_plans(space):
        placed = space.place(choices)
        assert sorted(d for devs in placed for d in devs) == list(range(nodes * k))
        for c, devs in zip(choices, placed):
            node_set = {d // k for d in devs}
            if len(devs) <= k:
                assert len(node_set) == 1
            else:
                spanning += 1
                assert len(devs) == len(node_set) * k  # whole nodes
    assert spanning > 0


def test_place_stages_refuses_what_cannot_pack():
    from hybridplan.errors import PlanError

    with pytest.raises(PlanError, match="do not pack"):
        place_stages([12, 4, 4, 4], 4, 6)  # the 12 take 2 whole nodes, the other 2 hold one stage of 4 each
    # one 4 fewer, two 2 more: the 12 on nodes 0-1, a 4 and a 2 on each of nodes 2 and 3
    assert place_stages([12, 4, 4, 2, 2], 4, 6) == (tuple(range(12)), (12, 13, 14, 15), (18, 19, 20, 21), (22, 23), (16, 17))
    with pytest.raises(PlanError, match="cannot fill"):
        place_stages([3, 3], 1, 6)


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 5), mesh=st.sampled_from([(2, 2), (3, 2), (2, 1), (3, 1), (4, 1), (2, 3)]),
       horizon=st.integers(1, 3), seed=st.integers(0, 1000), levels=st.integers(2, 4), composite=st.booleans())
def test_exact_equals_exhaustive_across_nodes(layers, mesh, horizon, seed, levels, composite):
    nodes, k = mesh
    space_kwargs = dict(composite=composite, cross_node=True)
    if layers < PlanSpace(99, nodes, k, cross_node=True).min_stages:  # too few layers even across nodes
        return
    space = PlanSpace(layers, nodes, k, **space_kwargs)
    model = TableStageModel.random(layers, k, horizon=horizon, seed=seed, levels=levels, composite=composite,
                                   num_nodes=nodes, cross_node=True)
    exact, exhaustive = (solve(model, space) for solve in (solve_exact, solve_exhaustive))
    assert [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.devices) for s in exact.stages] == \
        [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.devices) for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak
    micro = math.lcm(*range(1, nodes * k + 1))  # divisible by every data degree
    exact.to_plan(schedule="1f1b", global_batch_size=2 * micro, num_microbatches=2).validate(
        num_layers=layers, cluster=Cluster.uniform(nodes, k))


def test_crossing_nodes_can_strictly_lower_the_peak():
    """Two layers (M_i = M_a = 100, activations 80) on two nodes of one device, 1F1B with 2 micro-batches. One
    node per stage: a stage per node, the first holding a second micro-batch: [0,1) at 100 + 80 = 180, [1,2) at
    100. Across nodes, data x2 over both layers: base 200, activations 160 of which each replica keeps half,
    (200 - 160) + 160/2 = 120 (AdditiveStageModel's data rule): strictly lower."""
    model = AdditiveStageModel((100.0,) * 2, (100.0,) * 2, (80.0,) * 2, position_horizon=2)
    one_node = solve_exact(model, PlanSpace(2, 2, 1))
    across = solve_exact(model, PlanSpace(2, 2, 1, cross_node=True))
    assert one_node.peak == 180.0 and across.peak == 120.0
    assert [(s.kind, s.degree, s.devices) for s in across.stages] == [("data", 2, (0, 1))]


def test_too_few_layers_even_across_nodes_names_the_stages_needed():
    from hybridplan.errors import PlanError

    # 3 nodes of 2: two nodes as one stage, the third as one stage of 2: 2 stages at least
    with pytest.raises(PlanError, match="needs at least 2 stages even across nodes") as caught:
        PlanSpace(1, 3, 2, cross_node=True)
    assert "--cluster 2x2" in str(caught.value)
    assert count_plans(PlanSpace(1, 2, 2, cross_node=True)) == 1  # the suggested mesh has a plan


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(2, 4), mesh=st.sampled_from([(2, 2), (3, 2), (2, 1)]), horizon=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_exact_equals_exhaustive_with_every_dimension(layers, mesh, horizon, seed):
    """Across nodes, data x tensor, ZeRO and recompute together."""
    nodes, k = mesh
    dims = dict(composite=True, zero=True, recompute=True, cross_node=True)
    if layers < PlanSpace(99, nodes, k, cross_node=True).min_stages:
        return
    model = TableStageModel.random(layers, k, horizon=horizon, seed=seed, levels=3, num_nodes=nodes, **dims)
    space = PlanSpace(layers, nodes, k, **dims)
    exact, exhaustive = (solve(model, space) for solve in (solve_exact, solve_exhaustive))
    key = [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero, s.recompute, s.devices) for s in exact.stages]
    assert key == [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero, s.recompute, s.devices)
                   for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak
