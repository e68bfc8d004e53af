"""The extended space (``PlanSpace(..., composite=True)``): data x tensor stages beside CAPTURE's, searched
exactly (the exact solver equals exhaustive enumeration, as on CAPTURE's space), and planned from a profile."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.search import PlanSpace, count_plans, solve_exact, solve_exhaustive
from hybridplan.search.memory.configs import StageConfig, stage_configs
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel


def test_composite_configs_follow_capture_s_in_canonical_order():
    configs = stage_configs(8, composite=True)
    assert configs[: len(stage_configs(8))] == stage_configs(8)  # CAPTURE's configs keep their indices
    extra = configs[len(stage_configs(8)):]
    # both degrees powers of two >= 2 with d * t <= 8: (2, 2), (4, 2), (2, 4); ordered by degree, then tensor
    assert extra == (StageConfig("data+tensor", 4, 2), StageConfig("data+tensor", 8, 2), StageConfig("data+tensor", 8, 4))
    assert stage_configs(2, composite=True) == stage_configs(2)  # a node of 2 holds no 2 x 2 stage


def test_the_extended_space_holds_more_plans():
    # 4 layers on 1x4: CAPTURE's 1x4 plans plus those with a 2 x 2 stage (the whole node: the 4 layers in one
    # stage, a single plan) -> exactly one more
    assert count_plans(PlanSpace(4, 1, 4, composite=True)) == count_plans(PlanSpace(4, 1, 4)) + 1


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 7), nodes=st.integers(1, 2), k=st.sampled_from([4, 8]), horizon=st.integers(1, 3),
       seed=st.integers(0, 1000), levels=st.integers(2, 4), zero=st.booleans())
def test_exact_equals_exhaustive_on_the_extended_space(layers, nodes, k, horizon, seed, levels, zero):
    """With ``zero`` the ZeRO-1/ZeRO-3 data stages too (tests/search/memory/test_zero_space.py)."""
    if layers < nodes:
        return
    space = PlanSpace(layers, nodes, k, composite=True, zero=zero)
    model = TableStageModel.random(layers, k, horizon=horizon, seed=seed, levels=levels, p_disallowed=0.2, composite=True,
                                   zero=zero)
    try:
        exhaustive = solve_exhaustive(model, space)
    except Exception as e:  # every plan disallowed: both must say so
        with pytest.raises(type(e)):
            solve_exact(model, space)
        return
    exact = solve_exact(model, space)
    assert [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero) for s in exact.stages] == \
        [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero) for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak


def test_a_data_tensor_stage_can_win_and_becomes_a_plan():
    """On the additive stand-in a data x tensor stage splits both the weights and the activations, so the
    extended optimum is at most CAPTURE's; its plan carries the tensor degree."""
    model = AdditiveStageModel.transformer(8, horizon=4, seed=2, microbatch_size=8)
    capture = solve_exact(model, PlanSpace(8, 1, 8))
    extended = solve_exact(model, PlanSpace(8, 1, 8, composite=True))
    assert extended.peak <= capture.peak
    plan = extended.to_plan(schedule="1f1b", global_batch_size=32, num_microbatches=4)
    composite = [s for s in plan.stages if s.parallelism == "data+tensor"]
    assert all(s.tensor_degree >= 2 and s.degree % s.tensor_degree == 0 for s in composite)


def test_planning_time_of_the_extended_space_at_4x4_with_64_layers():
    """A behaviour bound, not a benchmark (benchmarks/search_time has the table): well under the issue's 1 s."""
    model = AdditiveStageModel.transformer(64, horizon=4, seed=0)
    started = time.perf_counter()
    solve_exact(model, PlanSpace(64, 4, 4, composite=True))
    assert time.perf_counter() - started < 5.0
