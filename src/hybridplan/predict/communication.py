"""The communication terms of the time model: links, ring all-reduces, pipeline transfers, gradient sync, ZeRO.

Bandwidth terms follow AMP (eq. 3 and ``e = v / b``, [Note: the AMP cost model] in predict/time_model.py);
every message also pays a latency ([Note: per-message latency]); ZeRO's collectives are counted in units of
the stage's gradient all-reduce ([Note: ZeRO and recompute in time]).

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

[Note: ZeRO and recompute in time] (issue 11: a plan stage's ``"zero"`` and ``"recompute"`` keys)

- Recompute (``"recompute": "full"``, :func:`~hybridplan.predict.stage_compute.recompute_seconds`): every layer of the stage is checkpointed (torch.utils.checkpoint,
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
  updates ``1/d`` of the stage's parameters ([Note: the terms AMP leaves out] in predict/time_model.py).
"""

from __future__ import annotations

import math

import numpy as np

from hybridplan.plan import Cluster, StagePlan
from hybridplan.profiling.layer_info import parameter_bytes, parameter_tensors
from hybridplan.profiling.time_profile import TimeProfile

__all__ = [
    "ZERO_ITERATION_ALLREDUCES",
    "ZERO_MICROBATCH_ALLREDUCES",
    "allreduce_seconds",
    "slowest_link",
    "link_latency",
    "link_bandwidth",
    "p2p_seconds",
    "p2p_latency_seconds",
    "p2p_messages",
    "sync_messages",
    "sync_latency_seconds",
    "sync_latency_per_tensor",
    "sync_seconds",
    "shard_seconds",
]

ZERO_ITERATION_ALLREDUCES: dict[int, float] = {0: 1.0, 1: 1.5, 2: 0.0, 3: 0.0}
"""Gradient all-reduces ``A`` a data stage's group pays once per iteration, by ZeRO level ([Note: ZeRO and
recompute in time]: 0 the plain all-reduce; 1 + the ZeroRedundancyOptimizer's broadcast of the updated shares,
half an all-reduce; 2 and 3 reduce every micro-batch instead)."""

ZERO_MICROBATCH_ALLREDUCES: dict[int, float] = {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.5}
"""All-reduce equivalents ``A`` a data stage's group pays per micro-batch, by ZeRO level (FSDP2: ZeRO-2 an
all-gather and a reduce-scatter, ZeRO-3 one more all-gather; ZeRO paper section 7, runtime/sharding.py)."""


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
    """``e`` for a boundary after each layer between two consecutive stages, per micro-batch ([Note: the AMP cost
    model]), with the per-message latency of both directions ([Note: per-message latency]). Kept in the profile by
    the two stages' devices and degrees (what enters; read-only): a throughput search times each boundary under
    every cut and stage option."""
    def make() -> np.ndarray:
        seconds = _p2p_seconds(profile, cluster, sender, receiver, microbatch_size)
        seconds.setflags(write=False)
        return seconds

    out: np.ndarray = profile.keep(("p2p", tuple(sender.devices), sender.data_degree, sender.tensor_degree,
                                    tuple(receiver.devices), receiver.data_degree, receiver.tensor_degree,
                                    microbatch_size), make, cluster)
    return out


def _p2p_seconds(profile: TimeProfile, cluster: Cluster, sender: StagePlan, receiver: StagePlan,
                 microbatch_size: int) -> np.ndarray:
    """:func:`p2p_seconds`, computed."""
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
    return parameter_tensors(profile.layers[stage.start : stage.stop]) * _ring_steps(stage)


def _ring_steps(stage: StagePlan) -> int:
    """Ring steps of one parameter tensor's gradient all-reduce: ``2 (d - 1)``; 0 where :func:`sync_messages`
    counts none (no data parallelism, ZeRO-2/3)."""
    return 0 if stage.data_degree == 1 or stage.zero in (2, 3) else 2 * (stage.data_degree - 1)


def _stage_allreduce(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """``A``: the ring all-reduce of the stage's gradient bytes / ``t`` over each tensor rank's data group, the
    slowest (a data group across nodes runs at the inter-node link: :func:`slowest_link`). Kept in the profile as
    predict/stage_compute.py keeps a stage's layer costs (a throughput search times each stage under every stage
    option: Llama-3-70B on 32x8 asked 124,391 times), by what enters: its layers, devices, degrees and ZeRO level
    (:func:`sync_messages` counts no ring step under ZeRO-2/3)."""
    if stage.data_degree == 1:
        return 0.0
    seconds: float = profile.keep(("allreduce", stage.start, stage.stop, tuple(stage.devices), stage.data_degree,
                                   stage.tensor_degree, stage.zero), lambda: _allreduce_of(profile, cluster, stage),
                                  cluster)
    return seconds


def _allreduce_of(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """:func:`_stage_allreduce`, computed."""
    d, t = stage.data_degree, stage.tensor_degree
    nbytes = parameter_bytes(profile.layers[stage.start : stage.stop])
    return max(
        allreduce_seconds(nbytes / t, d, link_bandwidth(profile, slowest_link(cluster, stage.data_group(k)), "allreduce"))
        for k in range(t)
    ) + sync_latency_seconds(profile, cluster, stage)


def sync_latency_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """The latency part of the stage's gradient sync: its ring steps times ``alpha`` of its slowest data group."""
    steps = sync_messages(profile, stage)
    return steps * _sync_alpha(profile, cluster, stage) if steps else 0.0


def sync_latency_per_tensor(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """What each parameter tensor of the stage adds to :func:`sync_latency_seconds`: ``2 (d - 1) alpha``
    (0 where it counts no step or nothing gives a latency). It reads the stage's devices, degrees and ZeRO
    level, not its layers: the stage-cut search prices every range of layers with it
    (search/time/strategy_cut.py ``assign_layers``)."""
    steps = _ring_steps(stage)
    return steps * _sync_alpha(profile, cluster, stage) if steps else 0.0


def _sync_alpha(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """``alpha`` of one ring step of the stage's gradient all-reduce: its slowest data group's (0 where nothing
    gives a latency, without scanning the groups)."""
    if not _has_latency(profile, cluster):
        return 0.0
    return max(link_latency(profile, cluster, stage.data_group(k), "allreduce") for k in range(stage.tensor_degree))


def sync_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """The stage's data-parallel gradient sync once per iteration, slowest tensor rank ([Note: the AMP cost
    model], last bullet): the all-reduce ``A``, times :data:`ZERO_ITERATION_ALLREDUCES` of its ZeRO level."""
    return ZERO_ITERATION_ALLREDUCES[stage.zero] * _stage_allreduce(profile, cluster, stage)


def shard_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> float:
    """ZeRO-2/3's collectives per micro-batch: ``A`` times :data:`ZERO_MICROBATCH_ALLREDUCES` ([Note: ZeRO and
    recompute in time]); 0 for the other levels."""
    factor = ZERO_MICROBATCH_ALLREDUCES[stage.zero]
    return factor * _stage_allreduce(profile, cluster, stage) if factor else 0.0
