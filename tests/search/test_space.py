"""The plan space: configs, packing, placement, enumeration and counting."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.search.space import (
    MeshPacking,
    PlanSpace,
    StageChoice,
    count_plans,
    enumerate_plans,
    place_stages,
    stage_configs,
)


def test_configs_are_none_plus_data_and_tensor_at_each_power_of_two_in_canonical_order() -> None:
    for k in (1, 2, 4, 8, 16):
        configs = stage_configs(k)
        assert len(configs) == 2 * int(math.log2(k)) + 1
        ranks = [({"none": 0, "data": 1, "tensor": 2}[c.kind], c.degree) for c in configs]
        assert ranks == sorted(ranks)
    assert [c.degree for c in stage_configs(6)] == [1, 2, 4, 2, 4]
    assert stage_configs(8, pipeline_only=True) == (("none", 1),)


@pytest.mark.parametrize(
    ("layers", "nodes", "k", "expected"),
    [
        (4, 1, 2, 5),  # L-1 two-stage pipelines, plus one stage data x2 or tensor x2
        (3, 1, 4, 16),  # {4}: 2; {2,2}: 2 splits x 4 kinds; {2,1,1}: 3 positions x 2 kinds
        (3, 2, 2, 14),  # {2,2}: 8; {2,1,1}: 6
        (3, 1, 3, 9),  # k=3: {2,1}: 2 splits x 2 orders x 2 kinds; {1,1,1}: 1
        (2, 1, 6, 8),  # k=6: {4,2}: 2 orders x 2 x 2 kinds
    ],
)
def test_plan_counts_by_hand(layers: int, nodes: int, k: int, expected: int) -> None:
    space = PlanSpace(layers, nodes, k)
    assert count_plans(space) == expected
    plans = list(enumerate_plans(space))
    assert len(plans) == expected == len(set(plans))


@pytest.mark.parametrize(("layers", "nodes", "k"), [(6, 1, 4), (7, 2, 2), (5, 4, 1), (8, 1, 8), (9, 2, 4)])
def test_pipeline_only_gives_binomial_count(layers: int, nodes: int, k: int) -> None:
    space = PlanSpace(layers, nodes, k, pipeline_only=True)
    expected = math.comb(layers - 1, nodes * k - 1)
    assert count_plans(space) == expected == sum(1 for _ in enumerate_plans(space))


def test_max_stages_bounds_the_depth() -> None:
    space = PlanSpace(6, 1, 4, max_stages=2)
    plans = list(enumerate_plans(space))
    assert plans and all(len(p) <= 2 for p in plans)
    assert count_plans(space) == len(plans)


def test_enumerated_plans_follow_the_rules() -> None:
    space = PlanSpace(5, 2, 4)
    cluster = space.cluster()
    for choices in enumerate_plans(space):
        assert choices[0].start == 0 and choices[-1].stop == 5
        assert all(a.stop == b.start for a, b in zip(choices, choices[1:]))
        devices = space.place(choices)
        assert sorted(itertools.chain(*devices)) == list(range(8))
        assert all(len({cluster.node_of(d) for d in devs}) == 1 for devs in devices)


@pytest.mark.parametrize(
    ("layers", "nodes", "k", "kwargs", "match"),
    [
        (3, 1, 4, {"pipeline_only": True}, "at least 4 stages"),
        (1, 2, 4, {}, "at least 2 stages"),
        (2, 2, 3, {}, "at least 4 stages"),  # k=3 needs 2+1 on every node
        (8, 2, 4, {"max_stages": 1}, "max_stages 1"),
        (8, 1, 0, {}, "devices_per_node must be a positive integer, got 0"),
        (0, 1, 1, {}, "num_layers"),
    ],
)
def test_impossible_spaces_raise_plan_error(layers: int, nodes: int, k: int, kwargs: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match) as info:
        PlanSpace(layers, nodes, k, **kwargs)
    assert info.value.fix


def _packs_brute_force(degrees: list[int], nodes: int, k: int) -> bool:
    """Backtracking bin packing into ``nodes`` bins of exactly ``k``."""
    if sum(degrees) != nodes * k:
        return False
    free = [k] * nodes
    items = sorted(degrees, reverse=True)

    def go(i: int) -> bool:
        if i == len(items):
            return True
        tried = set()
        for n in range(nodes):
            if free[n] >= items[i] and free[n] not in tried:
                tried.add(free[n])
                free[n] -= items[i]
                if go(i + 1):
                    return True
                free[n] += items[i]
        return False

    return go(0)


@settings(max_examples=300, deadline=None)
@given(nodes=st.integers(1, 4), k=st.integers(1, 12), data=st.data())
def test_packing_state_machine_matches_brute_force(nodes: int, k: int, data: st.DataObject) -> None:
    degrees = [2**a for a in range(k.bit_length()) if 2**a <= k]
    items = data.draw(st.lists(st.sampled_from(degrees), min_size=1, max_size=nodes * k))
    pk = MeshPacking(nodes, k, degrees)
    state = pk.start
    for d in items:
        state = int(pk.next[state, pk.column(d)]) if state >= 0 else -1
    accepted = state >= 0 and bool(pk.accepting[state])
    assert accepted == _packs_brute_force(items, nodes, k)
    if accepted:  # placement succeeds in pipeline order, whatever the order
        devices = place_stages(items, nodes, k)
        assert sorted(itertools.chain(*devices)) == list(range(nodes * k))
        assert all(len({d // k for d in devs}) == 1 and len(devs) == n for devs, n in zip(devices, items))


def test_power_of_two_mesh_tracks_only_devices_used() -> None:
    pk = MeshPacking(4, 8, [1, 2, 4, 8])
    assert pk.num_states == 33 and list(pk.used) == list(range(33))


def test_placement_keeps_consecutive_stages_on_a_node_and_survives_first_fit_traps() -> None:
    assert place_stages([1, 2, 1, 4], 2, 4) == ((0,), (1, 2), (3,), (4, 5, 6, 7))
    # Plain first-fit in pipeline order strands the last stage of degree 2 here.
    degrees = [4, 2, 1, 2, 4, 1, 2]
    devices = place_stages(degrees, 2, 8)
    assert Counter(d // 8 for devs in devices for d in devs) == {0: 8, 1: 8}
    with pytest.raises(PlanError):
        place_stages([4, 4, 4], 2, 6)


def test_stage_choice_is_a_plain_tuple() -> None:
    assert StageChoice(0, 3, 1) == (0, 3, 1)
