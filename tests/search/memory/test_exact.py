"""Exact and exhaustive solvers: the same unique plan as brute force, on random small instances."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.exhaustive import solve_exhaustive
from hybridplan.search.memory.space import PlanSpace, count_plans
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel
from tests.search.search_reference import brute_force, stages_of

MESHES = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (2, 4), (1, 8), (1, 3), (2, 3), (1, 6)]


@st.composite
def instances(draw: st.DrawFn) -> tuple[TableStageModel, PlanSpace]:
    nodes, k = draw(st.sampled_from(MESHES))
    layers = draw(st.integers(1, 8) if draw(st.integers(0, 4)) == 0 else st.integers(5, 8))
    pipeline_only = draw(st.integers(0, 4)) == 0
    max_stages = draw(st.integers(1, 6)) if draw(st.integers(0, 3)) == 0 else None
    try:
        space = PlanSpace(layers, nodes, k, pipeline_only, max_stages)
    except PlanError:
        assume(False)
    assume(count_plans(space) <= 8000)  # keeps brute force and the no-pruning enumeration quick
    model = TableStageModel.random(
        layers, k, horizon=draw(st.sampled_from([1, 2, 3, 8])), seed=draw(st.integers(0, 2**32 - 1)),
        levels=draw(st.integers(1, 3)), p_disallowed=draw(st.sampled_from([0.0, 0.3])),
    )
    return model, space


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(instances())
def test_exact_equals_exhaustive_equals_brute_force(instance: tuple[TableStageModel, PlanSpace]) -> None:
    model, space = instance
    reference = brute_force(model, space)
    if reference is None:
        for solver in (solve_exact, solve_exhaustive):
            with pytest.raises(PlanError, match="does not allow"):
                solver(model, space)
        return
    exhaustive, exact = solve_exhaustive(model, space), solve_exact(model, space)
    unpruned = solve_exhaustive(model, space, prune=False)
    assert stages_of(exhaustive) == stages_of(exact) == stages_of(unpruned) == reference[0]
    assert [s.devices for s in exhaustive.stages] == [s.devices for s in exact.stages]
    assert sorted(exact.device_values, reverse=True) == reference[1]
    assert exhaustive.visited <= unpruned.visited <= count_plans(space)
    cluster = space.cluster()
    for result in (exhaustive, exact):
        result.to_plan(schedule="1f1b", global_batch_size=16, num_microbatches=2).validate(
            num_layers=space.num_layers, cluster=cluster)


def test_ties_go_to_the_canonical_plan() -> None:
    """All stages cost the same: every plan ties, so the canonical first plan wins (earliest stops, kind none)."""
    model = TableStageModel.random(4, 2, horizon=1, seed=0, levels=1)
    space = PlanSpace(4, 1, 2)
    for solver in (solve_exact, solve_exhaustive):
        assert stages_of(solver(model, space)) == [(0, 1, "none", 1), (1, 4, "none", 1)]


@pytest.mark.parametrize("jitter", [0.05, 0.0])  # 0: identical blocks, many exact ties among float values
@pytest.mark.parametrize(("nodes", "k", "layers", "horizon"), [(2, 4, 12, 4), (1, 8, 10, 1), (2, 3, 9, 2), (2, 2, 14, 1)])
def test_exact_equals_exhaustive_on_an_additive_model(nodes: int, k: int, layers: int, horizon: int, jitter: float) -> None:
    model = AdditiveStageModel.transformer(layers, horizon=horizon, seed=layers, jitter=jitter)
    space = PlanSpace(layers, nodes, k)
    exact, exhaustive = solve_exact(model, space), solve_exhaustive(model, space)
    assert stages_of(exact) == stages_of(exhaustive)
    assert exact.device_values == exhaustive.device_values
    assert all(s.kind != "tensor" for s in exact.stages if s.stop == layers)  # the head cannot be tensor-parallel


def test_result_knows_its_values_and_devices() -> None:
    model = AdditiveStageModel.transformer(8, horizon=2, seed=1)
    result = solve_exact(model, PlanSpace(8, 2, 2))
    assert result.peak == max(result.device_values) == max(s.value for s in result.stages)
    for s in result.stages:
        assert all(result.device_values[d] == s.value for d in s.devices)
    plan = result.to_plan(schedule="gpipe", global_batch_size=4, num_microbatches=2)
    assert [st.parallelism for st in plan.stages if st.degree == 1] == ["none"] * sum(s.degree == 1 for s in result.stages)
    assert "peak" in result.describe()


def test_to_plan_reports_a_batch_that_does_not_fit() -> None:
    model = TableStageModel.random(2, 2, horizon=1, seed=0)
    model.values[("none", 1, 0)][:] = 9.0  # force the single data-parallel stage
    model.values[("tensor", 2, 0)][:] = 9.0
    result = solve_exact(model, PlanSpace(2, 1, 2))
    assert result.stages[0].kind == "data"
    with pytest.raises(PlanError, match="does not divide the micro-batch size"):
        result.to_plan(schedule="1f1b", global_batch_size=3, num_microbatches=3)


@pytest.mark.parametrize("horizon", [8, 1])
def test_exact_is_fast_on_a_4x4_mesh_with_64_layers(horizon: int) -> None:
    model = AdditiveStageModel.transformer(64, horizon=horizon, seed=0)
    started = time.perf_counter()
    result = solve_exact(model, PlanSpace(64, 4, 4))
    assert time.perf_counter() - started < 2.0  # target 1 s; slack for loaded CI machines
    assert result.num_nodes == 4 and len(result.device_values) == 16


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(instances())
def test_exact_equals_brute_force_many_more(instance: tuple[TableStageModel, PlanSpace]) -> None:
    model, space = instance
    reference = brute_force(model, space)
    assume(reference is not None)
    assert stages_of(solve_exact(model, space)) == reference[0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(instances())
def test_an_unsplit_last_stage_is_the_best_plan_without_tensor_at_the_end(
        instance: tuple[TableStageModel, PlanSpace]) -> None:
    """PlanSpace(unsplit_last_stage=True), Megatron-LM's plans (runtime/engines.py): the exact solver's answer is
    brute force's best of the plans whose last stage is not tensor-parallel, and every stage before it may be."""
    import dataclasses

    model, space = instance
    space = dataclasses.replace(space, unsplit_last_stage=True)
    reference = brute_force(model, space, keep=lambda stages: stages[-1][2] != "tensor")
    if reference is None:
        with pytest.raises(PlanError):
            solve_exact(model, space)
        return
    exact = solve_exact(model, space)
    assert stages_of(exact) == reference[0]
    assert sorted(exact.device_values, reverse=True) == reference[1]
    assert exact.stages[-1].kind != "tensor"


def test_tensor_everywhere_but_the_last_stage_where_tensor_is_cheapest() -> None:
    """Tensor x2 holds nothing, every other config 5 bytes: unconstrained, both nodes' stages are tensor; with the
    last stage unsplit, the last stage is not, a tensor stage still fills one node (two devices at 5 bytes, not
    four)."""
    import dataclasses

    import numpy as np

    base = TableStageModel.random(4, 2, horizon=2, seed=1)
    values = {key: np.zeros_like(v) if key[0] == "tensor" else np.full_like(v, 5.0) for key, v in base.values.items()}
    model = TableStageModel(values, {})
    space = PlanSpace(4, 2, 2)
    free = solve_exact(model, space)
    assert [s.kind for s in free.stages] == ["tensor", "tensor"]
    held = solve_exact(model, dataclasses.replace(space, unsplit_last_stage=True))
    assert held.stages[-1].kind != "tensor" and any(s.kind == "tensor" for s in held.stages)
    assert sorted(held.device_values) == [0.0, 0.0, 5.0, 5.0]
