"""mCAP-BO (seed 004, 3.4): Bayesian optimisation of the predicted peak over an encoding of plans.

mCAP gives each GPU a dimension, its layer count; it ran scikit-optimize for 75 iterations with a
Matern kernel. Here, with numpy alone (scipy is not a runtime dependency), a small Gaussian process
(Matern 5/2, isotropic, length scale by marginal likelihood on a grid) and expected improvement,
maximised over random and local candidate points (skopt's "sampling" optimiser), drive the search
in ``[0, 1]^dim``:

- *pipeline-only*: ``G`` coordinates, one per device (as mCAP): layer *shares*, turned into layer
  counts ``>= 1`` summing to ``L`` by largest remainders;
- *hybrid*: ``S_max`` coordinates pick the stage configs one after another among those that keep the
  degrees packable and the pipeline finishable (the repair that makes every point a valid plan), then
  ``S_max`` more give the layer shares of the stages chosen. A stage whose kind the model does not
  allow on its layers switches to the other kind of the same degree when that is allowed.

The search is deterministic for a given seed. It returns the best plan it evaluated
([Note: leximax order]); it is not guaranteed to be the optimum (use :func:`solve_exact` for that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.search.memory.objective import (
    SearchResult,
    StageMemoryModel,
    bad_prediction,
    build_result,
    model_horizon,
    plan_score,
)
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.memory.configs import StageChoice
from hybridplan.search.memory.space import PlanSpace

__all__ = ["solve_bayesian", "PlanEncoding", "GaussianProcess"]

DEFAULT_BUDGET = 75
"""Evaluations, as mCAP's 75 iterations (seed 004, 4.1)."""

UNSEEN_TRIES = 100
"""Points decoded per step, among the ranked ones and then random ones, in search of a plan not yet scored."""


class PlanEncoding:
    """Maps any point of ``[0, 1]^dim`` to a valid plan of the space (see the module docstring)."""

    def __init__(self, space: PlanSpace, allowed: Callable[[int, int, int], bool]) -> None:
        self.space, self.allowed = space, allowed
        self.max_stages = space.max_num_stages
        self.config_dims = 0 if space.pipeline_only else self.max_stages
        self.dim = space.num_devices if space.pipeline_only else 2 * self.max_stages
        pk = space.packing
        self._cols = [pk.column(c.degree) for c in space.configs]
        self._twin = {i: next((j for j, d in enumerate(space.configs) if j != i and d.degree == c.degree), None)
                      for i, c in enumerate(space.configs)}

    def decode(self, x: np.ndarray) -> tuple[StageChoice, ...]:
        """The plan of point ``x``."""
        configs = self._configs(x[: self.config_dims])
        counts = _apportion(self.space.num_layers, x[self.config_dims: self.config_dims + len(configs)])
        out, start = [], 0
        for ci, n in zip(configs, counts):
            twin = self._twin[ci]
            if not self.allowed(start, start + n, ci) and twin is not None and self.allowed(start, start + n, twin):
                ci = twin
            out.append(StageChoice(start, start + n, ci))
            start += n
        return tuple(out)

    def _configs(self, x: np.ndarray) -> list[int]:
        if self.space.pipeline_only:
            return [0] * self.space.num_devices
        pk, state = self.space.packing, self.space.packing.start
        out: list[int] = []
        while not pk.accepting[state]:
            options = []
            for ci, col in enumerate(self._cols):
                nxt = int(pk.next[state, col])
                if nxt >= 0 and len(out) + 1 + int(pk.to_finish[nxt]) <= self.max_stages:
                    options.append((ci, nxt))
            ci, state = options[min(int(x[len(out)] * len(options)), len(options) - 1)]
            out.append(ci)
        return out


def _apportion(total: int, weights: np.ndarray) -> list[int]:
    """``len(weights)`` counts ``>= 1`` summing to ``total``, the rest split by largest remainders."""
    n = len(weights)
    w = np.asarray(weights, dtype=np.float64) + 1e-9
    quota = w / w.sum() * (total - n)
    counts = np.floor(quota).astype(int)
    order = sorted(range(n), key=lambda i: (-(quota[i] - counts[i]), i))
    for i in order[: total - n - int(counts.sum())]:
        counts[i] += 1
    return [int(c) + 1 for c in counts]


class GaussianProcess:
    """A zero-mean GP on standardised targets with an isotropic Matern 5/2 kernel.

    The length scale is chosen from a log grid by the marginal likelihood, each time the GP is fitted.
    """

    def __init__(self, noise: float = 1e-4) -> None:
        self.noise = noise

    @staticmethod
    def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Euclidean distances between the rows of ``a`` and ``b``."""
        squared = (a * a).sum(axis=1)[:, None] + (b * b).sum(axis=1)[None, :] - 2.0 * a @ b.T
        return np.sqrt(np.maximum(squared, 0.0))

    @staticmethod
    def kernel(distance: np.ndarray, length: float) -> np.ndarray:
        """Matern 5/2: ``(1 + sqrt5 r + 5/3 r^2) exp(-sqrt5 r)``, ``r = distance / length``."""
        s = math.sqrt(5.0) * distance / length
        return (1.0 + s + s * s / 3.0) * np.exp(-s)

    def fit(self, x: np.ndarray, y: np.ndarray) -> GaussianProcess:
        """Standardise ``y`` and pick the length scale of highest marginal likelihood."""
        self.x = x
        self.mean, self.std = float(y.mean()), float(y.std()) or 1.0
        z = (y - self.mean) / self.std
        dist = self.distance(x, x)
        fits = []
        for length in np.geomspace(0.05, 2.0, 12) * math.sqrt(x.shape[1]):
            factor = np.linalg.cholesky(self.kernel(dist, length) + self.noise * np.eye(len(x)))
            alpha = np.linalg.solve(factor.T, np.linalg.solve(factor, z))
            lml = -0.5 * float(z @ alpha) - float(np.log(np.diag(factor)).sum())
            fits.append((lml, float(length), factor, alpha))
        _, self.length, self.factor, self.alpha = max(fits, key=lambda f: f[0])  # the first of equals, as before
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation, on the standardised scale."""
        ks = self.kernel(self.distance(x, self.x), self.length)
        mu = ks @ self.alpha
        v = np.linalg.solve(self.factor, ks.T)
        return mu, np.sqrt(np.maximum(1.0 - (v * v).sum(axis=0), 1e-12))


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float, xi: float) -> np.ndarray:
    """EI for minimisation: ``E[max(best - xi - f, 0)]`` under ``f ~ N(mu, sigma^2)``."""
    gain = best - xi - mu
    z = gain / sigma
    cdf = 0.5 * _erfc(-z / math.sqrt(2.0))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return gain * cdf + sigma * pdf


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def solve_bayesian(model: StageMemoryModel, space: PlanSpace, *, budget: int = DEFAULT_BUDGET, seed: int = 0,
                   initial_points: int = 10, samples: int = 2000, xi: float = 0.01,
                   progress: ProgressCallback | None = None) -> SearchResult:
    """The best plan found by Bayesian optimisation within ``budget`` evaluations.

    Args:
        model: the stage-memory model (asked lazily, once per distinct stage).
        space: the plans to search.
        budget: plan evaluations (mCAP: 75).
        seed: makes the search reproducible.
        initial_points: random points before the GP drives the search (skopt's default, 10).
        samples: candidate points per step on which expected improvement is maximised.
        xi: exploration margin of expected improvement, in standard deviations of the peaks seen.
        progress: receives a line now and then on a long search, e.g. ``"bayesian search: evaluation 12/75,
            best peak 467.5, 3.0 s"`` (:mod:`~hybridplan.search.progress`); ``None``: silent.

    Raises:
        PlanError: for a budget below 1, or if no evaluated plan is allowed by the model.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise PlanError(f"the Bayesian search budget must be a positive integer, got {budget!r}", fix="e.g. budget=75")
    started = time.perf_counter()
    report = Progress.of(progress)
    space.mesh_packing(report.within("bayesian search"))
    configs, horizon = space.configs, model_horizon(model)
    memo: dict[tuple[int, int, int, int], float] = {}

    def value_of(c: StageChoice, stages_after: int) -> float:
        key = (c.start, c.stop, c.config, min(stages_after, horizon - 1))
        if key not in memo:
            cfg = configs[c.config]
            value = math.inf
            if model.allowed(c.start, c.stop, cfg.kind, cfg.degree, **cfg.model_kwargs):
                value = float(model.stage_memory(c.start, c.stop, cfg.kind, cfg.degree, key[3], **cfg.model_kwargs))
                if not math.isfinite(value):
                    raise bad_prediction(value, c, space, key[3])
            memo[key] = value
        return memo[key]

    encoding = PlanEncoding(space, lambda a, b, ci: model.allowed(a, b, configs[ci].kind, configs[ci].degree,
                                                                  **configs[ci].model_kwargs))
    rng = np.random.default_rng(seed)
    xs: list[np.ndarray] = []
    peaks: list[float] = []
    seen: dict[tuple[StageChoice, ...], tuple] = {}
    for step in range(budget):
        if report.due():
            report.update(f"bayesian search: evaluation {step + 1}/{budget}, {len(seen)} distinct plans,"
                          f" best peak {min(peaks, default=math.inf):.6g}")
        if step < initial_points or not any(math.isfinite(p) for p in peaks):
            order = rng.random((samples, encoding.dim))
        else:
            order = _ranked_candidates(np.array(xs), np.array(peaks), rng, samples, xi)
        # The best-ranked point whose plan is new; failing that a new plan from random points (many
        # points share a plan, and re-scoring one teaches nothing); failing that the best-ranked point.
        x, plan = order[0], encoding.decode(order[0])
        for cand in np.vstack([order[:UNSEEN_TRIES], rng.random((UNSEEN_TRIES, encoding.dim))]):
            p = encoding.decode(cand)
            if p not in seen:
                x, plan = cand, p
                break
        if plan not in seen:
            seen[plan] = plan_score(value_of, space, plan)
        xs.append(x)
        peaks.append(seen[plan][0][0])
    finite = [(score, plan) for plan, score in seen.items() if math.isfinite(score[0][0])]
    if not finite:
        raise PlanError(f"none of the {len(seen)} plans the Bayesian search evaluated is allowed by the memory model",
                        fix="raise the budget, or use the exact solver")
    _, plan = min(finite)
    return build_result("bayesian", space, value_of, plan, visited=budget, started=started, now=time.perf_counter(),
                        stats={"distinct_plans": len(seen), "seed": seed})


def _ranked_candidates(x: np.ndarray, peaks: np.ndarray, rng: np.random.Generator, samples: int,
                       xi: float) -> np.ndarray:
    """Random and local candidate points, best expected improvement first."""
    y = peaks.copy()
    finite = np.isfinite(y)
    worst, best = y[finite].max(), y[finite].min()
    y[~finite] = worst + max(worst - best, 1.0)  # disallowed plans: clearly worse than any allowed one
    gp = GaussianProcess().fit(x, y)
    elite = x[np.argsort(y, kind="stable")[:5]]
    local = elite[rng.integers(0, len(elite), samples // 2)] + rng.normal(0.0, 0.1, (samples // 2, x.shape[1]))
    cand = np.vstack([rng.random((samples - samples // 2, x.shape[1])), np.clip(local, 0.0, 1.0)])
    mu, sigma = gp.predict(cand)
    ei = expected_improvement(mu, sigma, (best - gp.mean) / gp.std, xi)
    return cand[np.argsort(-ei, kind="stable")]
