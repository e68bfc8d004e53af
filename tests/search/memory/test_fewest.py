"""The smallest mesh that fits."""

from __future__ import annotations

import numpy as np
import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.fewest import fewest_devices, mesh_shapes
from hybridplan.search.memory.space import PlanSpace
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel


def test_shapes_go_by_devices_then_fewer_nodes() -> None:
    assert mesh_shapes(2, 4) == [(1, 1), (1, 2), (2, 1), (1, 3), (1, 4), (2, 2), (2, 3), (2, 4)]


def test_returns_the_first_shape_whose_best_peak_fits() -> None:
    model = AdditiveStageModel.transformer(16, horizon=4, seed=2)
    cluster = Cluster.uniform(2, 4)
    full = solve_exact(model, PlanSpace(16, 2, 4)).peak
    capacity = full * 1.3
    found = fewest_devices(model, cluster, 16, capacity=capacity)
    assert found.result.peak <= capacity
    assert found.cluster.shape == f"{found.result.num_nodes}x{found.result.devices_per_node}"
    assert found.tried[-1].fits and not any(t.fits for t in found.tried[:-1])
    shapes = mesh_shapes(2, 4)
    tried = [(t.num_nodes, t.devices_per_node) for t in found.tried]
    assert tried == shapes[: len(tried)]
    for t in found.tried[:-1]:  # every smaller shape was too small (or had no plan)
        assert t.peak is None or t.peak > capacity
    assert found.cluster.num_devices < cluster.num_devices


def test_unlimited_memory_fits_on_one_device() -> None:
    model = AdditiveStageModel.transformer(4, seed=0)
    found = fewest_devices(model, Cluster.uniform(2, 2), 4)
    assert found.cluster.shape == "1x1" and len(found.tried) == 1


def test_cluster_memory_is_the_default_capacity() -> None:
    model = AdditiveStageModel.transformer(8, seed=0)
    cluster = Cluster.uniform(1, 4, memory_bytes=10**9)
    assert fewest_devices(model, cluster, 8).cluster.shape == "1x1"


def test_too_small_everywhere_names_the_best_peak_and_capacity() -> None:
    model = AdditiveStageModel.transformer(6, seed=0)
    with pytest.raises(PlanError, match=r"fits on no sub-mesh of 1x2: the lowest peak, .* on 1x2, exceeds the capacity"):
        fewest_devices(model, Cluster.uniform(1, 2), 6, capacity=1.0)


def test_shapes_without_plans_are_recorded_and_skipped() -> None:
    # Pipeline-only, 3 layers: the 1-device shapes cannot hold the model, 4 devices are more than layers.
    model = AdditiveStageModel.transformer(3, seed=0)
    single = solve_exact(model, PlanSpace(3, 1, 1)).peak
    found = fewest_devices(model, Cluster.uniform(2, 2), 3, capacity=single * 0.9, pipeline_only=True)
    assert found.cluster.num_devices in (2, 3)
    with pytest.raises(PlanError, match="fits on no sub-mesh") as info:
        fewest_devices(model, Cluster.uniform(2, 2), 3, capacity=1.0, pipeline_only=True)
    assert "lowest peak" in info.value.message


def test_no_allowed_plan_anywhere() -> None:
    model = TableStageModel.random(3, 2, horizon=1, seed=0)
    for cfg in model.values:
        model.disallowed[cfg] = np.ones((3, 4), dtype=bool)
    with pytest.raises(PlanError, match="no shape has a valid plan"):
        fewest_devices(model, Cluster.uniform(1, 2), 3, capacity=1.0)
