"""Activation recompute as a per-stage dimension of the memory search (``PlanSpace(..., recompute=True)``): every
stage config also recomputed, searched exactly (the exact solver equals exhaustive enumeration)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.search import PlanSpace, count_plans, solve_exact, solve_exhaustive
from hybridplan.search.memory.configs import StageConfig, stage_configs
from hybridplan.search.memory.synthetic import RECOMPUTE_KEPT, AdditiveStageModel, TableStageModel


def test_recomputed_configs_come_last_and_keep_the_other_indices():
    plain = stage_configs(4, composite=True, zero=True)
    both = stage_configs(4, composite=True, zero=True, recompute=True)
    assert both[: len(plain)] == plain
    assert both[len(plain):] == tuple(StageConfig(c.kind, c.degree, c.tensor_degree, c.zero, True) for c in plain)
    assert StageConfig("none", 1, recompute=True).model_kwargs == {"recompute": True}
    assert StageConfig("data", 2, 0, 1, True).label == "data x2 ZeRO-1 recompute"
    assert stage_configs(4, pipeline_only=True, recompute=True) == (StageConfig("none", 1),
                                                                    StageConfig("none", 1, recompute=True))


def test_recompute_doubles_the_choices_of_every_stage():
    # 2 layers on 1x2: data x2 or tensor x2 over both layers (one stage), or one layer per device (two stages):
    # 3 plans; each stage may recompute or not: 2 + 2 + 4 = 8
    assert count_plans(PlanSpace(2, 1, 2)) == 3
    assert count_plans(PlanSpace(2, 1, 2, recompute=True)) == 8


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 6), nodes=st.integers(1, 2), horizon=st.integers(1, 3), seed=st.integers(0, 1000),
       levels=st.integers(2, 4))
def test_exact_equals_exhaustive_with_recompute_on_nodes_of_two(layers, nodes, horizon, seed, levels):
    """Random integer tables: many ties between a stage and its recomputed twin, the tie-break decides."""
    if layers < nodes:
        return
    model = TableStageModel.random(layers, 2, horizon=horizon, seed=seed, levels=levels, zero=True, recompute=True)
    space = PlanSpace(layers, nodes, 2, zero=True, recompute=True)
    exact, exhaustive = (solve(model, space) for solve in (solve_exact, solve_exhaustive))
    assert [(s.start, s.stop, s.kind, s.degree, s.zero, s.recompute) for s in exact.stages] == \
        [(s.start, s.stop, s.kind, s.degree, s.zero, s.recompute) for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(2, 5), horizon=st.integers(1, 3), seed=st.integers(0, 1000))
def test_exact_equals_exhaustive_with_recompute_in_the_extended_space_of_four(layers, horizon, seed):
    model = TableStageModel.random(layers, 4, horizon=horizon, seed=seed, levels=3, composite=True, recompute=True)
    space = PlanSpace(layers, 1, 4, composite=True, recompute=True)
    exact, exhaustive = (solve(model, space) for solve in (solve_exact, solve_exhaustive))
    assert [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.recompute) for s in exact.stages] == \
        [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.recompute) for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak


def test_recompute_is_chosen_where_it_lowers_the_peak_and_only_there():
    """Four equal layers (M_i = M_a = 100, activations 80) on two devices, pipeline-only, 1F1B with 2 micro-batches:
    the first stage holds a second micro-batch's activations, 80 per layer (RECOMPUTE_KEPT = 1/4 of it, 20, when
    recomputed). By hand: plain, [0,1) [1,4) peaks at max(180, 300) = 300 and [0,2) [2,4) at max(360, 200);
    recomputing the first stage, [0,2) [2,4) peaks at max(2*120, 200) = 240, the best. The last stage has nothing
    more in flight: recomputing it gains nothing, and the tie-break keeps it plain."""
    assert RECOMPUTE_KEPT == 0.25
    model = AdditiveStageModel((100.0,) * 4, (100.0,) * 4, (80.0,) * 4, position_horizon=2)
    plain = solve_exact(model, PlanSpace(4, 1, 2, pipeline_only=True))
    best = solve_exact(model, PlanSpace(4, 1, 2, pipeline_only=True, recompute=True))
    assert plain.peak == 300.0 and best.peak == 240.0
    assert [(s.start, s.stop, s.recompute) for s in best.stages] == [(0, 2, True), (2, 4, False)]
    assert best.to_plan(schedule="1f1b", global_batch_size=2, num_microbatches=2).stages[0].recompute == "full"
