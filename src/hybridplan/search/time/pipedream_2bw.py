"""The PipeDream-2BW planner (Narayanan et al. ICML'21; the slides of seed 003): exhaustive search over
``(w, d, b, r)`` - ``w`` data-parallel replicas, ``d`` pipeline stages, micro-batch size ``b``, ``r`` whether
activations are recomputed - with a closed-form time model built from per-layer forward and backward times.

[Note: the 2BW closed-form time] 2BW runs 1F1B with two weight versions and no pipeline flush (seed 003,
"Double-Buffered Weight Updates": same 1F1B scheduling as PipeDream, ``m`` micro-batches per weight update), so
after the first fill the pipeline stays in steady state and an iteration (one weight update, ``w * m * b`` =
the global batch) costs ``m`` steady-state periods plus the gradient all-reduce:

- a stage's time per micro-batch: ``c_j = (1 + r) F_j(b) + B_j(b)`` (recomputation replays the forward pass
  before the backward pass; Chen et al. 2016);
- a boundary's time per micro-batch and direction: ``v / bw`` (the activation forward, its gradient back,
  each on its own direction of a full-duplex link), ``v`` and ``bw`` as in :mod:`hybridplan.predict.communication`;
- period ``P = max(max_j c_j, max_j v_j / bw_j)``: the slowest stage or transfer paces a flush-free pipeline;
- ``T = m P + max_j 2 (w-1)/w |W_j| / bw_j`` (ring all-reduce of stage ``j``'s gradients, eq. 3 of seed 002;
  not overlapped, a pessimistic choice). The one-time fill is amortised over training and left out.

Stages are cut to minimise ``P`` exactly, ties broken by the least fill time
(:func:`~hybridplan.search.time.period_cut.bottleneck_min_max`, the cut of
:func:`~hybridplan.search.time.stage_cuts.min_max_assignment`); the 2BW paper assumes repeated blocks, where this
is an even split. We require ``m >= d``: with 1F1B a stage has up to
``d`` micro-batches in flight, and they span at most the two stashed weight versions only when a version
covers at least ``d`` micro-batches (our reading of the 2-version bound on the slides' memory line,
"d activations of batchsize B/m, 2 weight versions").

Memory is the caller's: ``memory_ok(plan)`` sees a Plan with schedule "2bw" (the runtime runs it:
runtime/weight_stash.py; the memory predictor adds the second weight version: predict/stash.py) whose
``extra`` holds ``"pipeline": "pipedream-2bw"``, ``"weight_versions": 2`` and ``"recompute": r``. Without it,
``r = True`` never wins (it only adds time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hybridplan.errors import UsageError
from hybridplan.plan import Cluster, Plan, StagePlan
from hybridplan.predict.communication import p2p_seconds, sync_seconds
from hybridplan.predict.stage_compute import stage_layer_costs
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.time.period_cut import bottleneck_min_max

__all__ = ["TwoBWCandidate", "pipedream_2bw_time", "plan_pipedream_2bw"]


@dataclass(frozen=True)
class TwoBWCandidate:
    """One ``(w, d, b, r)`` configuration and its predicted time."""

    replicas: int
    """w: data-parallel replicas of the pipeline."""
    stages: int
    """d: pipeline depth."""
    micro_batch_size: int
    """b: samples per micro-batch of one replica."""
    recompute: bool
    """r: activations recomputed in the backward pass."""
    num_microbatches: int
    """m: micro-batches per replica per weight update."""
    plan: Plan
    period_s: float
    sync_s: float

    @property
    def iteration_s(self) -> float:
        """Seconds per weight update: ``m * period + sync``."""
        return self.num_microbatches * self.period_s + self.sync_s

    @property
    def samples_per_s(self) -> float:
        """Training throughput."""
        return self.plan.global_batch_size / self.iteration_s


def _groups(replicas: int, stages: int) -> list[StagePlan]:
    """The stages' device groups (their layers are what the partition decides; costing reads only devices)."""
    return [StagePlan.of(0, 0, range(j * replicas, (j + 1) * replicas), data_degree=replicas) for j in range(stages)]


def pipedream_2bw_time(
    profile: TimeProfile, cluster: Cluster, plan: Plan, *, recompute: bool
) -> tuple[float, float]:
    """``(period_s, sync_s)`` of a plan run as PipeDream-2BW (the note); iteration = ``m * period + sync``."""
    m = plan.microbatch_size
    period = 0.0
    for a, s in enumerate(plan.stages):
        c = stage_layer_costs(profile, cluster, s, m)
        sl = slice(s.start, s.stop)
        stage = float(((1.0 + recompute) * c.forward[sl] + c.backward[sl] + c.tensor_comm[sl]).sum())
        period = max(period, stage)
        if a + 1 < len(plan.stages):
            one_way = float(p2p_seconds(profile, cluster, s, plan.stages[a + 1], m)[s.stop - 1]) / 2
            period = max(period, one_way)
    sync = max(sync_seconds(profile, cluster, s) for s in plan.stages)
    return period, sync


def plan_pipedream_2bw(
    profile: TimeProfile,
    cluster: Cluster,
    global_batch_size: int,
    *,
    memory_ok: Callable[[Plan], bool] | None = None,
    micro_batch_sizes: Sequence[int] | None = None,
    progress: ProgressCallback | None = None,
) -> tuple[TwoBWCandidate, ...]:
    """Every feasible ``(w, d, b, r)`` with ``w * d`` = the cluster's devices, fastest first.

    Args:
        profile: layer times (tensor degree 1 is used).
        cluster: devices; replicas of a stage take consecutive devices (inside a node first).
        global_batch_size: ``w * m * b``.
        memory_ok: keeps a plan when True (see the note for the plan's extra keys).
        micro_batch_sizes: the ``b`` to try (default: every divisor of ``global batch / w``).
        progress: receives a line now and then on a long search, e.g. ``"pipedream-2bw search: depth 8 of at
            most 64, 12 candidates, 3.0 s"`` (:mod:`~hybridplan.search.progress`); ``None``: silent.

    Raises:
        UsageError: for a non-positive global batch size.

    Example:
        >>> from hybridplan.profiling.layer_info import LayerInfo
        >>> from hybridplan.profiling.timing_table import TimingTable
        >>> p = TimeProfile(model="toy", layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1e3,
        ...     parameter_bytes=1e6) for i in range(4)), timings=(TimingTable(device_type="cpu", tensor_degree=1,
        ...     micro_batch_size=1, forward_s=(1e-3,) * 4, backward_s=(2e-3,) * 4),))
        >>> best = plan_pipedream_2bw(p, Cluster.uniform(1, 2), 8)[0]
        >>> best.recompute
        False
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise UsageError(f"global batch size must be a positive integer, got {global_batch_size!r}")
    report = Progress.of(progress)
    n = cluster.num_devices
    out: list[TwoBWCandidate] = []
    depth = min(n, profile.num_layers)
    for d in range(1, depth + 1):
        if n % d:
            continue
        if report.due():
            report.update(f"pipedream-2bw search: depth {d} of at most {depth}, {len(out)} candidates")
        w = n // d
        if global_batch_size % w:
            continue
        per_replica = global_batch_size // w
        sizes = micro_batch_sizes or [b for b in range(1, per_replica + 1) if per_replica % b == 0]
        groups = _groups(w, d)
        for b in sizes:
            if per_replica % b or per_replica // b < d:
                continue
            mb = w * b
            costs = [stage_layer_costs(profile, cluster, g, mb) for g in groups]
            cuts = [p2p_seconds(profile, cluster, x, y, mb) for x, y in zip(groups, groups[1:])]
            for r in (False, True):
                if report.due():
                    report.update(f"pipedream-2bw search: depth {d} of at most {depth}, micro-batch size {b},"
                                  f" {len(out)} candidates")
                stage_costs = [(1.0 + r) * c.forward + c.backward + c.tensor_comm for c in costs]
                bounds = bottleneck_min_max(stage_costs, [e / 2 for e in cuts], cuts).boundaries
                stages = tuple(replace(groups[j], start=bounds[j], stop=bounds[j + 1]) for j in range(d))
                plan = Plan("2bw", global_batch_size, per_replica // b, stages,
                            {"pipeline": "pipedream-2bw", "weight_versions": 2, "recompute": r})
                if memory_ok is not None and not memory_ok(plan):
                    continue
                period, sync = pipedream_2bw_time(profile, cluster, plan, recompute=r)
                out.append(TwoBWCandidate(w, d, b, r, per_replica // b, plan, period, sync))
    out.sort(key=lambda c: (c.iteration_s, c.recompute))
    return tuple(out)
