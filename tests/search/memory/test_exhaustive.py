"""The enumerating solver (CAPTURE's Algorithm 4, mCAP-BF): it scores every plan, or prunes and finds the same one."""

from __future__ import annotations

import pytest

from hybridplan.search.memory.exhaustive import solve_exhaustive
from hybridplan.search.memory.space import PlanSpace, count_plans
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel
from tests.search.search_reference import brute_force, stages_of


def test_unpruned_exhaustive_scores_every_plan() -> None:
    model = TableStageModel.random(6, 4, horizon=2, seed=3)
    space = PlanSpace(6, 1, 4)
    assert solve_exhaustive(model, space, prune=False).visited == count_plans(space)
    assert solve_exhaustive(model, space).visited < count_plans(space)


@pytest.mark.parametrize("seed", range(4))
def test_pruning_changes_the_work_not_the_answer(seed: int) -> None:
    model = TableStageModel.random(5, 4, horizon=2, seed=seed)
    space = PlanSpace(5, 2, 4)
    pruned, unpruned = solve_exhaustive(model, space), solve_exhaustive(model, space, prune=False)
    assert stages_of(pruned) == stages_of(unpruned) and pruned.device_values == unpruned.device_values
    reference = brute_force(model, space)
    assert stages_of(pruned) == reference[0]


def test_one_device_one_layer_is_the_only_plan() -> None:
    """One layer on one device: the single plan is the layer alone, its peak ``M_i`` (200 by construction)."""
    model = AdditiveStageModel(isolated=(200.0,), added=(150.0,), activation=(30.0,))
    result = solve_exhaustive(model, PlanSpace(1, 1, 1))
    assert result.visited == 1 and result.peak == 200.0
