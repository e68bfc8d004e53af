"""What a stage's devices spend computing, per the time model: the layers' forward and backward on the stage's
slowest device (with tensor parallelism's all-reduces inside layers), CPU core sharing, the optimizer step, the
per-iteration overhead and recompute's second forward ([Note: the AMP cost model] and [Note: the terms AMP leaves
out] in predict/time_model.py; recompute: [Note: ZeRO and recompute in time] in predict/communication.py).

[Note: devices that share CPU cores] On the CPU runtime a device is a process and a node's processes share
the host's ``C`` cores (``TimeProfile.host_cores``). Linux's fair scheduler gives each of ``n`` runnable
single-threaded processes ``C / n`` of a core when ``n > C`` (CFS: "an ideal, precise multi-tasking CPU",
Documentation/scheduler/sched-design-CFS.rst), so a stage's compute, step and overhead on a node where
the plan runs ``n`` processes take ``max(1, n / C) / max(1, t / C)`` times the profiled seconds (the
timing run of tensor degree ``t`` itself ran ``t`` processes). It assumes every process of the node is
busy, as in a pipeline's steady state; the fill and drain run fewer, so the factor is an upper bound there.
Profiles of accelerators leave ``host_cores`` null and get factor 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.plan import Cluster, Plan, StagePlan
from hybridplan.predict.communication import allreduce_seconds, link_bandwidth, link_latency, slowest_link
from hybridplan.profiling.layer_info import parameter_bytes
from hybridplan.profiling.time_profile import TimeProfile

__all__ = [
    "LayerCosts",
    "stage_layer_costs",
    "core_sharing",
    "optimizer_rate",
    "optimizer_seconds",
    "overhead_seconds",
    "recompute_seconds",
]


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


def _device_times(profile: TimeProfile, cluster: Cluster, device: int, tensor_degree: int, samples: float) -> tuple[np.ndarray, np.ndarray]:
    spec = cluster.devices[device]
    if spec.type in profile.device_types:
        return profile.layer_times(spec.type, tensor_degree, samples)
    fwd, bwd = profile.layer_times(profile.reference_device_type, tensor_degree, samples)
    return fwd / spec.speed, bwd / spec.speed


def stage_layer_costs(
    profile: TimeProfile, cluster: Cluster, group: StagePlan, microbatch_size: int, *, sharing: float = 1.0
) -> LayerCosts:
    """Per-layer seconds of one micro-batch for a stage on ``group``'s devices ([Note: the AMP cost model], first
    two bullets), the compute times multiplied by ``sharing`` (:func:`core_sharing`; 1: the devices run alone).

    Raises:
        ProfileError: if the profile lacks the stage's tensor degree for the devices' type.
    """
    # kept in the profile (TimeProfile.keep): its layers and options do not enter
    costs: LayerCosts = profile.keep(("layer costs", tuple(group.devices), group.data_degree, group.tensor_degree,
                                      microbatch_size, sharing),
                                     lambda: _stage_layer_costs(profile, cluster, group, microbatch_size, sharing), cluster)
    return costs


def _stage_layer_costs(profile: TimeProfile, cluster: Cluster, group: StagePlan, microbatch_size: int,
                       sharing: float) -> LayerCosts:
    """:func:`stage_layer_costs`, computed (read only)."""
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
    for array in (fwd, bwd, comm):
        array.flags.writeable = False
    return LayerCosts(fwd, bwd, comm)


def core_sharing(profile: TimeProfile, cluster: Cluster, plan: Plan, stage: StagePlan) -> float:
    """How much slower a stage computes because the plan's processes share a node's CPU cores
    ([Note: devices that share CPU cores]): ``max(1, n / C) / max(1, t / C)``, the largest over its nodes;
    1 when the profile's devices do not share cores.

    Example:
        >>> from hybridplan.profiling.layer_info import LayerInfo
        >>> from hybridplan.profiling.timing_table import TimingTable
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
    """The profiled type whose costs the stage's slowest device runs, and the speed to divide them by; kept in the
    profile by the stage's devices (asked for every stage the search times)."""
    found: tuple[str, float] = profile.keep(("device type", tuple(stage.devices)),
                                            lambda: _slowest_type(profile, cluster, stage), cluster)
    return found


def _slowest_type(profile: TimeProfile, cluster: Cluster, stage: StagePlan) -> tuple[str, float]:
    """:func:`_stage_device_type`, computed."""
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
    return optimizer_rate(profile, cluster, stage, sharing=sharing) * parameter_bytes(profile.layers[stage.start : stage.stop])


def optimizer_rate(profile: TimeProfile, cluster: Cluster, stage: StagePlan, *, sharing: float = 1.0) -> float:
    """The stage's optimizer step in seconds per parameter byte of its layers (the stage's layers do not enter:
    its devices, tensor degree and ZeRO level do): the profile's measured rate on its device type over the shards
    one device steps (a tensor shard; under ZeRO each replica's share); 0 if the profile measured none."""
    dtype, speed = _stage_device_type(profile, cluster, stage)
    rate = profile.optimizer_seconds_per_byte(dtype, stage.tensor_degree)
    if rate is None:
        return 0.0
    shards = stage.tensor_degree * (stage.data_degree if stage.zero else 1)
    return rate / shards * sharing / speed


def overhead_seconds(profile: TimeProfile, cluster: Cluster, stage: StagePlan, microbatch_size: int, *,
                     sharing: float = 1.0) -> float:
    """The stage's per-iteration overhead ([Note: the terms AMP leaves out]); 0 if the profile measured none."""
    dtype, speed = _stage_device_type(profile, cluster, stage)
    samples = microbatch_size / stage.data_degree
    return profile.overhead_seconds(dtype, stage.tensor_degree, samples) * sharing / speed


def recompute_seconds(costs: LayerCosts, stage: StagePlan) -> float:
    """The forward seconds a recomputed stage runs again per micro-batch (0 for one that does not recompute)."""
    return float(costs.forward[stage.start : stage.stop].sum()) if stage.recompute == "full" else 0.0
