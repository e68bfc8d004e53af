"""What a profiling campaign measures: its global batch sizes and its scenarios, checked before any run.

profiling/campaign.py runs what these functions choose; workflows/simulated_profile.py picks its own sizes with
the same rule of what splits (:func:`splits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridplan.errors import ProfileError
from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.partitions import Scenario

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel

__all__ = ["splits", "profiled_batch_sizes", "replica_batch_sizes", "sizes_of", "default_scenarios",
           "check_scenarios", "no_zero_note"]


def splits(batch: int, microbatches: int, granularity: int = 1) -> bool:
    """Whether a global ``batch`` splits into ``microbatches`` micro-batches of a multiple of ``granularity`` samples.

    >>> splits(16, 8), splits(12, 8), splits(16, 8, 4)
    (True, False, False)
    """
    return batch >= microbatches and batch % microbatches == 0 and (batch // microbatches) % granularity == 0


def profiled_batch_sizes(given: Sequence[int] | None, target: int, microbatches: int, granularity: int) -> list[int]:
    """The campaign's two global batch sizes: ``given``, or half and a quarter of the ``target`` (seed 000 III-A2),
    each split into the target's micro-batch count.

    Raises:
        ProfileError: for sizes that are not two different ones, or one that does not split.
    """
    sizes = list(given) if given else [target // 2, target // 4]
    if len(set(sizes)) != 2:
        raise ProfileError(f"profiling needs two different batch sizes, got {sizes}", fix="give two with --profile-batch-sizes")
    for b in sizes:
        if not splits(b, microbatches, granularity):
            raise ProfileError(
                f"profiled batch size {b} does not split into {microbatches} micro-batches of a multiple of"
                f" {granularity} sample(s)", fix=f"choose a global batch whose halves and quarters are multiples of"
                f" {microbatches * granularity}, or set --profile-batch-sizes",
            )
    return sorted(sizes)


def replica_batch_sizes(given: Sequence[int], profiled: Sequence[int], microbatches: int,
                        granularity: int) -> list[int]:
    """``given`` (``CampaignConfig.replica_batch_sizes``), checked as the profiled sizes are.

    [Note: a replica's rows are measured] A data x tensor stage over d replicas is its tensor stage at b/d rows
    (predict/memory.py ``_replica``), and a data x d replica runs the pipeline stage's rows b/d ([Note: a data
    replica's rows were profiled] in predict/batch_scaling.py). Where b/d lies below the profiled micro-batches,
    a straight line through them extrapolates a maximum of regimes: Llama-3-70B's layer 38 as tensor x2
    recomputed holds 3,139,485,696 bytes in its first backward at 4 rows (the end regime, [Note: the first
    backward]), where the line through 8 and 16 rows gives 3,005,284,352; its data 4 x tensor 2 ZeRO-2/3 stages,
    composed from it, were 0.9% to 1.6% low (benchmarks/instant_planning). Profiling the pipeline and tensor
    scenarios at those rows too measures them (:func:`sizes_of`); the data scenarios, whose replicas already run
    b/d rows of each profiled size, are not.

    Raises:
        ProfileError: for a size that does not split, or one profiled already.
    """
    for b in given:
        if not splits(b, microbatches, granularity) or b in profiled:
            raise ProfileError(f"replica batch size {b} does not split into {microbatches} micro-batches of a multiple"
                               f" of {granularity} sample(s), or is profiled already", fix="drop it, or choose another")
    return sorted(given)


def sizes_of(scenario: Scenario, profiled: Sequence[int], replicas: Sequence[int]) -> list[int]:
    """The global batch sizes ``scenario`` is profiled at ([Note: a replica's rows are measured]).

    >>> sizes_of(Scenario("tensor", 2), [8, 16], [4]), sizes_of(Scenario("data", 2), [8, 16], [4])
    ([4, 8, 16], [8, 16])
    """
    extra = replicas if scenario.kind in ("none", "tensor") and not scenario.zero else []
    return sorted({*profiled, *extra})


def default_scenarios(model: LayeredModel, cluster: Cluster, microbatch_sizes: list[int], *,
                      zero: bool = False) -> list[Scenario]:
    """Pipeline, and data/tensor at 2 and 4 where a node has the devices, the micro-batches split, and
    (for tensor) at least one layer can be split; with ``zero``, data-parallel ZeRO-3 at each data degree too
    (at most twice the runs: a ZeRO-3 scenario packs the same spans as its data scenario; predict/zero_layout.py)."""
    out = [Scenario("none", 1)]
    for degree in (2, 4):
        if degree > cluster.devices_per_node:
            continue
        g = model.sample_granularity
        if all(b % degree == 0 and (b // degree) % g == 0 for b in microbatch_sizes):
            out.append(Scenario("data", degree))
            if zero:
                out.append(Scenario("data", degree, 3))
        if any(model.tensor_parallel_problem(l, degree) is None for l in range(model.num_layers)):
            out.append(Scenario("tensor", degree))
    return out


def check_scenarios(scenarios: Sequence[Scenario], cluster: Cluster, micro: list[int], granularity: int) -> None:
    """Refuse a scenario the cluster's nodes or the profiled micro-batches cannot run (ProfileError)."""
    k = cluster.devices_per_node
    for s in scenarios:
        if s.degree > k:
            raise ProfileError(f"scenario {s.name} needs {s.degree} devices per node, the cluster has {k}")
        if s.kind == "data" and any(b % s.degree or (b // s.degree) % granularity for b in micro):
            raise ProfileError(
                f"scenario {s.name}: profiled micro-batch sizes {micro} do not split {s.degree} ways",
                fix="use a larger global batch or other --profile-batch-sizes",
            )


def no_zero_note(cluster: Cluster, profiled: Sequence[int], microbatches: int, granularity: int) -> str:
    """Why ``zero`` added no ZeRO-3 scenario (:func:`default_scenarios`), and the batch sizes that would add one."""
    k, m, g = cluster.devices_per_node, microbatches, granularity
    micro = [b // m for b in profiled]
    head = "note: --zero adds no ZeRO-3 scenario: "
    if k < 2:
        return head + (f"ZeRO shards over data-parallel replicas within a node, and cluster {cluster.shape}"
                       " has one device per node; profile on nodes of 2 or more devices")
    unit = 2 * m * g  # a profiled batch of this many samples gives micro-batches that split 2 ways
    return head + (f"the profiled batch sizes {list(profiled)} over {m} micro-batches give micro-batches of {micro}"
                   f" sample(s), which do not all split 2 ways{f' into multiples of {g}' if g > 1 else ''}, so no"
                   f" data-parallel scenario applies; profiled batch sizes that are multiples of {unit} would"
                   f" (--profile-batch-sizes {unit},{2 * unit}, or a --global-batch-size that is a multiple of"
                   f" {4 * unit}: its halves and quarters are profiled)")
