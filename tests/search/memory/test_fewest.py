"""The smallest mesh that fits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.exhaustive import solve_exhaustive
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


# The extended space, shape by shape (plan --fewest-devices with --space extended, --zero, --recompute-db,
# --allow-cross-node). The meshes are those whose every sub-mesh's stage configs are among the full mesh's
# (nodes of k' <= k devices, spans m*k' that the full mesh's spans or node configs include), so that one random
# table model answers for every shape.
@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 5), mesh=st.sampled_from([(3, 2), (2, 2), (4, 1), (1, 4), (2, 1)]),
       horizon=st.integers(1, 3), seed=st.integers(0, 10_000), levels=st.integers(2, 5),
       composite=st.booleans(), zero=st.booleans(), recompute=st.booleans(), cross_node=st.booleans(),
       pick=st.integers(0, 10_000))
def test_fewest_in_the_extended_space_equals_exhaustive_shape_by_shape(layers, mesh, horizon, seed, levels, composite,
                                                                        zero, recompute, cross_node, pick):
    """The reference, written from the rule alone: shapes ``n x k'`` by devices, then fewer nodes; each solved by
    enumerating every plan (solve_exhaustive); the first whose best peak is within the capacity wins. The
    capacity is one of the shapes' best peaks (so that every shape may be the answer), or below them all."""
    nodes, k = mesh
    flags = dict(composite=composite, zero=zero, recompute=recompute, cross_node=cross_node)
    model = TableStageModel.random(layers, k, horizon=horizon, seed=seed, levels=levels, num_nodes=nodes, **flags)
    shapes = sorted(((n, kk) for n in range(1, nodes + 1) for kk in range(1, k + 1)), key=lambda s: (s[0] * s[1], s[0]))
    reference = []
    for n, kk in shapes:
        try:
            reference.append(((n, kk), solve_exhaustive(model, PlanSpace(layers, n, kk, **flags))))
        except PlanError:
            reference.append(((n, kk), None))
    peaks = sorted({r.peak for _, r in reference if r is not None})
    if not peaks:
        with pytest.raises(PlanError, match="fits on no sub-mesh"):
            fewest_devices(model, Cluster.uniform(nodes, k), layers, capacity=1.0, **flags)
        return
    capacity = (peaks + [peaks[0] - 1])[pick % (len(peaks) + 1)]
    expected = next((((n, kk), r) for (n, kk), r in reference if r is not None and r.peak <= capacity), None)
    if expected is None:
        with pytest.raises(PlanError, match="fits on no sub-mesh"):
            fewest_devices(model, Cluster.uniform(nodes, k), layers, capacity=capacity, **flags)
        return
    found = fewest_devices(model, Cluster.uniform(nodes, k), layers, capacity=capacity, **flags)
    (n, kk), best = expected
    assert (found.result.num_nodes, found.result.devices_per_node) == (n, kk)
    assert found.cluster.shape == f"{n}x{kk}"
    assert found.result.peak == best.peak
    assert [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero, s.recompute, s.devices)
            for s in found.result.stages] == [(s.start, s.stop, s.kind, s.degree, s.tensor_degree, s.zero, s.recompute,
                                                s.devices) for s in best.stages]
    assert [(t.num_nodes, t.devices_per_node) for t in found.tried] == shapes[: len(found.tried)]


def test_crossing_nodes_lets_fewer_devices_fit():
    """Two layers (M_i = M_a = 100, activations 80), 1F1B with 2 micro-batches, nodes of one device. One device
    holds both layers at 100 + 100 = 200 (a last stage keeps one micro-batch, already in M); two nodes without
    crossing give a stage per node at 100 + 80 = 180 (a second micro-batch in flight) and 100; across them data x2
    over both layers holds (200 - 160) + 160/2 = 120 (AdditiveStageModel's data rule, the same case as
    test_cross_node_space.py). With a capacity of 150 the two devices fit only across nodes; with 100 nothing
    fits."""
    model = AdditiveStageModel((100.0,) * 2, (100.0,) * 2, (80.0,) * 2, position_horizon=2)
    cluster = Cluster.uniform(2, 1)
    with pytest.raises(PlanError, match="fits on no sub-mesh"):
        fewest_devices(model, cluster, 2, capacity=150.0)
    found = fewest_devices(model, cluster, 2, capacity=150.0, cross_node=True)
    assert found.cluster.shape == "2x1" and found.result.peak == 120.0
    assert [(s.kind, s.degree, s.devices) for s in found.result.stages] == [("data", 2, (0, 1))]
    with pytest.raises(PlanError, match="fits on no sub-mesh"):
        fewest_devices(model, cluster, 2, capacity=100.0, cross_node=True)


def test_a_shape_whose_best_plan_fails_the_whole_plan_check_is_passed_over() -> None:
    """A shape wins only if its best plan also passes the caller's whole-plan check (on CUDA: the allocator's
    reserve and what CUDA holds outside it); otherwise the next shape is tried, and the note says why."""
    model = AdditiveStageModel.transformer(16, horizon=4, seed=2)
    cluster = Cluster.uniform(2, 4)
    unchecked = fewest_devices(model, cluster, 16)  # unlimited: one device
    assert unchecked.cluster.num_devices == 1
    seen: list[str] = []

    def at_least_three(result: object, sub: Cluster) -> str | None:
        seen.append(sub.shape)
        return None if sub.num_devices >= 3 else f"{sub.num_devices} device(s) are not enough"

    found = fewest_devices(model, cluster, 16, check=at_least_three)
    assert found.cluster.shape == "1x3"  # mesh_shapes(2, 4): 1x1, 1x2, 2x1, then 1x3
    assert seen == ["1x1", "1x2", "2x1", "1x3"]
    assert [t.fits for t in found.tried] == [False, False, False, True]
    assert "but 1 device(s) are not enough" in found.tried[0].note


def test_no_shape_passing_the_whole_plan_check_says_so() -> None:
    model = AdditiveStageModel.transformer(8, horizon=4, seed=1)
    with pytest.raises(PlanError, match="needs more than the device has .*on 2x2: .*never"):
        fewest_devices(model, Cluster.uniform(2, 2), 8, check=lambda result, sub: "never")
