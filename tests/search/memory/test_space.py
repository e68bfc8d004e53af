"""The plan space: configs, packing, placement, enumeration and counting."""

from __future__ import annotations

import itertools
import math
import re
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.configs import StageChoice, stage_configs
from hybridplan.search.memory.packing import MeshPacking, place_stages
from hybridplan.search.memory.space import PlanSpace, count_plans, enumerate_plans
from hybridplan.search.memory.synthetic import TableStageModel
from tests.search.search_reference import stages_of


def test_configs_are_none_plus_data_and_tensor_at_each_power_of_two_in_canonical_order() -> None:
    for k in (1, 2, 4, 8, 16):
        configs = stage_configs(k)
        assert len(configs) == 2 * int(math.log2(k)) + 1
        ranks = [({"none": 0, "data": 1, "tensor": 2}[c.kind], c.degree) for c in configs]
        assert ranks == sorted(ranks)
    assert [c.degree for c in stage_configs(6)] == [1, 2, 4, 2, 4]
    assert stage_configs(8, pipeline_only=True) == (("none", 1, 0, 0, False),)


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


# --- issue 9, item 6: a mesh too big for the model fails at once, and suggests a smaller mesh ---------------


def test_too_few_layers_for_a_huge_mesh_fails_fast_and_suggests_fewer_nodes() -> None:
    started = time.perf_counter()
    with pytest.raises(PlanError) as info:
        PlanSpace(10, 1000, 1000)
    seconds = time.perf_counter() - started
    assert seconds < 1.0, f"{seconds:.2f} s: the space must be rejected before the packing is built"
    message, fix = info.value.message, info.value.fix or ""
    assert "1000x1000 mesh needs at least 6000 stages" in message and "10 layers" in message
    assert "--cluster 1x1000" in fix and "at most 1 node" in fix and "fewer devices" in fix
    assert "more devices" not in fix and "larger" not in fix.split(";")[0]


def _suggested_meshes(fix: str) -> list[tuple[int, int]]:
    return [(int(n), int(k)) for n, k in re.findall(r"--cluster (\d+)x(\d+)", fix)]


@settings(max_examples=300, deadline=None)
@given(layers=st.integers(1, 40), nodes=st.integers(1, 64), k=st.integers(1, 64), pipeline_only=st.booleans())
def test_every_suggested_mesh_is_smaller_and_has_plans(layers: int, nodes: int, k: int, pipeline_only: bool) -> None:
    try:
        PlanSpace(layers, nodes, k, pipeline_only)
    except PlanError as e:
        assert "stages" in e.message and f"{layers} layers" in e.message
        suggested = _suggested_meshes(e.fix or "")
        assert suggested, e.fix
        for n2, k2 in suggested:
            assert n2 <= nodes and k2 <= k and n2 * k2 < nodes * k
            PlanSpace(layers, n2, k2, pipeline_only)  # has plans: raises nothing
    else:
        assert layers >= (nodes * k if pipeline_only else nodes * k.bit_count())


def test_max_stages_below_the_mesh_suggests_fewer_nodes() -> None:
    with pytest.raises(PlanError, match="max_stages 3 is below the 8 stages a 8x4 mesh needs") as info:
        PlanSpace(20, 8, 4, max_stages=3)
    assert "use at most 3 nodes of 4 devices" in (info.value.fix or "")
    PlanSpace(20, 3, 4, max_stages=3)
    with pytest.raises(PlanError) as info:
        PlanSpace(20, 2, 6, max_stages=1)  # 4 + 2 on each node: 2 stages per node
    assert "use at most 1 node of 4 devices" in (info.value.fix or "")
    PlanSpace(20, 1, 4, max_stages=1)


@pytest.mark.parametrize("pipeline_only", [False, True])
def test_min_stages_by_arithmetic_equals_the_packing_machine(pipeline_only: bool) -> None:
    for nodes, k in itertools.product(range(1, 5), range(1, 13)):
        space = PlanSpace(nodes * k, nodes, k, pipeline_only)
        assert space.min_stages == space.packing.to_finish[space.packing.start], (nodes, k)


def _to_finish_one_by_one(pk: MeshPacking) -> list[int]:
    """The fewest stages from each state to a full mesh, relaxing state by state (the former loop)."""
    out = [0 if a else len(pk.keys) + 10**6 for a in pk.accepting]
    for r in range(pk.num_states - 1, -1, -1):
        for n in pk.next[r]:
            if n >= 0:
                out[r] = min(out[r], out[n] + 1)
    return out


@pytest.mark.parametrize(("nodes", "k"), [(1, 1), (3, 4), (2, 6), (3, 7), (2, 12), (4, 3)])
def test_fewest_stages_to_finish_match_a_state_by_state_relaxation(nodes: int, k: int) -> None:
    pk = MeshPacking(nodes, k, [c.degree for c in stage_configs(k)])
    unreachable = nodes * k + 1
    expected = [v if v < len(pk.keys) + 10**6 else unreachable for v in _to_finish_one_by_one(pk)]
    assert pk.to_finish.tolist() == expected


def test_a_space_with_plans_builds_its_packing_only_when_asked() -> None:
    # 1x1000 needs 6 stages; its packing has ~4.7 million states (minutes): the constructor must not build it.
    started = time.perf_counter()
    space = PlanSpace(10, 1, 1000)
    assert time.perf_counter() - started < 1.0
    assert space.min_stages == 6 and "_packing" not in vars(space)
    small = PlanSpace(6, 2, 4)
    assert small.packing is small.mesh_packing() and small == PlanSpace(6, 2, 4)
    assert hash(small) == hash(PlanSpace(6, 2, 4))


def _with_full_packing(space: PlanSpace) -> PlanSpace:
    """A copy of ``space`` whose packing machine is the unbounded one (every packable multiset)."""
    twin = PlanSpace(space.num_layers, space.num_nodes, space.devices_per_node, space.pipeline_only, space.max_stages)
    full = MeshPacking(space.num_nodes, space.devices_per_node, [c.degree for c in space.configs])
    object.__setattr__(twin, "_packing", full)
    return twin


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 3), k=st.sampled_from([3, 5, 6, 7, 12]), extra=st.integers(0, 5),
       max_stages=st.one_of(st.none(), st.integers(1, 12)), seed=st.integers(0, 3))
def test_the_bounded_packing_has_the_same_plans_and_best_plan(nodes: int, k: int, extra: int,
                                                              max_stages: int | None, seed: int) -> None:
    layers = nodes * k.bit_count() + extra
    try:
        space = PlanSpace(layers, nodes, k, max_stages=max_stages)
    except PlanError:
        return
    full = _with_full_packing(space)
    assert space.packing.num_states <= full.packing.num_states
    count = count_plans(space)
    assert count == count_plans(full)
    if count <= 3000:  # enumerating is slow beyond that; the counts and the best plan still compare
        assert set(enumerate_plans(space)) == set(enumerate_plans(full))
    model = TableStageModel.random(layers, k, horizon=2, seed=seed)
    a, b = solve_exact(model, space), solve_exact(model, full)
    assert stages_of(a) == stages_of(b) and a.device_values == b.device_values and a.visited == b.visited


def test_a_few_layers_on_a_wide_node_keep_the_packing_small() -> None:
    # One node of 1000 devices: 4.7 million states unbounded; 10 layers allow plans of at most 10 stages.
    started = time.perf_counter()
    pk = PlanSpace(10, 1, 1000).packing
    assert time.perf_counter() - started < 5.0
    assert pk.num_states < 10_000 and pk.to_finish[pk.start] == 6
