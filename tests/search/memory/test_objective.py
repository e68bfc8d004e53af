"""The score: leximax keys, the stage table, and results as plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.objective import StageTable, leximax_key
from hybridplan.search.memory.configs import StageConfig
from hybridplan.search.memory.space import PlanSpace
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel
from tests.search.search_reference import paper_order_key

values = st.lists(st.integers(0, 4).map(float), min_size=1, max_size=8)


def _key(devices: list[float]) -> tuple:
    return leximax_key((v, 1) for v in devices)


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_leximax_key_orders_plans_as_the_paper_rule(a: list[float], data: st.DataObject) -> None:
    b = data.draw(st.lists(st.integers(0, 4).map(float), min_size=len(a), max_size=len(a)))
    assert (_key(a) < _key(b)) == (paper_order_key(a) < paper_order_key(b))
    assert (_key(a) == _key(b)) == (sorted(a) == sorted(b))


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_leximax_order_survives_adding_the_same_devices(a: list[float], data: st.DataObject) -> None:
    """The property the exact solver's dynamic programming rests on."""
    b = data.draw(st.lists(st.integers(0, 4).map(float), min_size=len(a), max_size=len(a)))
    c = data.draw(values)
    if _key(a) < _key(b):
        assert _key(a + c) < _key(b + c)
    elif _key(a) == _key(b):
        assert _key(a + c) == _key(b + c)


def test_leximax_key_groups_equal_values() -> None:
    assert leximax_key([(3.0, 2), (5.0, 1), (3.0, 1)]) == (5.0, 1, 3.0, 3)


def test_stage_table_matrix_and_call_paths_agree_bit_for_bit() -> None:
    model = AdditiveStageModel.transformer(9, horizon=3, seed=4, microbatch_size=2)
    space = PlanSpace(9, 2, 4)

    class CallsOnly:
        position_horizon = model.position_horizon
        stage_memory = staticmethod(model.stage_memory)
        allowed = staticmethod(model.allowed)

    fast, slow = StageTable(model, space), StageTable(CallsOnly(), space)
    assert np.array_equal(fast.values, slow.values)
    assert np.isinf(fast.values[space.configs.index(StageConfig("tensor", 2)), :, 0, 9]).all()  # the head is not tensor-parallel
    assert np.isinf(fast.values[space.configs.index(StageConfig("data", 4))]).all()  # 4 does not divide the micro-batch of 2


def test_stage_table_caps_positions_at_the_deepest_pipeline() -> None:
    model = TableStageModel.random(3, 2, horizon=8, seed=0)
    table = StageTable(model, PlanSpace(3, 1, 2))
    assert table.horizon == 2  # at most 2 stages on 2 devices


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_stage_table_rejects_non_finite_predictions(bad: float) -> None:
    model = TableStageModel.random(3, 1, horizon=1, seed=0)
    model.values[("none", 1, 0)][0, 0, 2] = bad
    with pytest.raises(PlanError, match=r"layers \[0, 2\) none x1"):
        StageTable(model, PlanSpace(3, 1, 1))


def test_stage_table_rejects_a_bad_horizon() -> None:
    class NoHorizon:
        position_horizon = 0

        def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int) -> float:
            return 1.0

        def allowed(self, start: int, stop: int, kind: str, degree: int) -> bool:
            return True

    with pytest.raises(PlanError, match="position_horizon"):
        StageTable(NoHorizon(), PlanSpace(2, 1, 1))


def test_a_table_from_another_space_is_refused() -> None:
    model = TableStageModel.random(4, 2, horizon=1, seed=0)
    table = StageTable(model, PlanSpace(4, 1, 2))
    with pytest.raises(PlanError, match="stage table was built for"):
        solve_exact(model, PlanSpace(4, 2, 1), table=table)
