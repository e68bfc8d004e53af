"""Device placement of a ``(pp, dp, tp)`` strategy's ranks: Megatron's in-order placement and AMP's annealing."""

from __future__ import annotations

import pytest

from hybridplan.errors import PlanError
from hybridplan.plan.cluster import Cluster, DeviceSpec
from hybridplan.search.time.rank_placement import anneal_placement, megatron_placement
from hybridplan.search.time.throughput import search_throughput
from tests.search.time.util import toy_profile as _toy


def test_megatron_places_rank_i_on_device_i() -> None:
    cluster = Cluster.parse("2x4")
    assert megatron_placement(cluster, 2, 2, 2) == tuple(range(8))
    with pytest.raises(PlanError, match="2 x 2 x 1 = 4 ranks but the cluster has 8 devices"):
        megatron_placement(cluster, 2, 2, 1)


def test_annealing_finds_the_cheap_ordering_and_never_returns_worse() -> None:
    """Cost: how many neighbouring ranks sit on devices whose numbers differ by more than one. The identity
    ordering costs 0; starting from a scrambled one, annealing must get lower and never above the start."""
    def cost(order: tuple[int, ...]) -> float:
        return float(sum(abs(a - b) > 1 for a, b in zip(order, order[1:])))

    start = (0, 4, 1, 5, 2, 6, 3, 7)
    best, best_cost = anneal_placement(cost, start, iterations=400, seed=0)
    assert best_cost == cost(best) and best_cost < cost(start)
    assert sorted(best) == list(range(8))
    assert anneal_placement(cost, start, iterations=400, seed=0) == (best, best_cost)  # deterministic for a seed
    assert anneal_placement(cost, start, iterations=0) == (start, cost(start))


def test_annealing_never_visits_a_placement_the_filter_refuses() -> None:
    seen: list[tuple[int, ...]] = []

    def cost(order: tuple[int, ...]) -> float:
        seen.append(order)
        return float(order[0])

    anneal_placement(cost, (3, 2, 1, 0), iterations=100, seed=1, allowed=lambda order: order[-1] == 0)
    assert seen and all(order[-1] == 0 for order in seen)


def test_annealed_placement_beats_megatron_on_an_uneven_network() -> None:
    """Only devices 0-2 and 1-3 are linked fast: Megatron's in-order placement puts every pair of neighbouring
    ranks on a slow link; annealing over device orderings moves some onto the fast ones."""
    fast, slow = 1e10, 1e7
    matrix = tuple(tuple(fast if {a, b} in ({0, 2}, {1, 3}) else slow for b in range(4)) for a in range(4))
    cluster = Cluster(num_nodes=1, devices_per_node=4, devices=(DeviceSpec(type="A"),) * 4, bandwidth_matrix=matrix)
    profile = _toy(params=5e7)
    megatron = search_throughput(profile, cluster, 8)
    annealed = search_throughput(profile, cluster, 8, placement="anneal", anneal_iterations=60, seed=3)
    assert annealed.best.iteration_s < megatron.best.iteration_s
    assert sorted(d for s in annealed.best.plan.stages for d in s.devices) == [0, 1, 2, 3]
    again = search_throughput(profile, cluster, 8, placement="anneal", anneal_iterations=60, seed=3)
    assert again.best.plan == annealed.best.plan  # deterministic for a seed

