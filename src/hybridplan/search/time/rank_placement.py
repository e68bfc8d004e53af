"""Device placement: which device runs each virtual rank of a ``(pp, dp, tp)`` strategy.

Ranks are numbered ``rank = stage * dp * tp + replica * tp + tensor_rank`` (tensor fastest, then data, then
pipeline; Megatron's order, and the order of AMP's trials). A placement is a tuple ``devices[rank]``.

- :func:`megatron_placement` (AMP's default, seed 002 section 3.6, after Narayanan et al. 2021): rank ``i`` on
  device ``i``. Devices are numbered node-major, so a tensor group fills a node first (when ``tp`` divides the
  node size), then the data replicas, then the pipeline stages.
- :func:`anneal_placement` (AMP's "SA" option, section 6.3 / algorithm 2, here over device orderings only):
  simulated annealing from a start placement; a move swaps the devices of two ranks, a worse placement is
  accepted with probability ``exp(-(worse - current) / T)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError

__all__ = ["megatron_placement", "anneal_placement", "ANNEAL_START_FRACTION", "ANNEAL_COOLING"]

ANNEAL_START_FRACTION = 0.05
"""Starting temperature as a fraction of the starting cost: a move 5% worse is accepted with probability 1/e
at first. A design choice (AMP's algorithm 2 starts at T = 1.0 on its own cost scale and leaves
``cool_down`` unspecified); the result is only ever replaced by a better placement, so it is safe."""

ANNEAL_COOLING = 0.98
"""Geometric cooling factor per move (a common choice, Van Laarhoven & Aarts 1987, AMP's reference [25])."""


def megatron_placement(cluster: Cluster, pipeline_degree: int, data_degree: int, tensor_degree: int) -> tuple[int, ...]:
    """Rank ``i`` on device ``i``: tensor groups inside a node first, then data replicas."""
    n = pipeline_degree * data_degree * tensor_degree
    if n != cluster.num_devices:
        raise PlanError(
            f"{pipeline_degree} x {data_degree} x {tensor_degree} = {n} ranks but the cluster has {cluster.num_devices} devices",
            fix="choose degrees whose product is the device count",
        )
    return tuple(range(n))


def anneal_placement(
    cost: Callable[[tuple[int, ...]], float],
    start: Sequence[int],
    *,
    iterations: int,
    seed: int = 0,
    allowed: Callable[[tuple[int, ...]], bool] | None = None,
) -> tuple[tuple[int, ...], float]:
    """Simulated annealing over device orderings.

    Args:
        cost: seconds per iteration of a placement (``inf`` for an infeasible one).
        start: the starting placement (e.g. Megatron's).
        iterations: moves to try.
        seed: RNG seed (the search is deterministic for a given seed).
        allowed: optional filter; placements it rejects are never visited.

    Returns:
        The best placement seen and its cost (never worse than ``start``).
    """
    rng = random.Random(seed)
    current = tuple(start)
    current_cost = cost(current)
    best, best_cost = current, current_cost
    if len(current) < 2 or iterations <= 0:
        return best, best_cost
    temperature = ANNEAL_START_FRACTION * current_cost if math.isfinite(current_cost) else 1.0
    for _ in range(iterations):
        i, j = rng.sample(range(len(current)), 2)
        proposal = list(current)
        proposal[i], proposal[j] = proposal[j], proposal[i]
        candidate = tuple(proposal)
        temperature *= ANNEAL_COOLING
        if allowed is not None and not allowed(candidate):
            continue
        candidate_cost = cost(candidate)
        delta = candidate_cost - current_cost
        if delta <= 0 or (temperature > 0 and rng.random() < math.exp(-delta / temperature)):
            current, current_cost = candidate, candidate_cost
            if current_cost < best_cost:
                best, best_cost = current, current_cost
    return best, best_cost
