"""mCAP-BO: valid plans always, reproducible per seed, the optimum on small spaces most of the time."""

from __future__ import annotations

import numpy as np
import pytest

from hybridplan.errors import PlanError
from hybridplan.search.memory.bayesian import GaussianProcess, PlanEncoding, expected_improvement, solve_bayesian
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.space import PlanSpace
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel

CASES = [(8, 1, 4, True), (6, 1, 4, False), (7, 2, 2, False), (9, 2, 4, False), (6, 1, 3, False)]


def test_every_point_decodes_to_a_valid_plan() -> None:
    rng = np.random.default_rng(0)
    for layers, nodes, k, pipeline_only in CASES + [(20, 4, 4, False), (12, 2, 6, False)]:
        space = PlanSpace(layers, nodes, k, pipeline_only)
        encoding = PlanEncoding(space, lambda a, b, ci: True)
        cluster = space.cluster()
        for x in np.vstack([rng.random((50, encoding.dim)), np.zeros((1, encoding.dim)), np.ones((1, encoding.dim))]):
            choices = encoding.decode(x)
            devices = space.place(choices)  # raises if the degrees do not pack
            assert choices[0].start == 0 and choices[-1].stop == layers
            assert all(a.stop == b.start and a.start < a.stop for a, b in zip(choices, choices[1:]))
            assert sorted(d for devs in devices for d in devs) == list(range(cluster.num_devices))


def _hit_rate(seeds: range, samples: int) -> tuple[int, int]:
    hits = runs = 0
    for seed in seeds:
        for layers, nodes, k, pipeline_only in CASES:
            model = AdditiveStageModel.transformer(layers, horizon=2, seed=seed)
            space = PlanSpace(layers, nodes, k, pipeline_only)
            result = solve_bayesian(model, space, seed=seed, samples=samples)
            result.to_plan(schedule="1f1b", global_batch_size=16, num_microbatches=2)  # validates
            assert result.visited == 75
            hits += result.peak == solve_exact(model, space).peak
            runs += 1
    return hits, runs


def test_finds_the_optimum_on_small_spaces_most_of_the_time() -> None:
    hits, runs = _hit_rate(range(2), samples=300)
    assert hits >= 0.6 * runs, f"optimum found in {hits} of {runs} runs"


@pytest.mark.slow
def test_finds_the_optimum_on_small_spaces_most_of_the_time_many_seeds() -> None:
    hits, runs = _hit_rate(range(20), samples=2000)
    assert hits >= 0.7 * runs, f"optimum found in {hits} of {runs} runs"


def test_same_seed_same_answer() -> None:
    model = AdditiveStageModel.transformer(12, horizon=4, seed=1)
    space = PlanSpace(12, 2, 4)
    a, b = (solve_bayesian(model, space, seed=7, budget=20, samples=300) for _ in range(2))
    assert a.stages == b.stages and a.device_values == b.device_values


def test_disallowed_stages_are_never_returned() -> None:
    model = TableStageModel.random(6, 4, horizon=2, seed=5, p_disallowed=0.5)
    space = PlanSpace(6, 1, 4)
    result = solve_bayesian(model, space, seed=0, budget=30, samples=300)
    assert all(model.allowed(s.start, s.stop, s.kind, s.degree) for s in result.stages)
    assert np.isfinite(result.peak)


def test_bad_budget_and_hopeless_models_raise() -> None:
    model = TableStageModel.random(4, 2, horizon=1, seed=0)
    with pytest.raises(PlanError, match="budget"):
        solve_bayesian(model, PlanSpace(4, 1, 2), budget=0)
    model.disallowed[("none", 1, 0)] = np.ones((4, 5), dtype=bool)
    model.disallowed[("data", 2, 0)] = np.ones((4, 5), dtype=bool)
    model.disallowed[("tensor", 2, 0)] = np.ones((4, 5), dtype=bool)
    with pytest.raises(PlanError, match="none of the"):
        solve_bayesian(model, PlanSpace(4, 1, 2), budget=5)


def test_gaussian_process_interpolates_and_expected_improvement_prefers_low_means() -> None:
    x = np.linspace(0, 1, 8)[:, None]
    y = np.sin(6 * x[:, 0])
    gp = GaussianProcess().fit(x, y)
    mu, sigma = gp.predict(x)
    assert np.allclose(mu * gp.std + gp.mean, y, atol=1e-2) and (sigma < 0.05).all()
    ei = expected_improvement(np.array([0.0, 1.0]), np.array([0.1, 0.1]), best=0.5, xi=0.0)
    assert ei[0] > ei[1] >= 0


def test_non_finite_predictions_are_reported() -> None:
    model = TableStageModel.random(3, 1, horizon=1, seed=0)
    model.values[("none", 1, 0)][:] = np.nan
    with pytest.raises(PlanError, match="predicts nan"):
        solve_bayesian(model, PlanSpace(3, 1, 1), budget=3)
