"""Cutting one strategy's layers into its pipeline stages: the stages' device groups and layer costs, the
boundary and sync costs, the cut (search/time/bottleneck_cuts.py, or AMP's program), the plan.

:func:`~hybridplan.search.time.throughput.search_throughput` calls :func:`assign_layers` for each strategy (and
again with stage options, weights or memory windows: [Note: cutting for the stage options] in
search/time/throughput.py, [Note: cutting within memory] in search/time/bottleneck_cuts.py); benchmarks call it
to cut a strategy AMP's trials name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal, overload

import numpy as np

from hybridplan.errors import UsageError
from hybridplan.plan import Cluster, Plan, StagePlan, as_schedule, spec
from hybridplan.predict.communication import (
    ZERO_ITERATION_ALLREDUCES,
    ZERO_MICROBATCH_ALLREDUCES,
    allreduce_seconds,
    link_bandwidth,
    p2p_seconds,
    slowest_link,
    sync_latency_per_tensor,
)
from hybridplan.predict.stage_compute import optimizer_rate, stage_layer_costs
from hybridplan.predict.time_model import first_stage_in_flight
from hybridplan.profiling.layer_info import parameter_tensors
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.search.time.bottleneck_cuts import bottleneck_assignment
from hybridplan.search.time.period_cut import bottleneck_min_max
from hybridplan.search.time.stage_cuts import Assignment, amp_layer_assignment, min_max_assignment
from hybridplan.search.time.stage_options import Option
from hybridplan.search.time.step_costs import StepCosts
from hybridplan.search.time.sync_costs import SyncCosts, range_sums

__all__ = ["CutAlgorithm", "assign_layers", "parameter_range_bytes", "parameter_range_tensors"]

CutAlgorithm = Literal["bottleneck", "amp"]
"""How :func:`assign_layers` cuts stages of a flushing schedule: "bottleneck" (default) minimises the predicted
iteration time, the pipeline term as the time model has it (the round trip of 1F1B included) and the gradient sync
(bandwidth and per-message latency) and the slowest stage's optimizer step (which also grows with a stage's
parameter bytes; 0 for a profile that measured no step), by branch and bound (search/time/bottleneck_cuts.py);
"amp" is AMP's dynamic program on eq. 5 alone (stage_cuts.py), the reference it replaced: exact for that term but
O(k L^4), blind to the sync and to the round trip of 1F1B."""


@overload
def assign_layers(
    profile: TimeProfile,
    cluster: Cluster,
    devices: Sequence[int],
    *,
    pipeline_degree: int,
    data_degree: int,
    tensor_degree: int,
    micro_batch_size: int,
    global_batch_size: int,
    cache: dict[bytes, Assignment | None] | None = None,
    schedule: str = "1f1b",
    cuts: CutAlgorithm = "bottleneck",
    range_bytes: np.ndarray | None = None,
    range_tensors: np.ndarray | None = None,
    options: Sequence[Option] | None = None,
    weights: Sequence[float] | None = None,
    starts: None = None,
) -> Plan: ...


@overload
def assign_layers(
    profile: TimeProfile,
    cluster: Cluster,
    devices: Sequence[int],
    *,
    pipeline_degree: int,
    data_degree: int,
    tensor_degree: int,
    micro_batch_size: int,
    global_batch_size: int,
    cache: dict[bytes, Assignment | None] | None = None,
    schedule: str = "1f1b",
    cuts: CutAlgorithm = "bottleneck",
    range_bytes: np.ndarray | None = None,
    range_tensors: np.ndarray | None = None,
    options: Sequence[Option] | None = None,
    weights: Sequence[float] | None = None,
    starts: Sequence[np.ndarray] | None,
) -> Plan | None: ...


def assign_layers(
    profile: TimeProfile,
    cluster: Cluster,
    devices: Sequence[int],
    *,
    pipeline_degree: int,
    data_degree: int,
    tensor_degree: int,
    micro_batch_size: int,
    global_batch_size: int,
    cache: dict[bytes, Assignment | None] | None = None,
    schedule: str = "1f1b",
    cuts: CutAlgorithm = "bottleneck",
    range_bytes: np.ndarray | None = None,
    range_tensors: np.ndarray | None = None,
    options: Sequence[Option] | None = None,
    weights: Sequence[float] | None = None,
    starts: Sequence[np.ndarray] | None = None,
) -> Plan | None:
    """The plan of a strategy whose stages are cut to minimise its predicted iteration time on these devices
    (``cuts``, see :data:`CutAlgorithm`); for "2bw", which never flushes, by its periods, sync and step together
    (the min-max partition of the steady-state period where there is neither sync nor step: [Note: 2BW's cut with
    the sync and the step] in search/time/bottleneck_cuts.py).

    ``cache`` memoises the cut on its inputs: annealing mostly visits placements whose stage and boundary
    costs equal ones already solved (identical devices and links). ``range_bytes`` and ``range_tensors``
    (:func:`parameter_range_bytes`, :func:`parameter_range_tensors`) save recomputing them per strategy.

    ``options`` (per stage, its (ZeRO level, recompute)) cuts for the time of stages that take them ([Note: cutting
    for the stage options] in search/time/throughput.py), and ``weights`` (per stage) multiply the stages' layer
    times, so as to move layers off a stage that fits in memory under no option; the plan returned is the plain one,
    options unset. ``starts`` (per stage, :data:`~hybridplan.search.time.throughput.StageWindows`) keeps to the cuts
    whose every stage fits its memory ([Note: cutting within memory] in search/time/bottleneck_cuts.py; None where
    none does); the "bottleneck" cuts only (not ``cuts="amp"``, whose program knows no windows).
    """
    pp, dp, tp = pipeline_degree, data_degree, tensor_degree
    size = dp * tp
    # the stages' device groups; their layers are what the dynamic program decides (costing reads only devices)
    groups = [StagePlan.of(0, 0, devices[j * size : (j + 1) * size], data_degree=dp, tensor_degree=tp) for j in range(pp)]
    m = dp * micro_batch_size
    layer_costs = [stage_layer_costs(profile, cluster, g, m) for g in groups]
    zeros = [0] * pp if options is None else [z for z, _ in options]
    shard: list[np.ndarray | float] = [0.0] * pp  # ZeRO-2/3's collectives per micro-batch, per layer
    if any(zeros):
        layer_bytes = np.array([layer.parameter_bytes for layer in profile.layers], dtype=float)
        shard = [ZERO_MICROBATCH_ALLREDUCES[z] * allreduce_seconds(1.0, dp, link_bandwidth(
            profile, min(slowest_link(cluster, g.data_group(r)) for r in range(tp)), "allreduce")) / tp * layer_bytes
            for z, g in zip(zeros, groups)]
    stage_costs = [(c.total + (c.forward if options is not None and options[j][1] else 0.0) + shard[j])
                   * (1.0 if weights is None else weights[j]) for j, c in enumerate(layer_costs)]
    cut_costs = [p2p_seconds(profile, cluster, a, b, m) for a, b in zip(groups, groups[1:])]
    gas = global_batch_size // m
    flush = spec(schedule).flushes
    sync = None
    if cuts == "bottleneck" and dp > 1:
        # communication.sync_seconds, per range of layers: the ring all-reduce of the stage's gradient bytes / tp on
        # its slowest data group capped by the measured bandwidth, plus its per-message latency (the stage's
        # parameter tensors x 2(dp-1) x alpha: sync_latency_per_tensor), both times the ZeRO level's all-reduces
        factors = tuple(ZERO_ITERATION_ALLREDUCES[z] * allreduce_seconds(1.0, dp, link_bandwidth(
            profile, min(slowest_link(cluster, g.data_group(r)) for r in range(tp)), "allreduce")) / tp
            for z, g in zip(zeros, groups))
        latencies = tuple(ZERO_ITERATION_ALLREDUCES[z] * sync_latency_per_tensor(profile, cluster, replace(g, zero=z))
                          for z, g in zip(zeros, groups))
        if range_bytes is None:
            range_bytes = parameter_range_bytes(profile)
        if any(latencies):
            if range_tensors is None:
                range_tensors = parameter_range_tensors(profile)
            sync = SyncCosts(range_bytes, factors, range_tensors, latencies)
        else:
            sync = SyncCosts(range_bytes, factors)
    step = None
    if cuts == "bottleneck":
        # stage_compute.optimizer_seconds per range of layers: the slowest stage's step closes the iteration
        rates = tuple(optimizer_rate(profile, cluster, replace(g, zero=z)) for z, g in zip(zeros, groups))
        if any(rates):
            if range_bytes is None:
                range_bytes = parameter_range_bytes(profile)
            step = StepCosts(range_bytes, rates)
    # the cut is timed with the round trip of 1F1B as the model times the plan (predict/time_model.py)
    in_flight = first_stage_in_flight(schedule, pp, gas) if cuts == "bottleneck" else None
    key = b""
    if cache is not None:
        key = np.concatenate([[gas, flush, cuts == "amp", in_flight or 0], *stage_costs, *cut_costs,
                              sync.factors if sync else [], (sync.latencies or []) if sync else [],
                              [-2, *step.rates] if step else [],
                              *([[-1], *starts] if starts is not None else [])]).tobytes()
    if cuts == "amp" and starts is not None:
        raise UsageError("AMP's dynamic program cuts without memory windows", fix="use cuts='bottleneck'")
    assignment: Assignment | None
    if cache is not None and key in cache:
        assignment = cache[key]
    else:
        # a one-way transfer (half of e) is the least period a boundary allows (time_model, p2p overlap)
        floors = [c / 2 for c in cut_costs]
        if flush and cuts == "amp":
            assignment = amp_layer_assignment(stage_costs, cut_costs, gas, floors)
        elif flush:
            assignment = bottleneck_assignment(stage_costs, cut_costs, gas, floors, sync, in_flight, starts=starts,
                                               step=step)
        elif cuts == "bottleneck" and (sync is not None or step is not None):  # [Note: 2BW's cut with the sync and the step]
            assignment = bottleneck_assignment(stage_costs, cut_costs, gas, floors, sync, in_flight, starts=starts,
                                               step=step, flush=False)
        else:
            assignment = (bottleneck_min_max(stage_costs, floors, cut_costs, gas, in_flight, starts=starts)
                          if cuts == "bottleneck" else min_max_assignment(stage_costs, floors, cut_costs))
        if cache is not None:
            cache[key] = assignment
    if assignment is None:
        return None
    b = assignment.boundaries
    stages = tuple(replace(groups[j], start=b[j], stop=b[j + 1]) for j in range(pp))
    return Plan(as_schedule(schedule), global_batch_size, global_batch_size // m, stages)


def parameter_range_bytes(profile: TimeProfile) -> np.ndarray:
    """Gradient bytes of every layer range ``[a, b)`` of the profile, shared parameters once per range (as
    communication.sync_seconds counts them)."""
    return range_sums([layer.parameter_bytes for layer in profile.layers],
                      [layer.shared_parameters for layer in profile.layers])


def parameter_range_tensors(profile: TimeProfile) -> np.ndarray:
    """Parameter tensors of every layer range ``[a, b)`` of the profile, as
    :func:`~hybridplan.profiling.layer_info.parameter_tensors` counts a stage's (shared parameters once per range:
    the first layer of a group in the range holds them; 1 per layer with parameters where not recorded)."""
    return range_sums([parameter_tensors([layer]) for layer in profile.layers],
                      [layer.shared_parameters for layer in profile.layers])
