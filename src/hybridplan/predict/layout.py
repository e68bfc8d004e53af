"""The shape of a plan as the throughput model sees it: stages of ``data_degree x tensor_degree`` devices.

A :class:`hybridplan.plan.Plan` gives every stage ONE kind (none, data or tensor). AMP's uniform strategies
(seed 002 section 3.3) give every stage ``dp x tp`` devices, both degrees at once. A :class:`Layout` holds
either: a stage is a :class:`DeviceGroup` of ``data_degree`` replicas, each a tensor-parallel group of
``tensor_degree`` devices, listed replica-major (``devices[r * tensor_degree + k]`` is tensor rank ``k`` of
replica ``r``; the rank order of Megatron and of AMP's data, "tp fastest, then dp").

Micro-batches follow the Plan's convention: ``microbatch_size`` samples enter the pipeline per micro-batch and
a stage's replicas split them ``data_degree`` ways. AMP's ``(pp, dp, tp, mbs)`` with a global batch ``gbs`` is
the layout with ``microbatch_size = dp * mbs`` and ``num_microbatches = gbs / (dp * mbs)`` (:meth:`Layout.uniform`):
each device then sees ``mbs`` samples per micro-batch, as in AMP's ``dp`` independent pipelines.

Only layouts whose stages have ``data_degree == 1 or tensor_degree == 1`` convert to a Plan
(:meth:`Layout.to_plan`); the others are for evaluating AMP's own strategies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybridplan.errors import PlanError
from hybridplan.plan import Plan, StagePlan

if TYPE_CHECKING:
    from hybridplan.cluster import Cluster

__all__ = ["DeviceGroup", "StageLayout", "Layout"]


@dataclass(frozen=True)
class DeviceGroup:
    """The devices of one stage: ``data_degree`` replicas of ``tensor_degree`` devices, replica-major."""

    devices: tuple[int, ...]
    data_degree: int = 1
    tensor_degree: int = 1

    def __post_init__(self) -> None:
        if self.data_degree < 1 or self.tensor_degree < 1:
            raise PlanError(f"degrees must be >= 1, got data {self.data_degree}, tensor {self.tensor_degree}")
        if len(self.devices) != self.data_degree * self.tensor_degree:
            raise PlanError(
                f"a stage of data degree {self.data_degree} x tensor degree {self.tensor_degree} needs"
                f" {self.data_degree * self.tensor_degree} devices, got {len(self.devices)}: {list(self.devices)}"
            )

    @property
    def size(self) -> int:
        """Devices in the group."""
        return len(self.devices)

    def replica(self, r: int) -> tuple[int, ...]:
        """The tensor-parallel group of replica ``r``."""
        t = self.tensor_degree
        return self.devices[r * t : (r + 1) * t]

    def data_group(self, k: int) -> tuple[int, ...]:
        """The devices of tensor rank ``k`` in every replica: one data-parallel all-reduce group."""
        return self.devices[k :: self.tensor_degree]

    @property
    def kind(self) -> str:
        """``none``, ``data``, ``tensor`` or ``data+tensor``."""
        kinds = [k for k, deg in (("data", self.data_degree), ("tensor", self.tensor_degree)) if deg > 1]
        return "+".join(kinds) or "none"


@dataclass(frozen=True)
class StageLayout:
    """Layers ``[start, stop)`` on a :class:`DeviceGroup`."""

    start: int
    stop: int
    group: DeviceGroup

    @property
    def devices(self) -> tuple[int, ...]:
        """The stage's devices, replica-major."""
        return self.group.devices

    @property
    def data_degree(self) -> int:
        """Replicas splitting each micro-batch."""
        return self.group.data_degree

    @property
    def tensor_degree(self) -> int:
        """Devices splitting each layer."""
        return self.group.tensor_degree


@dataclass(frozen=True)
class Layout:
    """Stages in pipeline order, the micro-batch size and how many micro-batches make an iteration."""

    stages: tuple[StageLayout, ...]
    microbatch_size: int
    num_microbatches: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise PlanError("a layout needs at least one stage")
        if self.microbatch_size < 1 or self.num_microbatches < 1:
            raise PlanError(
                f"micro-batch size and count must be >= 1, got {self.microbatch_size} and {self.num_microbatches}"
            )
        expected = 0
        for i, s in enumerate(self.stages):
            if s.start != expected or s.stop <= s.start:
                raise PlanError(
                    f"stage {i} covers layers [{s.start}, {s.stop}) but must start at layer {expected} and be non-empty",
                    fix="stages cover every layer once, in order",
                )
            expected = s.stop
            if self.microbatch_size % s.data_degree:
                raise PlanError(
                    f"stage {i}: data degree {s.data_degree} does not divide the micro-batch size {self.microbatch_size}",
                    fix="choose a micro-batch size divisible by every data degree",
                )
        used = [d for s in self.stages for d in s.devices]
        if len(set(used)) != len(used):
            raise PlanError(f"a device is used by two stages: {sorted(d for d in set(used) if used.count(d) > 1)}")

    @property
    def num_layers(self) -> int:
        """Layers covered."""
        return self.stages[-1].stop

    @property
    def global_batch_size(self) -> int:
        """Samples per iteration."""
        return self.microbatch_size * self.num_microbatches

    @property
    def boundaries(self) -> tuple[int, ...]:
        """``(0, stop_0, stop_1, ..., num_layers)``: AMP's and DeepSpeed's partition form."""
        return (0,) + tuple(s.stop for s in self.stages)

    def check_fits(self, num_layers: int, cluster: Cluster) -> None:
        """Raise :class:`PlanError` unless the layout covers ``num_layers`` and uses only cluster devices."""
        if self.num_layers != num_layers:
            raise PlanError(
                f"the stages cover layers [0, {self.num_layers}) but the profile has {num_layers} layers",
                fix=f"the last stage must stop at layer {num_layers}",
            )
        bad = [d for s in self.stages for d in s.devices if not 0 <= d < cluster.num_devices]
        if bad:
            raise PlanError(
                f"device(s) {bad} do not exist on cluster {cluster.shape} (devices 0..{cluster.num_devices - 1})",
                fix="use device indices of the cluster, or a larger cluster",
            )

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_plan(cls, plan: Plan) -> Layout:
        """The layout of a Plan: a "data" stage splits the micro-batch, a "tensor" stage splits its layers."""
        stages = []
        for s in plan.stages:
            d = s.degree if s.kind == "data" else 1
            t = s.degree if s.kind == "tensor" else 1
            stages.append(StageLayout(s.start, s.stop, DeviceGroup(tuple(s.devices), d, t)))
        return cls(tuple(stages), plan.microbatch_size, plan.num_microbatches)

    @classmethod
    def uniform(
        cls,
        *,
        boundaries: Sequence[int],
        data_degree: int,
        tensor_degree: int,
        micro_batch_size: int,
        global_batch_size: int,
        devices: Sequence[int] | None = None,
    ) -> Layout:
        """AMP's strategy ``(pp, dp, tp, mbs)`` with partition ``boundaries`` (``pp + 1`` cut points).

        Args:
            boundaries: ``[0, b_1, ..., num_layers]``; stage ``k`` holds layers ``[b_k, b_{k+1})``.
            data_degree: dp, pipelines running side by side.
            tensor_degree: tp, devices splitting each layer.
            micro_batch_size: AMP's mbs, samples per micro-batch of ONE pipeline replica.
            global_batch_size: samples per iteration over all replicas.
            devices: device of each virtual rank (rank = stage * dp * tp + replica * tp + tensor rank);
                default: rank ``i`` on device ``i`` (Megatron's placement: tensor groups inside a node first).

        Raises:
            PlanError: if the batch does not split into whole micro-batches.
        """
        pp, dp, tp = len(boundaries) - 1, data_degree, tensor_degree
        if pp < 1:
            raise PlanError(f"boundaries must hold at least two cut points, got {list(boundaries)}")
        per_iteration = dp * micro_batch_size
        if micro_batch_size < 1 or global_batch_size % per_iteration:
            raise PlanError(
                f"global batch {global_batch_size} does not split into micro-batches of {micro_batch_size} on {dp} replicas",
                fix="choose a micro-batch size dividing global batch / data degree",
            )
        ranks = tuple(range(pp * dp * tp)) if devices is None else tuple(devices)
        if len(ranks) != pp * dp * tp:
            raise PlanError(f"{pp} x {dp} x {tp} ranks need {pp * dp * tp} devices, got {len(ranks)}")
        size = dp * tp
        stages = tuple(
            StageLayout(boundaries[k], boundaries[k + 1], DeviceGroup(ranks[k * size : (k + 1) * size], dp, tp))
            for k in range(pp)
        )
        return cls(stages, per_iteration, global_batch_size // per_iteration)

    def to_plan(self, *, schedule: str = "1f1b", extra: Mapping[str, Any] | None = None) -> Plan:
        """The layout as a Plan.

        Raises:
            PlanError: if a stage is both data- and tensor-parallel, which a Plan stage cannot express.
        """
        stages = []
        for i, s in enumerate(self.stages):
            kind = s.group.kind
            if kind == "data+tensor":
                raise PlanError(
                    f"stage {i} is data-parallel x{s.data_degree} AND tensor-parallel x{s.tensor_degree};"
                    " a Plan stage has one kind",
                    fix="use layouts with data_degree == 1 or tensor_degree == 1 per stage",
                )
            stages.append(StagePlan(s.start, s.stop, kind, s.group.size, s.devices))
        return Plan(schedule, self.global_batch_size, self.num_microbatches, tuple(stages), dict(extra or {}))
