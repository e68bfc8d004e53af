"""Cutting a layer chain into stages (search/time/stage_cuts.py): AMP's dynamic program and the min-max partition
against brute force over every cut."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import PlanError
from hybridplan.search.time.stage_cuts import amp_layer_assignment, assignment_objective, min_max_assignment
from tests.search.time.util import all_cuts


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 7), gas=st.integers(1, 6), stage_dependent=st.booleans(),
       floors=st.sampled_from([None, 0.5, 3.0]))
def test_amp_dp_matches_brute_force(data: st.DataObject, num_layers: int, gas: int, stage_dependent: bool, floors: float | None) -> None:
    k = data.draw(st.integers(1, num_layers))
    cost = st.lists(st.integers(0, 9).map(float), min_size=num_layers, max_size=num_layers).map(np.array)
    base = data.draw(cost)
    stage_costs = [data.draw(cost) if stage_dependent else base for _ in range(k)]
    cut_costs = [data.draw(cost) / 4 for _ in range(k - 1)]
    cut_floors = None if floors is None else [c * floors for c in cut_costs]
    found = amp_layer_assignment(stage_costs, cut_costs, gas, cut_floors)
    best = min(assignment_objective(b, stage_costs, cut_costs, gas, cut_floors) for b in all_cuts(num_layers, k))
    assert found.objective == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert found.boundaries[0] == 0 and found.boundaries[-1] == num_layers and len(found.boundaries) == k + 1
    assert all(a < b for a, b in zip(found.boundaries, found.boundaries[1:]))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 7))
def test_min_max_matches_brute_force_with_fill_tie_break(data: st.DataObject, num_layers: int) -> None:
    k = data.draw(st.integers(1, num_layers))
    cost = st.lists(st.integers(0, 9).map(float), min_size=num_layers, max_size=num_layers).map(np.array)
    stage_costs = [data.draw(cost) for _ in range(k)]
    cuts = [data.draw(cost) for _ in range(k - 1)]
    floors = [c / 2 for c in cuts]

    def period(b: tuple[int, ...]) -> float:
        return max([float(stage_costs[j][b[j] : b[j + 1]].sum()) for j in range(k)] + [floors[j - 1][b[j] - 1] for j in range(1, k)])

    def fill(b: tuple[int, ...]) -> float:
        return sum(float(stage_costs[j][b[j] : b[j + 1]].sum()) for j in range(k)) + sum(cuts[j - 1][b[j] - 1] for j in range(1, k))

    found = min_max_assignment(stage_costs, floors, cuts)
    best = min(period(b) for b in all_cuts(num_layers, k))
    assert found.objective == pytest.approx(best) and period(found.boundaries) == pytest.approx(best)
    assert fill(found.boundaries) == pytest.approx(min(fill(b) for b in all_cuts(num_layers, k) if period(b) <= best + 1e-9))


def test_dp_rejects_too_many_stages() -> None:
    with pytest.raises(PlanError, match="cannot cut 2 layers into 3"):
        amp_layer_assignment([np.ones(2)] * 3, [np.zeros(2)] * 2, 4)


def test_min_max_avoids_a_slow_boundary_and_breaks_the_tie_by_the_fill() -> None:
    # Four layers of 1 s on two stages. Cutting after layer 1 balances the stages (2 s each) but its transfer
    # paces the pipeline at 5 s; cutting after layer 0 or 2 gives 3 s. Of those two, the one whose boundary
    # costs nothing (after layer 0) fills the pipeline faster: 4 s against 4 + 1 s.
    ones = np.ones(4)
    found = min_max_assignment([ones, ones], [np.array([0.0, 5.0, 0.0])], [np.array([0.0, 0.0, 1.0])])
    assert found.boundaries == (0, 1, 4) and found.objective == 3.0
    assert min_max_assignment([ones, ones], [np.zeros(3)]).boundaries == (0, 2, 4)  # no floors: balanced


def test_the_objective_of_given_boundaries_by_hand() -> None:
    # stages [0, 2) and [2, 3) on costs 1, 1, 2: t = 2 and 2, e = 0.5 after layer 1; 4 micro-batches:
    # (4 - 1) * 2 + (2 + 2) + 0.5 = 10.5; a floor of 3 on that boundary paces instead: 3 * 3 + 4 + 0.5 = 13.5
    costs = [np.array([1.0, 1.0, 2.0])] * 2
    assert assignment_objective((0, 2, 3), costs, [np.array([0.0, 0.5, 0.0])], 4) == 10.5
    assert assignment_objective((0, 2, 3), costs, [np.array([0.0, 0.5, 0.0])], 4, [np.array([0.0, 3.0, 0.0])]) == 13.5
