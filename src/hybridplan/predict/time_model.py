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
[Note: ZeRO and recompute in time] (issue 11: a plan stage's ``"zero"`` and ``"recompute"`` keys)

- Recompute (``"recompute": "full"``): every layer of the stage is checkpointed (torch.utils.checkpoint,
  runtime/stage.py), so its backward runs the layer's forward again first: the stage's ``t_i`` grows by its
  forward seconds per micro-batch (``recompute_s``). This assumes the layer times were measured *without*
  checkpointing (``profile --time`` records whether they were, as the time identity's
  ``activation_checkpointing``; the throughput search refuses per-stage recompute otherwise: their backward
  would already hold the recomputation).
- ZeRO, over the stage's data group of ``d`` devices and per tensor rank, in units of the stage's ring
  all-reduce ``A`` of its gradient bytes / ``t`` (eq. 3). A ring all-reduce is a reduce-scatter plus an
  all-gather, each moving ``(d-1)/d`` of the bytes (ZeRO paper, Rajbhandari et al. SC'20, section 7: ZeRO-1/2
  "incur no additional communication", ZeRO-3 1.5x). What this runtime does (runtime/sharding.py):

  - ZeRO-1: ``ZeroRedundancyOptimizer`` after the executor's whole all-reduce of the gradients: the
    all-reduce, then each replica broadcasts its updated share (an all-gather's volume): ``1.5 A`` once per
    iteration (:data:`ZERO_ITERATION_ALLREDUCES`). (DeepSpeed's and Megatron's distributed optimizers
    reduce-scatter instead, the paper's ``A``.)
  - ZeRO-2: FSDP2 ``fully_shard(reshard_after_forward=False)``: each micro-batch all-gathers a layer's
    parameters before its forward and reduce-scatters its gradients after its backward (the gathered copy is
    freed after the backward, sharding.py), ``A`` per micro-batch (:data:`ZERO_MICROBATCH_ALLREDUCES`);
    nothing is left to sync at the end of the iteration.
  - ZeRO-3: ``reshard_after_forward=True``: a second all-gather before the backward, ``1.5 A`` per
    micro-batch (the paper's 1.5x, per micro-batch because FSDP reduces every backward).

  The per-micro-batch collectives are added to the stage's ``t_i`` (``shard_comm_s``), not overlapped with its
  compute (as the gradient sync is not: pessimistic where FSDP prefetches); the optimizer step of every level
  updates ``1/d`` of the stage's parameters (above).
- [Note: devices that share CPU cores] On the CPU runtime a device is a process and a node's processes share
  the host's ``C`` cores (``TimeProfile.host_cores``). Linux's fair scheduler gives each of ``n`` runnable
  single-threaded processes ``C / n`` of a core when ``n > C`` (CFS: "an ideal, precise multi-tasking CPU",
  Documentation/scheduler/sched-design-CFS.rst), so a stage's compute, step and overhead on a node where
  the plan runs ``n`` processes take ``max(1, n / C) / max(1, t / C)`` times the profiled seconds (the
  timing run of tensor degree ``t`` itself ran ``t`` processes). It assumes every process of the node is
  busy, as in a pipeline's steady state; the fill and drain run fewer, so the factor is an upper bound there.
  Profiles of accelerators leave ``host_cores`` null and get factor 1.

[Note: per-message latency] (issue 14: on the CPU runtime a data-parallel pair of gpt-tiny ran 57% slower than
the bandwidth-only model, benchmarks/estimate_accuracy.) AMP's terms are bandwidth only; every message also
pays a fixed latency ``alpha`` (Hockney's model, profiling/links.py, [Note: Hockney's alpha-beta model]). A
link's ``alpha`` is the cluster file's ``intra_node_latency``/``inter_node_latency`` where given
(plan/cluster.py), else the one ``profile --time`` measured with the runtime's backend (the time profile's
``links``: per ring step for collectives, per message for send/recv; used for every link, a lower bound
across nodes), else 0 (imported or older profiles). A measured bandwidth also caps the cluster's: a
message goes no faster than the backend moved it on the profiled host (``min(B_cluster, beta)``). The
messages counted are those the runtime sends:

- data-parallel sync: runtime/executor.py ``_sync_gradients`` all-reduces every trainable parameter
  tensor's gradient on its own, so ``C`` collectives per iteration (``C``: the stage's parameter tensors, the
  profile's ``parameter_tensors``, shared ones once; 1 per layer with parameters where not recorded), each a
  ring of ``2 (d - 1)`` steps (gloo/allreduce.cc ``ring()``; NCCL's ring): ``sync += C * 2 (d - 1) * alpha``.
  ZeRO-2/3 stages reduce-scatter inside FSDP instead (runtime/sharding.py): their collectives are not
  counted yet (latency 0 there), nor ZeRO-1's parameter broadcasts after the step.
- pipeline: per micro-batch and boundary, one message per routed transfer in each direction
  (runtime/routing.py ``route``: one for stages of equal degrees); a receiving rank posts all its receives
  before waiting (runtime/shared_gpu.py ``receive_into``) and a sender posts its sends without waiting, so
  their latencies overlap: ``e_i += 2 alpha`` (one per direction), on the same critical path as the
  bandwidth term.
- tensor parallelism: the times a hybridplan profile measures at degree ``t > 1`` were taken inside a real
  tensor-parallel group (profiling/timing.py, ``tensor_comm_in_times``) and already hold the collectives'
  latency; for a profile without them each of a layer's ``n_f + n_b`` all-reduces adds ``2 (t - 1) alpha``.
- the two barriers of an iteration (runtime/executor.py) are in the measured overhead only for tensor
  degree > 1 (a one-process timing run skips them): not counted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.plan import Cluster, Plan, StagePlan, spec
from hybridplan.plan.schedule import max_in_flight, stage_actions
from hybridplan.profiling.time_profile import TimeProfile, parameter_bytes, parameter_tensors

__all__ = [
    "LayerCosts",
    "StageTime",
    "TimeBreakdown",
    "allreduce_seconds",
    "slowest_link",
    "stage_layer_costs",
    "core_sharing",
    "optimizer_seconds",
    "overhead_seconds",
    "p2p_seconds",
    "p2p_latency_seconds",
    "p2p_messages",
    "sync_seconds",
    "shard_seconds",
    "recompute_seconds",
    "ZERO_ITERATION_ALLREDUCES",
    "ZERO_MICROBATCH_ALLREDUCES",
    "sync_latency_seconds",
    "sync_messages",
    "link_latency",
    "link_bandwidth",
    "pipeline_seconds",
    "predict_iteration_time",
]

ZERO_ITERATION_ALLREDUCES: dict[int, float] = {0: 1.0, 1: 1.5, 2: 0.0, 3: 0.0}
"""Gradient all-reduces ``A`` a data stage's group pays once per iteration, by ZeRO level ([Note: ZeRO and
recompute in time]: 0 the plain all-reduce; 1 + the ZeroRedundancyOptimizer's broadcast of the updated shares,
half an all-reduce; 2 and 3 reduce every micro-batch instead)."""

ZERO_MICROBATCH_ALLREDUCES: dict[int, float] = {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.5}
"""All-reduce equivalents ``A`` a data stage's group pays per micro-batch, by ZeRO level (FSDP2: ZeRO-2 an
all-gather and a reduce-scatter, ZeRO-3 one more all-gather; ZeRO paper section 7, runtime/sharding.py)."""


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer seconds of one micro-batch on one stage configuration (arrays over ALL profile layers)."""

    forward: np.ndarray
    backward: np.ndarray
    tensor_comm: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """forward + backward + tensor-parallel communication, per layer."""
        return self.forward + self.backward + self.tensor_comm


@dataclass(frozen=True)
class StageTime:
    """One stage's share of the iteration (seconds; per micro-batch except ``sync_s``)."""

    start: int
    stop: int
    kind: str
    devices: tuple[int, ...]
    forward_s: float
    backward_s: float
    tensor_comm_s: float
    p2p_s: float
    """Forward activation + backward gradient across the boundary to the NEXT stage (0 for the last)."""
    sync_s: float
    """Data-parallel gradient all-reduce, once per iteration."""
    optimizer_s: float = 0.0
    """The optimizer step, once per iteration ([Note: the terms AMP leaves out])."""
    overhead_s: float = 0.0
    """Per-iteration seconds beyond layers and step, once per iteration."""
    sharing: float = 1.0
    """The CPU core-sharing factor already applied to the stage's seconds ([Note: devices that share CPU cores])."""
    recompute_s: float = 0.0
    """The forward run again in the backward of a recomputed stage, per micro-batch ([Note: ZeRO and recompute
    in time])."""
    shard_comm_s: float = 0.0
    """ZeRO-2/3's parameter all-gathers and gradient reduce-scatter, per micro-batch."""
    p2p_latency_s: float = 0.0
    """Of ``p2p_s``: the per-message latency of both directions, per micro-batch ([Note: per-message latency])."""
    p2p_messages: int = 0
    """Messages across the boundary to the next stage per iteration, both directions, all ranks."""
    sync_latency_s: float = 0.0
    """Of ``sync_s``: the per-message latency of the gradient all-reduces."""
    sync_messages: int = 0
    """Ring steps one rank of the stage makes per iteration in the gradient all-reduces (collectives x 2(d-1))."""

    @property
    def compute_s(self) -> float:
        """``t_i`` of eq. 5: forward + backward + tensor-parallel all-reduces (+ recompute and ZeRO-2/3's
        collectives, where the stage has them)."""
        return self.forward_s + self.backward_s + self.tensor_comm_s + self.recompute_s + self.shard_comm_s


@dataclass(frozen=True)
class TimeBreakdown:
    """Predicted iteration time, per stage and in total."""

    stages: tuple[StageTime, ...]
    num_microbatches: int
    microbatch_size: int
    pipeline_s: float
    sync_s: float
    overlap_p2p: bool = True
    schedule: str = "1f1b"
    """The schedule the pipeline term models; "2bw" has no per-iteration flush."""
    optimizer_s: float = 0.0
    """The slowest stage's optimizer step ([Note: the terms AMP leaves out])."""
    overhead_s: float = 0.0
    """The largest per-iteration overhead of a stage."""

    @property
    def total_s(self) -> float:
        """Seconds per iteration: pipeline + the slowest data-parallel sync (eq. 4) + the slowest optimizer step
        + the largest per-iteration overhead."""
        return self.pipeline_s + self.sync_s + self.optimizer_s + self.overhead_s

    @property
    def bottleneck_stage(self) -> int:
        """Index of the stage with the largest ``t_i``."""
        return int(np.argmax([s.compute_s for s in self.stages]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (seconds)."""
        return {
            "total_s": self.total_s,
            "pipeline_s": self.pipeline_s,
            "sync_s": self.sync_s,
            "optimizer_s": self.optimizer_s,
            "overhead_s": self.overhead_s,
            "num_microbatches": self.num_microbatches,
            "microbatch_size": self.microbatch_size,
            "overlap_p2p": self.overlap_p2p,
            "schedule": self.schedule,
            "stages": [
                {
                    "layers": [s.start, s.stop], "kind": s.kind, "devices": list(s.devices),
                    "forward_s": s.forward_s, "backward_s": s.backward_s, "tensor_comm_s": s.tensor_comm_s,
                    "p2p_s": s.p2p_s, "sync_s": s.sync_s, "optimizer_s": s.optimizer_s, "overhead_s": s.overhead_s,
                    "core_sharing": s.sharing, "recompute_s": s.recompute_s, "shard_comm_s": s.shard_comm_s,
                    "p2p_latency_s": s.p2p_latency_s, "p2p_messages": s.p2p_messages,
                    "sync_latency_s": s.sync_latency_s, "sync_messages": s.sync_messages,
                }
                for s in self.stages
            ],
        }

    def table(self) -> str:
        """A terminal table in milliseconds, one row per stage, then the totals."""
        head = (f"{'stage':>5} {'layers':>9} {'kind':>11} {'devices':>8} {'fwd ms':>9} {'bwd ms':>9} {'tp ms':>8} {'p2p ms':>8}"
                f" {'sync ms':>9} {'step ms':>8} {'other ms':>8}")
        rows = [head, "-" * len(head)]
        for i, s in enumerate(self.stages):
            mark = "*" if i == self.bottleneck_stage else " "
            rows.append(
                f"{i:>4}{mark} {f'[{s.start},{s.stop})':>9} {s.kind:>11} {len(s.devices):>8} {s.forward_s * 1e3:>9.2f}"
                f" {s.backward_s * 1e3:>9.2f} {s.tensor_comm_s * 1e3:>8.2f} {s.p2p_s * 1e3:>8.2f} {s.sync_s * 1e3:>9.2f}"
                f" {s.optimizer_s * 1e3:>8.2f} {s.overhead_s * 1e3:>8.2f}"
            )
        extra = [(i, s) for i, s in enumerate(self.stages) if s.recompute_s or s.shard_comm_s]
        for i, s in extra:
            rows.append(f"(stage {i}: + recompute {s.recompute_s * 1e3:.2f} ms, + ZeRO collectives"
                        f" {s.shard_comm_s * 1e3:.2f} ms per micro-batch)")
        if any(s.p2p_latency_s > 0 or s.sync_latency_s > 0 for s in self.stages):
            rows.append("per-message latency (in p2p and sync): " + "; ".join(
                f"stage {i}: p2p {s.p2p_latency_s * 1e3:.2f} ms per micro-batch ({s.p2p_messages} messages per iteration),"
                f" sync {s.sync_latency_s * 1e3:.2f} ms ({s.sync_messages} ring steps)"
                for i, s in enumerate(self.stages) if s.p2p_latency_s > 0 or s.sync_latency_s > 0))
        shared = max(s.sharing for s in self.stages)
        if shared > 1:
            rows.append(f"(the plan's processes share the host's CPU cores: stage seconds up to x{shared:.2f})")
        flush = "" if spec(self.schedule).flushes else f" (no flush: {self.schedule})"
        rows.append(
            f"{self.num_microbatches} micro-batches of {self.microbatch_size}: pipeline{flush} {self.pipeline_s * 1e3:.1f} ms"
            f" + sync {self.sync_s * 1e3:.1f} ms + optimizer step {self.optimizer_s * 1e3:.1f} ms + other per-iteration"
            f" {self.overhead_s * 1e3:.1f} ms = {self.total_s * 1e3:.1f} ms per iteration (* = bottleneck stage)"
        )
        return "\n".join(rows)


def allreduce_seconds(nbytes: float, n: int, bandwidth: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` workers on links of ``bandwidth`` bytes/s (eq. 3)."""
    if n <= 1 or nbytes == 0:
        return 0.0
    return 2.0 * (n - 1) * nbytes / (n * bandwidth)


def slowest_link(cluster: Cluster, devices: tuple[int, ...]) -> float:
    """The lowest bandwidth between any two of ``devices`` (AMP's approximation for a non-uniform group)."""
    return cluster.slowest_link(devices)


def link_latency(profile: TimeProfile, cluster: Cluster, devices: tuple[int, ...] | list[int], kind: str) -> float:
    """``alpha`` of the slowest link among ``devices`` ([Note: per-message latency]): the cluster's latency where
    it gives one, else the profile's measured one of ``kind`` ("allreduce": per ring step, or "p2p"), else 0."""
    if not _has_latency(profile, cluster):
        return 0.0
    group = sorted(set(devices))
    if len(group) < 2:
        return 0.0
    nodes = {cluster.node_of(d) for d in group}
    a = group[0]
    b = next(d for d in group if cluster.node_of(d) != cluster.node_of(a)) if len(nodes) > 1 else group[1]
    given = cluster.latency(a, b)
    if given is not None:
        return given
    return profile.links.latency(kind) if profile.links is not None else 0.0


def _has_latency(profile: TimeProfile, cluster: Cluster) -> bool:
    """Whether anything gives a latency; when nothing does (AMP's model) the latency terms skip their scans of
    device groups, which the throughput search would otherwise pay on every candidate."""
    return profile.links is not None or cluster.intra_node_latency is not None or cluster.inter_node_latency is not None


def link_bandwidth(profile: TimeProfile, bandwidth: float, kind: str) -> float:
    """The cluster's ``bandwidth``, capped by the one the profile measured for ``kind`` ([Note: per-message latency])."""
    measured = profile.links.bandwidth(kind) if profile.links is not None else None
    return bandwidth if measured is None else min(bandwidth, measured)


def _device_times(profile: TimeProfile, cluster: Cluster, device: int, tensor_degree: int, samples: float) -> tuple[np.ndarray, np.ndarray]:
    spec = cluster.devices[device]
    if spec.type in profile.device_types:
        return profile.layer_times(spec.type, tensor_degree, samples)
    fwd, bwd = profile.layer_times(profile.reference_device_type, tensor_degree, samples)
    return fwd / spec.speed, bwd / spec.speed


def stage_layer_costs(
    profile: TimeProfile, cluster: Cluster, group: StagePlan, microbatch_size: int, *, sharing: float = 1.0
) -> LayerCosts:
    """Per-layer seconds of one micro-batch for a stage on ``group``'s devices (the note, first two bullets),
    the compute times multiplied by ``sharing`` (:func:`core_sharing`; 1: the devices run alone).

    Raises:
        ProfileError: if the profile lacks the stage's tensor degree for the devices' type.
    """
    samples = microbatch_size / group.data_degree
    representatives: dict[tuple[str, float], int] = {}
    for d in group.devices:
        representatives.setdefault((cluster.devices[d].type, cluster.devices[d].speed), d)
    times = [_device_times(profile, cluster, d, group.tensor_degree, samples) for d in representatives.values()]
    fwd = np.max([f for f, _ in times], axis=0) * sharing
    bwd = np.max([b for _, b in times], axis=0) * sharing
    t = group.tensor_degree
    if t == 1 or profile.tensor_comm_in_times:
        comm = np.zeros_like(fwd)
    else:
        groups = [group.tensor_group(r) for r in range(group.data_degree)]
        bandwidth = link_bandwidth(profile, min(slowest_link(cluster, g) for g in groups), "allreduce")
        alpha = max(link_latency(profile, cluster, g, "allreduce") for g in groups)
        counts = np.array([sum(layer.tensor_parallel_allreduces) for layer in profile.layers], dtype=float)
        comm = counts * (allreduce_seconds(1.0, t, bandwidth) * samples * profile.activation_bytes() + 2 * (t - 1) * alpha)
    return LayerCosts(fwd, bwd, comm)


def core_sharing(profile: TimeProfile, cluster: Cluster, plan: Plan, stage: StagePlan) -> float:
    """How much slower a stage computes because the plan's processes share a node's CPU cores
    ([Note: devices that share CPU cores]): ``max(1, n / C) / max(1, t / C)``, the largest over its nodes;
    1 when the profile's devices do not share cores.

    Example:
        >>> from hybridplan.profiling.time_profile import LayerInfo, TimingTable
        >>> p = TimeProfile(model="m", layers=(LayerInfo(name="l", activation_bytes_per_sample=0, parameter_bytes=0),),
        ...     timings=(TimingTable(device_type="cpu", tensor_degree=1, micro_batch_size=1, forward_s=(1.0,),
        ...     backward_s=(1.0,)),), host_cores=2)
        >>> plan = Plan.uniform(boundaries=[0, 1], data_degree=4, tensor_degree=1, micro_batch_size=4,
        ...     global_batch_size=16)
        >>> core_sharing(p, Cluster.uniform(1, 4), plan, plan.stages[0])   # 4 processes on 2 cores
        2.0
    """
    cores = profile.host_cores
    if cores is None:
        return 1.0
    busy: dict[int, int] = {}
    for s in plan.stages:
        for d in s.devices:
            busy[cluster.node_of(d)] = busy.get(cluster.node_of(d), 0) + 1
    measured = max(1.0, stage.tensor_degree / cores)
    return max(max(1.0, busy[cluster.node_of(d)] / cores) for d in stage.devices) / measured


def _stage_device_type(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> tuple[str, float]:
    """The profiled type whose costs the stage's slowest device runs, and the speed to divide them by."""
    worst: tuple[str, float] | None = None
    for d in stage.devices:
        spec = cluster.devices[d]
        key = (spec.type, 1.0) if spec.type in profile.device_types else (profile.reference_device_type, spec.speed)
        if worst is None or key[1] < worst[1]:
            worst = key
    if worst is None:
        raise PlanError(f"stage {stage.describe()} has no devices", fix="give every stage at least one device")
    return worst


def optimizer_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan, *, sharing: float = 1.0) -> float:
    """The stage's optimizer step ([Note: the terms AMP leaves out]); 0 if the profile measured none."""
    dtype, speed = _stage_device_type(profile, cluster, stage)
    rate = profile.optimizer_seconds_per_byte(dtype, stage.tensor_degree)
    if rate is None:
        return 0.0
    shards = stage.tensor_degree * (stage.data_degree if stage.zero else 1)
    return rate * parameter_bytes(profile.layers[stage.start : stage.stop]) / shards * sharing / speed


def overhead_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan, microbatch_size: int, *,
                     sharing: float = 1.0) -> float:
    """The stage's per-iteration overhead ([Note: the terms AMP leaves out]); 0 if the profile measured none."""
    dtype, speed = _stage_device_type(profile, cluster, stage)
    samples = microbatch_size / stage.data_degree
    return profile.overhead_seconds(dtype, stage.tensor_degree, samples) * sharing / speed


def _exchange_pairs(sender: StagePlan, receiver: StagePlan) -> list[tuple[int, int]]:
    if (sender.data_degree, sender.tensor_degree) == (receiver.data_degree, receiver.tensor_degree):
        return list(zip(sender.devices, receiver.devices))
    d1, d2 = sender.data_degree, receiver.data_degree
    pairs = []
    for r1 in range(d1):
        for r2 in range(d2):
            if r1 * d2 < (r2 + 1) * d1 and r2 * d1 < (r1 + 1) * d2:  # sample ranges overlap
                pairs += [(a, b) for a in sender.tensor_group(r1) for b in receiver.tensor_group(r2)]
    return pairs


def p2p_seconds(
    profile: TimeProfile, cluster: Cluster, sender: StagePlan, receiver: StagePlan, microbatch_size: int
) -> np.ndarray:
    """``e`` for a boundary after each layer between two consecutive stages, per micro-batch (the note), with
    the per-message latency of both directions ([Note: per-message latency])."""
    pairs = _exchange_pairs(sender, receiver)
    bandwidth = link_bandwidth(profile, min((cluster.bandwidth(a, b) for a, b in pairs), default=float("inf")), "p2p")
    share = max(1.0 / (sender.data_degree * sender.tensor_degree), 1.0 / receiver.data_degree)
    return 2.0 * share * microbatch_size * profile.activation_bytes() / bandwidth + _p2p_latency(profile, cluster, pairs)


def _p2p_latency(profile: TimeProfile, cluster: Cluster, pairs: list[tuple[int, int]]) -> float:
    """``2 alpha`` of the slowest of ``pairs``: a pair across nodes if there is one, else any pair."""
    if not pairs or not _has_latency(profile, cluster):
        return 0.0
    slowest = next((pair for pair in pairs if cluster.node_of(pair[0]) != cluster.node_of(pair[1])), pairs[0])
    return 2.0 * link_latency(profile, cluster, slowest, "p2p")


def p2p_latency_seconds(profile: TimeProfile, cluster: Cluster, sender: StagePlan, receiver: StagePlan) -> float:
    """The latency part of ``e`` per micro-batch: ``2 alpha`` of the slowest exchanging pair ([Note: per-message
    latency]: the messages of one direction are posted together, so their latencies overlap)."""
    return _p2p_latency(profile, cluster, _exchange_pairs(sender, receiver)) if _has_latency(profile, cluster) else 0.0


def p2p_messages(sender: StagePlan, receiver: StagePlan, num_microbatches: int) -> int:
    """Messages across the boundary per iteration, both directions: the transfers runtime/routing.py ``route``
    gives, per micro-batch and direction (the backward routes the same rows back).

    ``route`` sends every rank of the receiving side one message from each replica of the sending side whose rows
    overlap its replica's; the row ranges of ``d1`` and ``d2`` equal parts of a micro-batch overlap in
    ``d1 + d2 - gcd(d1, d2)`` pairs (the parts' ends split it into that many pieces). So ``t2 (d1 + d2 - g)``
    messages forward (``t2``: ranks per receiving replica) and ``t1 (d1 + d2 - g)`` back, counted in closed form
    because ``route`` itself costs ``d1 d2 t2`` steps per call and the throughput search asks often
    (tests/predict/test_time_model.py checks the two agree).
    """
    d1, d2 = sender.data_degree, receiver.data_degree
    overlaps = d1 + d2 - math.gcd(d1, d2)
    return num_microbatches * overlaps * (sender.tensor_degree + receiver.tensor_degree)


def sync_messages(profile: TimeProfile, stage: StagePlan) -> int:
    """Ring steps one rank makes per iteration in the stage's gradient all-reduces: ``C * 2 (d - 1)`` ([Note:
    per-message latency]); 0 without data parallelism or under ZeRO-2/3 (FSDP's collectives, not counted)."""
    if stage.data_degree == 1 or stage.zero in (2, 3):
        return 0
    return parameter_tensors(profile.layers[stage.start : stage.stop]) * 2 * (stage.data_degree - 1)


def _stage_allreduce(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """``A``: the ring all-reduce of the stage's gradient bytes / ``t`` over each tensor rank's data group, the
    slowest (a data group across nodes runs at the inter-node link: :func:`slowest_link`)."""
    d, t = stage.data_degree, stage.tensor_degree
    if d == 1:
        return 0.0
    nbytes = parameter_bytes(profile.layers[stage.start : stage.stop])
    return max(
        allreduce_seconds(nbytes / t, d, link_bandwidth(profile, slowest_link(cluster, stage.data_group(k)), "allreduce"))
        for k in range(t)
    ) + sync_latency_seconds(profile, cluster, stage)


def sync_latency_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """The latency part of the stage's gradient sync: its ring steps times ``alpha`` of its slowest data group."""
    steps = sync_messages(profile, stage)
    if steps == 0 or not _has_latency(profile, cluster):
        return 0.0
    return steps * max(link_latency(profile, cluster, stage.data_group(k), "allreduce") for k in range(stage.tensor_degree))


def sync_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """The stage's data-parallel gradient sync once per iteration, slowest tensor rank (the note, last bullet):
    the all-reduce ``A``, times :data:`ZERO_ITERATION_ALLREDUCES` of its ZeRO level."""
    return ZERO_ITERATION_ALLREDUCES[stage.zero] * _stage_allreduce(profile, cluster, stage)


def shard_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """ZeRO-2/3's collectives per micro-batch: ``A`` times :data:`ZERO_MICROBATCH_ALLREDUCES` ([Note: ZeRO and
    recompute in time]); 0 for the other levels."""
    factor = ZERO_MICROBATCH_ALLREDUCES[stage.zero]
    return factor * _stage_allreduce(profile, cluster, stage) if factor else 0.0


def recompute_seconds(costs: LayerCosts, stage: StagePlan) -> float:
    """The forward seconds a recomputed stage runs again per micro-batch (0 for one that does not recompute)."""
    return float(costs.forward[stage.start : stage.stop].sum()) if stage.recompute == "full" else 0.0


def pipeline_seconds(
    compute_s: np.ndarray | list[float], p2p_s: np.ndarray | list[float], num_microbatches: int, *, flush: bool = True,
    in_flight: int | None = None,
) -> float:
    """``(gas - 1) P + sum t_i + sum e_i`` with ``P = max(max t_i, max e_i / 2)`` (eq. 5 with the p2p-overlap
    note); ``p2p_s`` has one entry (both directions) per boundary. Without a ``flush`` (PipeDream-2BW):
    ``gas P``. ``in_flight``: the micro-batches the first stage may hold at once when fewer than ``gas``
    ([Note: the round trip of 1F1B]): ``P`` is then at least ``(sum t_i + sum e_i) / in_flight``."""
    t = np.asarray(compute_s, dtype=float)
    e = np.asarray(p2p_s, dtype=float)
    steady = max(float(t.max()), float(e.max()) / 2 if e.size else 0.0)
    if in_flight is not None and in_flight < num_microbatches:
        steady = max(steady, (float(t.sum()) + float(e.sum())) / in_flight)
    if not flush:
        return float(num_microbatches * steady)
    return float((num_microbatches - 1) * steady + t.sum() + e.sum())


@functools.lru_cache(maxsize=1024)
def _first_stage_in_flight(schedule: str, num_stages: int, num_microbatches: int) -> int:
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
        ProfileError: if the profile lacks a tensor degree the plan uses.

    Example:
        >>> from hybridplan.profiling.time_profile import LayerInfo, TimingTable
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
    in_flight = _first_stage_in_flight(schedule, plan.num_stages, plan.num_microbatches)
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
