"""The memory-minimising plan from a profile database: CAPTURE's question, answered end to end.

Load the predictor at the requested targets, search the mesh (exactly, exhaustively or by Bayesian
optimisation; or the fewest devices that fit), map a plan found on merged layers back to the model's layers,
annotate it, and refuse it if a device's predicted peak exceeds its capacity: a plan that does not fit is
never presented as the answer. The command line (``hybridplan plan``), the demo and the benchmarks all call
:func:`plan_memory`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.prediction import PlanPrediction
from hybridplan.profiling.store import ProfileStore
from hybridplan.search import (
    MeshAttempt,
    PlanSpace,
    SearchResult,
    StageMemoryModel,
    fewest_devices,
    solve_bayesian,
    solve_exact,
    solve_exhaustive,
)
from hybridplan.search.progress import ProgressCallback
from hybridplan.units import format_bytes
from hybridplan.workflows.table_cache import table_memo

__all__ = ["MemoryMode", "MODES", "MemoryPlan", "NoPlanFits", "plan_memory", "held_fixed"]

MemoryMode = Literal["exact", "exhaustive", "bayesian"]
MODES: tuple[MemoryMode, ...] = ("exact", "exhaustive", "bayesian")
"""Solvers of the memory objective: exact (dynamic programming, the same optimum as exhaustive), exhaustive
(CAPTURE / mCAP-BF, the reference), bayesian (mCAP-BO)."""


@dataclass(frozen=True)
class MemoryPlan:
    """The answer: the plan (annotated with model, cluster and predicted peak), its per-device prediction, the
    search that found it, and the mesh it is for (smaller than asked with ``fewest_devices``)."""

    plan: Plan
    prediction: PlanPrediction
    search: SearchResult
    cluster: Cluster
    model: str | None
    """The profiled model's name, as the database records it (a label: nothing is imported)."""
    tried: tuple[MeshAttempt, ...] = ()
    """With ``fewest_devices``: every mesh shape tried, the answer's last."""


def held_fixed(predictor: MemoryPredictor) -> str:
    """What the memory search does not vary, and how to vary it (users took its answer for the lowest possible)."""
    return (f"held fixed: schedule {predictor.schedule}, global batch {predictor.global_batch_size} in"
            f" {predictor.num_microbatches} micro-batches of {predictor.microbatch_size} (other values: --schedule,"
            " --num-microbatches; --objective pareto also varies the micro-batch count)")


def plan_memory(
    db: str | Path,
    cluster: Cluster,
    *,
    schedule: str | None = None,
    global_batch_size: int | None = None,
    num_microbatches: int | None = None,
    degree_fit: str = "log",
    mode: MemoryMode = "exact",
    pipeline_only: bool = False,
    composite: bool = False,
    zero: bool = False,
    recompute_db: str | Path | None = None,
    cross_node: bool = False,
    fewest: bool = False,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    say: Callable[[str], None] | None = None,
    table_cache: Path | None = None,
    unsplit_last_stage: bool = False,
) -> MemoryPlan:
    """The plan of the lowest predicted per-device peak memory on ``cluster`` (module docstring).

    Args:
        db: the profile database.
        cluster: the mesh; its device capacities, if any, must hold the answer.
        schedule, global_batch_size, num_microbatches: the targets (default: the profile's).
        degree_fit: how tensor degrees above the profiled ones are predicted (a wider data stage is composed).
        mode: the solver.
        pipeline_only: mCAP's space (degree-1 stages only).
        composite: the extended space: stages of data x tensor devices too (predicted from the tensor
            scenario's statistics: predict/memory.py).
        zero: data stages sharded by ZeRO-1, ZeRO-2 and ZeRO-3 too (predict/zero_layout.py; ZeRO-2 and ZeRO-3 where the
            profile has the ZeRO-3 scenario).
        recompute_db: a profile of the same model taken with recompute (``profile --activation-checkpointing``):
            every stage may then recompute its activations or not, each predicted from its own profile
            ([Note: recompute chosen per stage] in predict/memory.py).
        cross_node: data (and data x tensor) stages over 2, 4, ... whole nodes too ([Note: stages across nodes] in
            search/memory/packing.py); without it a stage never spans nodes (CAPTURE's space).
        fewest: the smallest sub-mesh of ``cluster`` on which the model fits (needs a capacity).
        seed: the Bayesian search's seed.
        progress: long searches report here (rate-limited, search/progress.py).
        say: one-line notes: the targets held fixed, a far extrapolation of the batch, the meshes tried.
        table_cache: a folder keeping the search's stage matrices for these profiles (workflows/table_cache.py).
        unsplit_last_stage: only plans whose last stage has no tensor part (an engine's, runtime/engines.py).

    Raises:
        ProfileError: for a database that holds no campaign.
        PlanError: if no plan exists, or the best one does not fit a device (naming the device and by how much).
        UsageError: for ``fewest`` without a capacity.
    """
    note = say or (lambda _msg: None)
    predictor = MemoryPredictor.from_db(db, schedule=schedule, global_batch_size=global_batch_size,
                                        num_microbatches=num_microbatches, degree_fit=degree_fit,
                                        recompute_db=recompute_db)
    dbs = [Path(db)] + ([Path(recompute_db)] if recompute_db is not None else [])
    with table_memo(predictor, table_cache, dbs=dbs, options={"degree_fit": degree_fit, "schedule": predictor.schedule,
                    "batch": predictor.global_batch_size, "microbatches": predictor.num_microbatches}):
        return _search(predictor, db, cluster, mode=mode, pipeline_only=pipeline_only, composite=composite, zero=zero,
                       recompute=recompute_db is not None, cross_node=cross_node, fewest=fewest, seed=seed,
                       progress=progress, note=note, unsplit_last_stage=unsplit_last_stage)


def _search(predictor: MemoryPredictor, db: str | Path, cluster: Cluster, *, mode: MemoryMode, pipeline_only: bool,
            composite: bool, zero: bool, recompute: bool, cross_node: bool, fewest: bool, seed: int,
            progress: ProgressCallback | None, note: Callable[[str], None],
            unsplit_last_stage: bool = False) -> MemoryPlan:
    """:func:`plan_memory` once its predictor is made."""
    scaling = predictor.scaling_note()
    if scaling is not None:
        note(scaling)
    with ProfileStore(db, create=False) as store:
        model_name = store.get_meta("model")
        merged = store.get_meta("merge_groups")
    # With merged layers (profile --merge-layers) the search runs on them and maps the plan back.
    view = predictor.on_units(merged) if merged else None
    model: StageMemoryModel = view if view is not None else predictor
    L = view.num_layers if view is not None else predictor.num_layers
    note(f"searching plans of {L} {'merged ' if merged else ''}layers on {cluster.describe()} for the lowest predicted"
         f" peak memory; {held_fixed(predictor)}")
    tried: tuple[MeshAttempt, ...] = ()
    if unsplit_last_stage and (fewest or mode != "exact"):
        raise UsageError("a plan whose last stage has no tensor part (--engine megatron) is searched by the exact"
                         " solver over the given mesh", fix="drop --fewest-devices and --mode")
    if fewest:
        capacity = cluster.memory_of(0)
        if capacity is None:
            raise UsageError("--fewest-devices needs a device capacity", fix="give --device-memory, e.g. 40GiB")
        outside = predictor.outside_bytes(None)  # CUDA: the floor outside the allocator (communicators come with a plan)

        def whole_plan(result: SearchResult, sub: Cluster) -> str | None:
            """What the shape's best plan needs with the allocator's reserve and what CUDA holds outside it
            (fewest.py's module note); None if every device has it."""
            plan = result.to_plan(schedule=predictor.schedule, global_batch_size=predictor.global_batch_size,
                                  num_microbatches=predictor.num_microbatches)
            devices = predictor.predict(view.to_original(plan) if view is not None else plan).devices
            over = [d for d in devices if (cap := sub.memory_of(d.device)) is not None and d.needed_bytes > cap]
            if not over:
                return None
            worst = max(over, key=lambda d: d.needed_bytes)
            return f"device {worst.device} needs {format_bytes(worst.needed_bytes)} with what the allocator and CUDA hold"

        found = fewest_devices(model, cluster, L, capacity=capacity - (outside or 0), pipeline_only=pipeline_only,
                               composite=composite, zero=zero, recompute=recompute,
                               cross_node=cross_node, progress=progress, check=whole_plan)
        result, cluster, tried = found.result, found.cluster, found.tried
    else:
        space = PlanSpace.for_cluster(cluster, L, pipeline_only=pipeline_only, composite=composite, zero=zero,
                                      recompute=recompute, cross_node=cross_node, unsplit_last_stage=unsplit_last_stage)
        if mode == "bayesian":
            result = solve_bayesian(model, space, seed=seed, progress=progress)
        elif mode == "exhaustive":
            result = solve_exhaustive(model, space, progress=progress)
        else:
            result = solve_exact(model, space, progress=progress)
    plan = result.to_plan(schedule=predictor.schedule, global_batch_size=predictor.global_batch_size,
                          num_microbatches=predictor.num_microbatches)
    if view is not None:
        plan = view.to_original(plan)
    plan = plan.with_extra(model=model_name, cluster=cluster.shape, predicted_peak_bytes=int(round(result.peak)))
    prediction = predictor.predict(plan)
    _check_fits(prediction, cluster, predictor, optimal=fewest or mode != "bayesian")
    return MemoryPlan(plan, prediction, result, cluster, model_name, tried)


class NoPlanFits(PlanError):
    """The lowest-memory plan of the search does not fit a device (a larger mesh may: the caller may try one)."""


def _check_fits(prediction: PlanPrediction, cluster: Cluster, predictor: MemoryPredictor, *, optimal: bool) -> None:
    """Refuse to present a plan as the answer if a device's predicted peak exceeds its capacity.

    Raises:
        PlanError: naming the device most over its capacity, by how much, and what would lower the peak.
    """
    over = [(d, cap) for d in prediction.devices
            if (cap := cluster.memory_of(d.device)) is not None and d.needed_bytes > cap]
    if not over:
        return
    worst, capacity = max(over, key=lambda dc: dc[0].needed_bytes - dc[1])
    uniform = len({cluster.memory_of(i) for i in range(cluster.num_devices)}) == 1
    claim = ("so no plan of this search fits" if optimal and uniform else
             "(this search does not weigh per-device capacities: --objective throughput keeps only plans that fit)"
             if not uniform else "(the bayesian search may miss lower plans: try --mode exact)")
    raise NoPlanFits(
        f"the lowest-memory plan does not fit: device {worst.device} (stage {worst.stage}) needs"
        f" {format_bytes(worst.needed_bytes)}" + ("" if worst.total_bytes is None else " (CUDA: tensors and what the"
        " allocator leaves out)") + f", {format_bytes(worst.needed_bytes - capacity)} more than its"
        f" {format_bytes(capacity)}" + (f", and {len(over) - 1} more device(s) exceed theirs" if len(over) > 1 else "")
        + f"; {claim}",
        fix=_remedies(predictor),
    )


def _remedies(predictor: MemoryPredictor) -> str:
    B, m = predictor.global_batch_size, predictor.num_microbatches
    more = next((c for c in range(m + 1, B + 1) if B % c == 0), None)
    smaller = (f"smaller micro-batches (e.g. --num-microbatches {more}: {B // more} samples each instead of {B // m}), "
               if more is not None else "")
    return (smaller + "activation checkpointing (profile with --activation-checkpointing), more or larger devices, or"
            " --objective pareto to see plans that trade time for memory")
