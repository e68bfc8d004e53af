"""ZeRO as a per-stage dimension of the memory search (``PlanSpace(..., zero=True)``): ZeRO-1, ZeRO-2 and ZeRO-3
data stages beside the others, searched exactly (the exact solver equals exhaustive enumeration)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.search import PlanSpace, count_plans, solve_exact, solve_exhaustive
from hybridplan.search.memory.configs import StageConfig, stage_configs
from hybridplan.search.memory.synthetic import TableStageModel


def test_zero_configs_come_last_and_keep_the_other_indices():
    plain, extended = stage_configs(4, composite=True), stage_configs(4, composite=True, zero=True)
    assert extended[: len(plain)] == plain
    assert extended[len(plain):] == (StageConfig("data", 2, 0, 1), StageConfig("data", 4, 0, 1),
                                     StageConfig("data", 2, 0, 3), StageConfig("data", 4, 0, 3),
                                     StageConfig("data", 2, 0, 2), StageConfig("data", 4, 0, 2),
                                     StageConfig("data+tensor", 4, 2, 3),  # search/memory/configs.py: ZeRO-3 and ZeRO-2
                                     StageConfig("data+tensor", 4, 2, 2),  # of data x tensor, last
                                     StageConfig("data+tensor", 4, 2, 1))
    assert StageConfig("data+tensor", 4, 2, 3).model_kwargs == {"tensor_degree": 2, "zero": 3}
    assert StageConfig("data+tensor", 4, 2, 3).label == "data x2 + tensor x2 ZeRO-3"
    assert stage_configs(4, zero=True)[-1] == StageConfig("data", 4, 0, 2)  # without composite: no data x tensor
    assert StageConfig("data", 2, 0, 1).model_kwargs == {"zero": 1} and StageConfig("data", 2).model_kwargs == {}


def test_zero_multiplies_the_data_stages():
    # 2 layers on 1x2, every device used: both layers as data x2 or tensor x2, or one layer per device: 3 plans;
    # ZeRO-1, ZeRO-2 and ZeRO-3 are three more ways to run the data x2 stage: 6
    assert count_plans(PlanSpace(2, 1, 2)) == 3
    assert count_plans(PlanSpace(2, 1, 2, zero=True)) == 6


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 6), nodes=st.integers(1, 2), horizon=st.integers(1, 3), seed=st.integers(0, 1000),
       levels=st.integers(2, 4))
def test_exact_equals_exhaustive_with_zero_on_nodes_of_two(layers, nodes, horizon, seed, levels):
    """Nodes of 2 devices (the extended space's property test covers 4 and 8): only data x2 shards, the ZeRO
    levels are the only extension, and ties between them are many."""
    if layers < nodes:
        return
    model = TableStageModel.random(layers, 2, horizon=horizon, seed=seed, levels=levels, zero=True)
    exact, exhaustive = (solve(model, PlanSpace(layers, nodes, 2, zero=True)) for solve in (solve_exact, solve_exhaustive))
    assert [(s.start, s.stop, s.kind, s.degree, s.zero) for s in exact.stages] == \
        [(s.start, s.stop, s.kind, s.degree, s.zero) for s in exhaustive.stages]
    assert exact.peak == exhaustive.peak
