"""The smallest mesh on which a model fits: fewest devices first, then fewest nodes.

Training on fewer devices frees the rest of the cluster; CAPTURE's predictions make the question cheap
to answer without a single run. For ``D = 1, 2, ...`` devices the shapes ``n' x k'`` with ``n' <= N``,
``k' <= k`` and ``n' * k' = D`` are tried with fewer nodes first (by default a stage never spans nodes, so
fewer, fuller nodes give the plan space more room; across nodes too, fewer nodes keep more of the traffic
on the fast intra-node links); the first whose best plan's peak fits the device capacity wins. Each shape is
solved exactly (:func:`~hybridplan.search.memory.exact.solve_exact`) over the same space as the memory
search: CAPTURE's, or extended by data x tensor stages, ZeRO, per-stage recompute and stages over whole
nodes (:class:`~hybridplan.search.memory.space.PlanSpace`), each sub-mesh with its own stage configs (a
stage over whole nodes of ``k'`` devices has ``m * k'`` of them).

The search minimises the tensor peak, but on CUDA a device also holds what the caching allocator reserves
beyond the tensors and what CUDA and the communicators hold outside it, which depend on the plan. A shape
whose best plan's tensor peak fits can still need more than the device has (GPT-3 6.7B on 40 GiB devices in
benchmarks/extension_gain: 41.48 GiB on the shape found before this check, which then answered no shape at
all). So a caller that predicts whole plans passes ``check``: a shape wins only if its best plan passes it too,
and otherwise the next shape is tried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError
from hybridplan.search.memory.exact import solve_exact
from hybridplan.search.memory.objective import SearchResult, StageMemoryModel
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.memory.space import PlanSpace
from hybridplan.units import format_bytes

__all__ = ["MeshAttempt", "FewestResult", "PlanCheck", "fewest_devices"]

PlanCheck = Callable[[SearchResult, Cluster], "str | None"]
"""A whole-plan check of a shape's best plan on that sub-mesh: None if it fits, else why it does not."""


@dataclass(frozen=True)
class MeshAttempt:
    """One mesh shape tried."""

    num_nodes: int
    devices_per_node: int
    peak: float | None
    """The best plan's predicted peak, or ``None`` when the shape has no valid plan."""
    fits: bool
    note: str
    """Why it fits or not, for the report."""


@dataclass(frozen=True)
class FewestResult:
    """The smallest fitting mesh, its best plan, and every shape tried before it (it included)."""

    cluster: Cluster
    result: SearchResult
    tried: tuple[MeshAttempt, ...]


def mesh_shapes(num_nodes: int, devices_per_node: int) -> list[tuple[int, int]]:
    """Every ``(n', k')`` sub-mesh shape, by total devices, then fewer nodes.

    >>> mesh_shapes(2, 2)
    [(1, 1), (1, 2), (2, 1), (2, 2)]
    """
    return sorted(((n, k) for n in range(1, num_nodes + 1) for k in range(1, devices_per_node + 1)),
                  key=lambda nk: (nk[0] * nk[1], nk[0]))


def fewest_devices(model: StageMemoryModel, cluster: Cluster, num_layers: int, *, capacity: float | None = None,
                   pipeline_only: bool = False, max_stages: int | None = None, composite: bool = False,
                   zero: bool = False, recompute: bool = False, cross_node: bool = False,
                   progress: ProgressCallback | None = None, check: PlanCheck | None = None) -> FewestResult:
    """The smallest sub-mesh of ``cluster`` whose best plan's predicted peak fits in device memory.

    Args:
        model: the stage-memory model (the same predictions on every mesh shape).
        cluster: the full cluster; sub-meshes come from :meth:`Cluster.with_shape`.
        num_layers: the model's layer count.
        capacity: bytes per device; default the cluster's device memory (unlimited fits anything).
        pipeline_only: search mCAP's pipeline-only plans.
        max_stages: bound on the pipeline depth.
        composite: search the extended space (data x tensor stages too).
        zero, recompute, cross_node: the other dimensions of the extended space (ZeRO-1/3 data stages,
            per-stage recompute, stages over whole nodes), as :class:`PlanSpace` takes them.
        progress: receives a line now and then on a long search, e.g. ``"fewest devices: trying 4x8 (3 of 7),
            12.0 s"``, or the exact search's line within it (:mod:`~hybridplan.search.progress`); ``None``: silent.
        check: a whole-plan check (module note) a fitting shape's best plan must also pass; ``None``: none.

    Raises:
        PlanError: if the model fits on no sub-mesh, naming the best peak found and the capacity.
        ClusterError: for a heterogeneous cluster (sub-meshes of it are not defined).
    """
    cluster.with_shape(1, 1)  # raises ClusterError now, not after the search, for a cluster that cannot shrink
    if capacity is None:
        capacity = cluster.memory_of(0)
    limit = float("inf") if capacity is None else float(capacity)
    report = Progress.of(progress)
    tried: list[MeshAttempt] = []
    best: SearchResult | None = None
    shapes = mesh_shapes(cluster.num_nodes, cluster.devices_per_node)
    for i, (n, k) in enumerate(shapes, 1):
        trying = f"trying {n}x{k} ({i:,} of {len(shapes):,})"
        report.update(f"fewest devices: {trying}")
        try:
            space = PlanSpace(num_layers, n, k, pipeline_only, max_stages, composite, zero, recompute, cross_node)
            result = solve_exact(model, space, progress=report.within(f"fewest devices, {trying}"))
        except PlanError as e:
            tried.append(MeshAttempt(n, k, None, False, e.message))
            continue
        fits = result.peak <= limit
        note = (f"peak {_fmt(result.peak)} {'<=' if fits else '>'} capacity {_fmt(limit)}")
        if fits and check is not None and (why := check(result, cluster.with_shape(n, k))) is not None:
            fits, note = False, f"{note}, but {why}"
        tried.append(MeshAttempt(n, k, result.peak, fits, note))
        if fits:
            return FewestResult(cluster.with_shape(n, k), result, tuple(tried))
        if best is None or result.peak < best.peak:
            best = result
    why = ("no shape has a valid plan" if best is None else
           f"the lowest peak, {_fmt(best.peak)} on {best.num_nodes}x{best.devices_per_node}, exceeds the capacity {_fmt(limit)}"
           if best.peak > limit else
           f"the best plan of every shape whose tensor peak fits needs more than the device has (on {tried[-1].num_nodes}x"
           f"{tried[-1].devices_per_node}: {tried[-1].note})")
    raise PlanError(f"the model fits on no sub-mesh of {cluster.shape}: {why}",
                    fix="use a larger cluster, a smaller micro-batch, or more memory-saving options")


def _fmt(value: float) -> str:
    return "unlimited" if value == float("inf") else format_bytes(value)
