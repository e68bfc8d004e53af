"""AMP's cost model: the iteration time of a plan from layer times, device speeds and link bandwidths.

[Note: the AMP cost model] (Li et al. NeurIPS'22, seed 002 section 3.4; symbols as there)

- Stage compute ``t_i`` per micro-batch = sum over the stage's layers of forward + backward seconds at the
  stage's tensor degree ``t`` for the ``M / d`` samples each replica gets (``M``: micro-batch, ``d``: data
  degree), on the stage's slowest device, per layer (every layer of a tensor group waits for its slowest
  member). A device whose type the profile has runs that type's times (its ``speed`` is relative to the
  profiled device, so it is not applied again); a device whose type the profile lacks runs the reference
  type's times divided by its ``speed``.
- Tensor-parallel all-reduces inside layers, unless the profile's times already contain them
  (``tensor_comm_in_times``, true for AMP's profiles): a layer with ``(n_f, n_b)`` all-reduces (Megatron
  block: (2, 2), Shoeybi et al. 2019 section 3 figure 4) adds ``(n_f + n_b) * 2(t-1)/t * (M/d) * a / B``
  with ``a`` the layer's activation bytes per sample and ``B`` the slowest link of the tensor group.
- Ring all-reduce (section 3.4, eq. 3): ``2 (n-1) M / (n B)``, ``B`` the lowest bandwidth in the group.
- Pipeline p2p ``e_i`` for the boundary after stage ``i`` (section 3.4: ``e = v / b``): the activation goes
  forward and its gradient, the same size, comes back, so ``e_i = 2 v / b``. ``v`` is what one device must
  send or receive: ``max(V / (d_i t_i), V / d_{i+1})`` with ``V = M a`` (a data replica of the next stage needs
  its share of the samples; a tensor group needs all of them; senders of one shard share the sending). ``b``
  is the slowest link among the device pairs that exchange data: rank ``k`` to rank ``k`` when both stages
  have the same degrees (AMP's pairing), otherwise every pair of replicas whose samples overlap.
- Pipeline (eq. 5): ``T_pp = (gas - 1) max_i t_i + sum_i t_i + sum_i e_i``. [Note: p2p overlap] Section 6.1:
  a sender hands the message off and goes on computing, only the receiver waits; so p2p lies on the
  critical path once (pipeline fill and drain) and not in the steady-state term - as long as a transfer is
  shorter than the computation it hides behind. Eq. 5 misses the other case: a one-way transfer ``e_i / 2``
  longer than every stage paces the steady state (a link carries one micro-batch at a time). We therefore
  use ``T_pp = (gas - 1) max(max_i t_i, max_i e_i / 2) + sum_i t_i + sum_i e_i``, which IS eq. 5 whenever
  compute dominates (every one of AMP's 52 trials: benchmarks/amp_trials). With ``overlap_p2p=False``
  (blocking sends) a stage's steady-state time also holds its own sends, ``t_i + e_i / 2 + e_{i-1} / 2``.
- The schedule enters only through the flush. GPipe, 1F1B and "flush" (PipeDream-Flush: "simply GPipe with
  1F1B scheduling", seed 003) flush the pipeline every iteration and have the same fill-and-drain critical
  path (eq. 5); they differ in memory. "2bw" (PipeDream-2BW, seed 003: two weight versions, "the same 1F1B
  scheduling" and no flush) keeps the pipeline in steady state across iterations, so an iteration costs
  ``gas`` steady-state periods and the fill is paid once per training run, not per iteration:
  ``T_pp = gas max(max_i t_i, max_i e_i / 2)`` (search/time/pipedream_2bw.py's closed form, [Note: the 2BW
  closed-form time]). The gradient all-reduce is added as for the others (not overlapped: pessimistic).
- Data-parallel sync (eq. 4): ``T = T_pp + max over stages and tensor ranks`` of the ring all-reduce of the
  stage's gradient bytes / ``t`` over the data group of that tensor rank. Layers that share parameters
  (tied embeddings) count once per stage.

[Note: the round trip of 1F1B] A schedule that bounds the micro-batches in flight (1F1B, PipeDream-Flush and
2BW: stage 0 holds at most ``k = p`` of them, plan/schedule.py ``max_in_flight``) cannot start micro-batch
``j + k`` on the first stage before micro-batch ``j`` has gone forward through every stage and its gradient
all the way back: ``start(F_{j+k}) >= start(F_j) + R`` with the round trip ``R = sum_i t_i + sum_i e_i``
(every stage's forward and backward, every boundary's transfer both ways). In the steady state ``k``
periods hold one round trip, so the period is at least ``R / k`` besides ``max_i t_i``. Eq. 5 leaves this
out; it binds when stages are balanced and transfers are not negligible: a pipeline of ``p`` equal stages
pays ``sum e_i / p`` more per micro-batch (on the CPU runtime, 2 stages: one p2p latency per micro-batch,
benchmarks/estimate_accuracy). GPipe (``k = gas``) has no such bound.

[Note: the terms AMP leaves out] (issue 14: on an H100 the model above was 16-36% below the measured
iteration, ../shared/notes/gpu-h100-facts.md section Time; on the CPU runtime 13% for gpt-tiny, one stage.)
Every rank ends an iteration with its optimizer step and the runtime closes it with a barrier
(runtime/executor.py), so

    ``T = T_pp + sync + max_i step_i + max_i overhead_i``

- ``step_i``: the stage's optimizer step, the profile's measured seconds per parameter byte
  (profiling/timing.py, [Note: optimizer step and overhead]) times the bytes one device of the stage updates:
  the stage's parameter bytes / ``t`` (a tensor shard), / ``d`` more under ZeRO (every level shards the
  optimizer state over the data group, and each replica steps its share). AdamW's update makes a fixed number
  of element-wise passes over each parameter (torch.optim.AdamW), hence linear in bytes. The stages step in
  parallel; the last to finish closes the iteration: the max (as eq. 4 takes the max of the syncs).
- ``overhead_i``: what one iteration of the stage costs beyond its layers and step, measured as the residual
  of the timing runs (zero_grad, the synthetic batch, the loss, barriers): interpolated in the micro-batch
  size as layer times are ([Note: time vs micro-batch size]), paid once per iteration, in parallel by the
  stages: the max.

The per-stage terms are in :mod:`~hybridplan.predict.stage_compute` (layer times, CPU core sharing, optimizer
step, overhead, recompute) and :mod:`~hybridplan.predict.communication` (links, all-reduces, p2p, gradient
sync, ZeRO's collectives, [Note: per-message latency]); the result types in
:mod:`~hybridplan.predict.time_breakdown`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hybridplan.plan import Cluster, Plan, spec
from hybridplan.plan.schedule import max_in_flight, stage_actions
from hybridplan.predict.communication import (
    p2p_latency_seconds,
    p2p_messages,
    p2p_seconds,
    shard_seconds,
    sync_latency_seconds,
    sync_messages,
    sync_seconds,
)
from hybridplan.predict.stage_compute import (
    core_sharing,
    optimizer_seconds,
    overhead_seconds,
    recompute_seconds,
    stage_layer_costs,
)
from hybridplan.errors import ProfileError
from hybridplan.predict.time_breakdown import StageTime, TimeBreakdown
from hybridplan.profiling.time_profile import TimeProfile

__all__ = ["pipeline_seconds", "pipeline_seconds_of", "pipeline_seconds_from", "first_stage_in_flight", "predict_iteration_time"]


def pipeline_seconds(
    compute_s: np.ndarray | list[float], p2p_s: np.ndarray | list[float], num_microbatches: int, *, flush: bool = True,
    in_flight: int | None = None,
) -> float:
    """``(gas - 1) P + sum t_i + sum e_i`` with ``P = max(max t_i, max e_i / 2)`` (eq. 5 with the p2p-overlap
    note); ``p2p_s`` has one entry (both directions) per boundary. Without a ``flush`` (PipeDream-2BW):
    ``gas P``. ``in_flight``: the micro-batches the first stage may hold at once when fewer than ``gas``
    ([Note: the round trip of 1F1B]): ``P`` is then at least ``(sum t_i + sum e_i) / in_flight``."""
    return float(pipeline_seconds_of(np.asarray(compute_s, dtype=float), p2p_s, num_microbatches, flush=flush,
                                     in_flight=in_flight))


def pipeline_seconds_of(
    compute_s: np.ndarray, p2p_s: np.ndarray | Sequence[float], num_microbatches: int, *, flush: bool = True,
    in_flight: int | None = None,
) -> np.ndarray:
    """:func:`pipeline_seconds` of many choices of stage times at once: ``compute_s`` is ``(..., stages)``, the
    boundaries' ``p2p_s`` are shared; one time per choice, ``(...)``. The one formula of the pipeline term, so
    that a search that times choices in bulk (search/time/stage_options.py) times them as the model does."""
    t = np.asarray(compute_s, dtype=float)
    e = np.asarray(p2p_s, dtype=float)
    bottleneck = np.maximum(t.max(axis=-1), float(e.max()) / 2 if e.size else 0.0)
    return pipeline_seconds_from(bottleneck, t.sum(axis=-1) + float(e.sum()), num_microbatches, flush=flush,
                                 in_flight=in_flight)


def pipeline_seconds_from(
    bottleneck: np.ndarray | float, round_trip: np.ndarray | float, num_microbatches: int, *, flush: bool = True,
    in_flight: int | None = None,
) -> np.ndarray:
    """The pipeline term from its two parts: the ``bottleneck`` ``max(max t_i, max e_i / 2)`` (the slowest stage
    or one-way transfer) and the ``round_trip`` ``sum t_i + sum e_i`` (a micro-batch through every stage and
    back: the fill and drain, and [Note: the round trip of 1F1B]). The steady-state period is the bottleneck,
    or ``round_trip / in_flight`` where that is more; the term is non-decreasing in both parts. Arrays broadcast:
    the stage-cut search (search/time/bottleneck_cuts.py) times many (bottleneck, round trip) pairs of cuts by it,
    so that a cut is timed as the model times the plan.

    >>> float(pipeline_seconds_from(2.0, 9.0, 4)), float(pipeline_seconds_from(2.0, 9.0, 4, in_flight=3))
    (15.0, 18.0)
    """
    steady = np.asarray(bottleneck, dtype=float)
    total = np.asarray(round_trip, dtype=float)
    if in_flight is not None and in_flight < num_microbatches:
        steady = np.maximum(steady, total / in_flight)
    if not flush:
        out: np.ndarray = num_microbatches * steady
        return out
    # one micro-batch has no steady state: the term is its round trip (and 0 x an infinite bottleneck, a stage
    # option that does not fit, stays out of it instead of making it nan)
    fill = (num_microbatches - 1) * steady if num_microbatches > 1 else np.zeros_like(steady)
    out = fill + total
    return out


@functools.lru_cache(maxsize=1024)
def first_stage_in_flight(schedule: str, num_stages: int, num_microbatches: int) -> int:
    """Micro-batches the first stage holds at once ([Note: the round trip of 1F1B]), from the schedule's own actions."""
    return max_in_flight(stage_actions(schedule, num_stages, 0, num_microbatches))


def predict_iteration_time(
    plan: Plan,
    profile: TimeProfile,
    cluster: Cluster,
    *,
    overlap_p2p: bool = True,
    schedule: str | None = None,
) -> TimeBreakdown:
    """Predicted seconds per training iteration of ``plan`` (the note at the top of the module).

    Args:
        plan: the plan (CAPTURE's mixed stages, AMP's ``dp x tp`` stages, or any mix).
        profile: the model's layer times and sizes.
        cluster: device types, speeds and bandwidths.
        overlap_p2p: AMP's section 6.1 overlap (default); False models blocking sends.
        schedule: the pipeline schedule (default: the plan's); "2bw" has no flush.

    Raises:
        PlanError: if the plan does not cover the profile's layers or names devices the cluster lacks.
        ProfileError: if the profile lacks a tensor degree the plan uses, or a stage recomputes selectively.

    Example:
        >>> from hybridplan.profiling.layer_info import LayerInfo
        >>> from hybridplan.profiling.timing_table import TimingTable
        >>> p = TimeProfile(model="toy", layers=(LayerInfo(name="l", activation_bytes_per_sample=0.0,
        ...     parameter_bytes=0.0),), timings=(TimingTable(device_type="cpu", tensor_degree=1,
        ...     micro_batch_size=1, forward_s=(1.0,), backward_s=(2.0,)),))
        >>> plan = Plan.uniform(boundaries=[0, 1], data_degree=1, tensor_degree=1, micro_batch_size=1,
        ...     global_batch_size=4)
        >>> predict_iteration_time(plan, p, Cluster.uniform(1, 1)).total_s   # (4 - 1) * 3 + 3
        12.0
    """
    if schedule is None:
        schedule = plan.schedule
    flush = spec(schedule).flushes
    plan.check_fits(profile.num_layers, cluster)
    for i, s in enumerate(plan.stages):
        if s.recompute == "selective":
            raise ProfileError(f"stage {i} ({s.describe()}) recomputes selectively (torchtitan's per-operation"
                               " policy), whose recompute time (the operations it does not keep) is not modelled",
                               fix="predict its time with \"recompute\": \"full\" (an upper bound) or \"none\" (a"
                               " lower bound)")
    m = plan.microbatch_size
    sharing = [core_sharing(profile, cluster, plan, s) for s in plan.stages]
    costs = [stage_layer_costs(profile, cluster, s, m, sharing=f) for s, f in zip(plan.stages, sharing)]
    e = [
        float(p2p_seconds(profile, cluster, a, b, m)[a.stop - 1])
        for a, b in zip(plan.stages, plan.stages[1:])
    ]
    stages = []
    for i, (s, c) in enumerate(zip(plan.stages, costs)):
        sl = slice(s.start, s.stop)
        stages.append(
            StageTime(
                start=s.start, stop=s.stop, kind=s.kind, devices=s.devices,
                forward_s=float(c.forward[sl].sum()), backward_s=float(c.backward[sl].sum()),
                tensor_comm_s=float(c.tensor_comm[sl].sum()), p2p_s=e[i] if i < len(e) else 0.0,
                sync_s=sync_seconds(profile, cluster, s),
                optimizer_s=optimizer_seconds(profile, cluster, s, sharing=sharing[i]),
                overhead_s=overhead_seconds(profile, cluster, s, m, sharing=sharing[i]),
                sharing=sharing[i],
                recompute_s=recompute_seconds(c, s),
                shard_comm_s=shard_seconds(profile, cluster, s),
                p2p_latency_s=p2p_latency_seconds(profile, cluster, s, plan.stages[i + 1]) if i < len(e) else 0.0,
                p2p_messages=p2p_messages(s, plan.stages[i + 1], plan.num_microbatches) if i < len(e) else 0,
                sync_latency_s=sync_latency_seconds(profile, cluster, s),
                sync_messages=sync_messages(profile, s),
            )
        )
    compute = np.array([s.compute_s for s in stages])
    in_flight = first_stage_in_flight(schedule, plan.num_stages, plan.num_microbatches)
    if overlap_p2p:
        pipeline = pipeline_seconds(compute, e, plan.num_microbatches, flush=flush, in_flight=in_flight)
    else:
        out = np.array(e + [0.0]) / 2 + np.array([0.0] + e) / 2
        blocking = compute + out
        steady = float(blocking.max())
        if in_flight < plan.num_microbatches:  # [Note: the round trip of 1F1B]
            steady = max(steady, (float(compute.sum()) + sum(e)) / in_flight)
        if flush:
            pipeline = float((plan.num_microbatches - 1) * steady + compute.sum() + sum(e))
        else:
            pipeline = float(plan.num_microbatches * steady)
    return TimeBreakdown(
        stages=tuple(stages),
        num_microbatches=plan.num_microbatches,
        microbatch_size=m,
        pipeline_s=pipeline,
        sync_s=max(s.sync_s for s in stages),
        overlap_p2p=overlap_p2p,
        schedule=schedule,
        optimizer_s=max(s.optimizer_s for s in stages),
        overhead_s=max(s.overhead_s for s in stages),
    )
