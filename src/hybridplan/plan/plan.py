"""The plan: pipeline stages, each on ``data_degree x tensor_degree`` devices; its JSON form and its rules.

ONE plan type serves every stage of the data flow: the searches write it, the predictors and the cost
model read it, the runtime runs it. The JSON form (other tools rely on exactly these keys; extra keys are
kept)::

    {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8,
     "stages": [
       {"layers": [0, 3],  "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
       {"layers": [3, 7],  "parallelism": "none",   "degree": 1, "devices": [2]},
       {"layers": [7, 10], "parallelism": "data",   "degree": 1, "devices": [3]}]}

``layers`` is half-open ``[start, stop)`` over the model's layers; ``devices`` are global device
indices (node = index // devices per node). ``parallelism`` is "none", "data", "tensor" or
"data+tensor"; a "data+tensor" stage also gives ``tensor_degree``, which divides ``degree``: its data
degree is ``degree / tensor_degree`` and its devices are listed tensor-fastest (``devices[0:t]`` is the
first tensor group, the rank order of Megatron-LM and AMP). So every stage has a data degree (replicas
that split each micro-batch) and a tensor degree (devices that split each layer):

=============  ===========  =============
parallelism    data degree  tensor degree
=============  ===========  =============
none           1            1
data           degree       1
tensor         1            degree
data+tensor    degree / t   t
=============  ===========  =============

Micro-batches: ``global_batch_size / num_microbatches`` samples enter the pipeline per micro-batch, and a
stage's replicas split them ``data_degree`` ways. AMP's strategy ``(pp, dp, tp, mbs)`` is the plan of
:meth:`Plan.uniform` with micro-batches of ``dp * mbs`` samples: each device sees ``mbs``.

The rules (:meth:`Plan.validate`):

- stages cover every layer once, in order: the first starts at 0, each starts where the previous
  stopped, the last stops at the model's layer count;
- "none" has degree 1; ``len(devices) == degree``; the data degree divides the micro-batch size;
  ``zero`` (ZeRO sharding: 0, 1 optimizer state, 2 + gradients, 3 + parameters) needs a data degree above 1;
  ``recompute`` is "none" or "full" (activation checkpointing of every layer of the stage);
- every device of the cluster belongs to exactly one stage, and a tensor-parallel group never spans
  nodes; a stage's data-parallel replicas may (CAPTURE's plan space, seed 000 III-C, keeps whole stages on
  one node: that is a rule of its search, search/memory/space.py, not of plans);
- the global batch splits into ``num_microbatches`` equal micro-batches;
- every layer of a tensor-parallel stage supports tensor parallelism at that degree.

:meth:`Plan.check_fits` checks only what the cost model needs (coverage, existing devices): AMP's plans
may place a stage's replicas on several nodes. This module imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from hybridplan.errors import PlanError
from hybridplan.plan.schedule import SCHEDULES, Schedule, as_schedule

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel
    from hybridplan.plan.cluster import Cluster

__all__ = ["SCHEDULES", "PARALLELISMS", "Parallelism", "RECOMPUTES", "Recompute", "ZERO_STAGES", "StagePlan", "Plan"]

Parallelism = Literal["none", "data", "tensor", "data+tensor"]
"""How a stage's devices share its work."""

PARALLELISMS: tuple[Parallelism, ...] = get_args(Parallelism)
"""Per-stage parallelism kinds."""

Recompute = Literal["none", "full"]
"""Activation recompute of a stage: none, or every layer checkpointed (its inputs kept, the rest recomputed)."""

RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
"""ZeRO sharding over a stage's data-parallel group: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters
(Rajbhandari et al., SC 2020; FSDP's FULL_SHARD is 3)."""

_STAGE_KEYS = ("layers", "parallelism", "degree", "devices")
_OPTIONAL_STAGE_KEYS = ("tensor_degree", "zero", "recompute")
_PLAN_KEYS = ("schedule", "global_batch_size", "num_microbatches", "stages")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: layers ``[start, stop)`` run with ``parallelism`` on ``devices``.

    ``tensor_degree`` is the devices that split each layer; it is derived from ``parallelism`` and
    ``degree`` (``degree`` for "tensor", 1 for "none" and "data") and must be given only for "data+tensor".

    Raises:
        PlanError: for an unknown parallelism, or a tensor degree that does not go with it.
    """

    start: int
    stop: int
    parallelism: Parallelism
    degree: int
    devices: tuple[int, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    tensor_degree: int = 0
    """Devices splitting each layer (0 when constructing: derived from ``parallelism``)."""
    zero: int = 0
    """ZeRO sharding over the data-parallel group (:data:`ZERO_STAGES`); only for a data degree above 1."""
    recompute: Recompute = "none"
    """Activation recompute of every layer of the stage ("full"), or none."""

    def __post_init__(self) -> None:
        if isinstance(self.zero, bool) or self.zero not in ZERO_STAGES:
            raise PlanError(f"zero must be one of {list(ZERO_STAGES)}, got {self.zero!r}",
                            fix="0: no sharding; 1: optimizer state; 2: + gradients; 3: + parameters (FSDP)")
        if self.recompute not in RECOMPUTES:
            raise PlanError(f"unknown recompute {self.recompute!r}", fix=f"use one of {list(RECOMPUTES)}")
        if self.parallelism not in PARALLELISMS:
            raise PlanError(f"unknown parallelism {self.parallelism!r}", fix=f"use one of {list(PARALLELISMS)}")
        derived = {"none": 1, "data": 1, "tensor": self.degree}.get(self.parallelism)
        if derived is not None:
            if self.tensor_degree not in (0, derived):
                raise PlanError(f"tensor_degree {self.tensor_degree} does not go with parallelism {self.parallelism!r}",
                                fix="give tensor_degree only for 'data+tensor' stages")
            object.__setattr__(self, "tensor_degree", derived)
            return
        t = self.tensor_degree
        if t < 1 or self.degree < 1 or self.degree % t:
            raise PlanError(
                f"a 'data+tensor' stage needs a tensor_degree dividing its degree {self.degree}, got {t or 'none'}",
                fix='e.g. "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2 (2 replicas of 2 devices)',
            )

    @classmethod
    def of(cls, start: int, stop: int, devices: Sequence[int], *, data_degree: int = 1, tensor_degree: int = 1,
           zero: int = 0, recompute: Recompute = "none", extra: Mapping[str, Any] | None = None) -> StagePlan:
        """The stage of ``data_degree`` replicas of ``tensor_degree`` devices each (``devices`` tensor-fastest),
        labelled with the simplest parallelism that says so."""
        kind: Parallelism = ("data+tensor" if data_degree > 1 and tensor_degree > 1 else "tensor" if tensor_degree > 1
                             else "data" if data_degree > 1 else "none")
        return cls(start, stop, kind, data_degree * tensor_degree, tuple(devices), dict(extra or {}),
                   tensor_degree if kind == "data+tensor" else 0, zero, recompute)

    @property
    def layers(self) -> range:
        """The stage's layer indices."""
        return range(self.start, self.stop)

    @property
    def num_layers(self) -> int:
        """How many layers the stage holds."""
        return self.stop - self.start

    @property
    def data_degree(self) -> int:
        """Replicas splitting each micro-batch."""
        return self.degree // self.tensor_degree if self.tensor_degree else self.degree

    @property
    def kind(self) -> Parallelism:
        """What the stage computes, whatever its label: "none" for one device, "data" x1 x "tensor" x2 is "tensor"."""
        d, t = self.data_degree, self.tensor_degree
        return "data+tensor" if d > 1 and t > 1 else "tensor" if t > 1 else "data" if d > 1 else "none"

    def tensor_group(self, replica: int) -> tuple[int, ...]:
        """The devices of replica ``replica``: one tensor-parallel group."""
        t = self.tensor_degree
        return self.devices[replica * t : (replica + 1) * t]

    def data_group(self, tensor_rank: int) -> tuple[int, ...]:
        """The devices of tensor rank ``tensor_rank`` in every replica: one data-parallel all-reduce group."""
        return self.devices[tensor_rank :: self.tensor_degree]

    def describe(self) -> str:
        """E.g. ``layers [3, 7) tensor x2 on devices [2, 3]``."""
        how = (f"data x{self.data_degree} + tensor x{self.tensor_degree}" if self.parallelism == "data+tensor"
               else f"{self.parallelism} x{self.degree}")
        if self.zero:
            how += f" ZeRO-{self.zero}"
        if self.recompute != "none":
            how += f" recompute {self.recompute}"
        return f"layers [{self.start}, {self.stop}) {how} on devices {list(self.devices)}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the stage."""
        out: dict[str, Any] = {
            "layers": [self.start, self.stop],
            "parallelism": self.parallelism,
            "degree": self.degree,
        }
        if self.parallelism == "data+tensor":
            out["tensor_degree"] = self.tensor_degree
        if self.zero:
            out["zero"] = self.zero
        if self.recompute != "none":
            out["recompute"] = self.recompute
        out["devices"] = list(self.devices)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Any, index: int) -> StagePlan:
        """Parse one stage, checking keys and types."""
        where = f"stage {index}"
        if not isinstance(data, Mapping):
            raise PlanError(f"{where} must be an object with keys {list(_STAGE_KEYS)}, got {data!r}")
        missing = [k for k in _STAGE_KEYS if k not in data]
        if missing:
            raise PlanError(f"{where} lacks key(s) {missing}", fix=f"every stage needs {list(_STAGE_KEYS)}")
        layers = data["layers"]
        if (
            not isinstance(layers, Sequence)
            or isinstance(layers, str)
            or len(layers) != 2
            or not all(_is_int(v) for v in layers)
        ):
            raise PlanError(
                f"{where}: 'layers' must be [start, stop) as two integers, got {layers!r}",
                fix='write e.g. "layers": [0, 3] for layers 0, 1 and 2',
            )
        if not isinstance(data["parallelism"], str):
            raise PlanError(f"{where}: 'parallelism' must be one of {list(PARALLELISMS)}, got {data['parallelism']!r}")
        if not _is_int(data["degree"]):
            raise PlanError(f"{where}: 'degree' must be an integer, got {data['degree']!r}")
        tensor = data.get("tensor_degree", 0)
        if not _is_int(tensor):
            raise PlanError(f"{where}: 'tensor_degree' must be an integer, got {tensor!r}")
        zero, recompute = data.get("zero", 0), data.get("recompute", "none")
        if not _is_int(zero):
            raise PlanError(f"{where}: 'zero' must be an integer (0 to 3), got {zero!r}")
        if not isinstance(recompute, str):
            raise PlanError(f"{where}: 'recompute' must be one of {list(RECOMPUTES)}, got {recompute!r}")
        devices = data["devices"]
        if not isinstance(devices, Sequence) or isinstance(devices, str) or not all(_is_int(d) for d in devices):
            raise PlanError(f"{where}: 'devices' must be a list of device indices, got {devices!r}")
        extra = {k: v for k, v in data.items() if k not in _STAGE_KEYS + _OPTIONAL_STAGE_KEYS}
        try:
            return cls(int(layers[0]), int(layers[1]), cast(Parallelism, data["parallelism"]), int(data["degree"]),
                       tuple(int(d) for d in devices), extra, int(tensor), int(zero), cast(Recompute, recompute))
        except PlanError as e:
            raise PlanError(f"{where}: {e.message}", fix=e.fix) from None


@dataclass(frozen=True)
class Plan:
    """A full plan: schedule, batch, and the pipeline stages in order.

    Raises:
        PlanError: for an unknown schedule.
    """

    schedule: Schedule
    global_batch_size: int
    num_microbatches: int
    stages: tuple[StagePlan, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        as_schedule(self.schedule)

    # ------------------------------------------------------------------ derived
    @property
    def microbatch_size(self) -> int:
        """Samples per micro-batch (global batch / micro-batches)."""
        return self.global_batch_size // self.num_microbatches

    @property
    def num_layers(self) -> int:
        """Layers covered (the last stage's stop)."""
        return self.stages[-1].stop if self.stages else 0

    @property
    def num_stages(self) -> int:
        """Pipeline depth."""
        return len(self.stages)

    @property
    def num_devices(self) -> int:
        """Devices used (sum of degrees)."""
        return sum(s.degree for s in self.stages)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """``(0, stop_0, stop_1, ..., num_layers)``: AMP's and DeepSpeed's partition form."""
        return (0,) + tuple(s.stop for s in self.stages)

    def stage_of_device(self, device: int) -> int:
        """Index of the stage that runs on ``device``.

        Raises:
            PlanError: if no stage uses the device.
        """
        for i, s in enumerate(self.stages):
            if device in s.devices:
                return i
        raise PlanError(f"device {device} is not used by any stage of the plan")

    def describe(self) -> str:
        """Multi-line summary for terminals."""
        head = (
            f"schedule {self.schedule}, global batch {self.global_batch_size}, "
            f"{self.num_microbatches} micro-batches of {self.microbatch_size}"
        )
        return "\n".join([head] + [f"  stage {i}: {s.describe()}" for i, s in enumerate(self.stages)])

    def with_extra(self, **extra: Any) -> Plan:
        """The same plan with more extra keys (annotations such as the predicted peak)."""
        return replace(self, extra={**self.extra, **extra})

    # ------------------------------------------------------------------ construction
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
        schedule: Schedule = "1f1b",
        extra: Mapping[str, Any] | None = None,
    ) -> Plan:
        """AMP's strategy ``(pp, dp, tp, mbs)`` with partition ``boundaries`` (``pp + 1`` cut points).

        Args:
            boundaries: ``[0, b_1, ..., num_layers]``; stage ``k`` holds layers ``[b_k, b_{k+1})``.
            data_degree: dp, pipelines running side by side.
            tensor_degree: tp, devices splitting each layer.
            micro_batch_size: AMP's mbs, samples per micro-batch of ONE pipeline replica.
            global_batch_size: samples per iteration over all replicas.
            devices: device of each virtual rank (rank = stage * dp * tp + replica * tp + tensor rank);
                default: rank ``i`` on device ``i`` (Megatron's placement: tensor groups inside a node first).
            schedule: the pipeline schedule.
            extra: annotations kept with the plan.

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
        stages = tuple(StagePlan.of(boundaries[k], boundaries[k + 1], ranks[k * size : (k + 1) * size],
                                    data_degree=dp, tensor_degree=tp) for k in range(pp))
        return cls(schedule, global_batch_size, global_batch_size // per_iteration, stages, dict(extra or {}))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        out: dict[str, Any] = {
            "schedule": self.schedule,
            "global_batch_size": self.global_batch_size,
            "num_microbatches": self.num_microbatches,
            "stages": [s.to_dict() for s in self.stages],
        }
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        """Indented JSON, one stage per line."""
        stages = ",\n    ".join(json.dumps(s.to_dict()) for s in self.stages)
        head = {k: v for k, v in self.to_dict().items() if k != "stages"}
        body = json.dumps(head)[:-1]
        return f'{body},\n  "stages": [\n    {stages}]}}\n'

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Parse and structurally check a plan mapping (call :meth:`validate` for the full rules)."""
        if not isinstance(data, Mapping):
            raise PlanError(f"a plan must be a JSON object with keys {list(_PLAN_KEYS)}, got {type(data).__name__}")
        missing = [k for k in _PLAN_KEYS if k not in data]
        if missing:
            raise PlanError(f"plan lacks key(s) {missing}", fix=f"a plan needs {list(_PLAN_KEYS)}")
        for key in ("global_batch_size", "num_microbatches"):
            if not _is_int(data[key]):
                raise PlanError(f"plan '{key}' must be an integer, got {data[key]!r}")
        stages = data["stages"]
        if not isinstance(stages, Sequence) or isinstance(stages, str) or not stages:
            raise PlanError("plan 'stages' must be a non-empty list of stages")
        extra = {k: v for k, v in data.items() if k not in _PLAN_KEYS}
        return cls(
            schedule=as_schedule(data["schedule"]),
            global_batch_size=int(data["global_batch_size"]),
            num_microbatches=int(data["num_microbatches"]),
            stages=tuple(StagePlan.from_dict(s, i) for i, s in enumerate(stages)),
            extra=extra,
        )

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file.

        Raises:
            PlanError: if the file is missing, not JSON, or structurally malformed.
        """
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise PlanError(f"plan file {str(p)!r} does not exist", fix="check the path, or create one with 'hybridplan plan'") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlanError(f"plan file {str(p)!r} cannot be read: {getattr(e, 'strerror', None) or e}",
                            fix="give a plan JSON file (format: hybridplan/plan/plan.py)") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan file {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON."""
        Path(path).write_text(self.to_json())

    # ------------------------------------------------------------------ rules
    def validate(
        self,
        *,
        num_layers: int | None = None,
        cluster: Cluster | None = None,
        model: LayeredModel | None = None,
    ) -> None:
        """Check every rule of the plan space (module docstring) that the given context allows.

        Args:
            num_layers: the model's layer count (taken from ``model`` when given).
            cluster: the mesh the plan must fill exactly.
            model: the model, to check tensor-parallel support of tensor stages' layers.

        Raises:
            PlanError: naming the first broken rule, the bad value and the fix.
        """
        self._validate_batch()
        if model is not None:
            num_layers = model.num_layers
        self._validate_layers(num_layers)
        self._validate_stage_kinds()
        self._validate_devices(cluster)
        if model is not None:
            g = model.sample_granularity
            for i, s in enumerate(self.stages):
                rows = self.microbatch_size // s.data_degree
                if rows % g:
                    raise PlanError(
                        f"stage {i} ({s.describe()}) would process {rows} samples per micro-batch on each device,"
                        f" but {model.name} needs a multiple of {g}",
                        fix=f"choose a global batch and micro-batch count giving micro-batches (and data-parallel shards) of a multiple of {g} samples",
                    )
                if s.tensor_degree > 1:
                    for layer in s.layers:
                        problem = model.tensor_parallel_problem(layer, s.tensor_degree)
                        if problem is not None:
                            raise PlanError(
                                f"stage {i} ({s.describe()}): layer {layer} ({model.layer_name(layer)}) cannot be"
                                f" tensor-parallel at degree {s.tensor_degree}: {problem}",
                                fix="make this stage 'data' or 'none', or move the layer to another stage",
                            )

    def check_fits(self, num_layers: int, cluster: Cluster) -> None:
        """What the cost model needs, short of :meth:`validate`'s plan-space rules: the stages cover
        ``num_layers`` and use only devices of ``cluster`` (AMP's plans may spread replicas over nodes).

        Raises:
            PlanError: naming the problem.
        """
        self._validate_layers(num_layers)
        bad = [d for s in self.stages for d in s.devices if not 0 <= d < cluster.num_devices]
        if bad:
            raise PlanError(
                f"device(s) {bad} do not exist on cluster {cluster.shape} (devices 0..{cluster.num_devices - 1})",
                fix="use device indices of the cluster, or a larger cluster",
            )

    def _validate_batch(self) -> None:
        if self.global_batch_size < 1:
            raise PlanError(f"global_batch_size must be at least 1, got {self.global_batch_size}")
        if self.num_microbatches < 1:
            raise PlanError(f"num_microbatches must be at least 1, got {self.num_microbatches}")
        if self.global_batch_size % self.num_microbatches:
            raise PlanError(
                f"global_batch_size {self.global_batch_size} does not split into {self.num_microbatches} equal micro-batches",
                fix="choose num_microbatches dividing the global batch size",
            )

    def _validate_layers(self, num_layers: int | None) -> None:
        expected = 0
        for i, s in enumerate(self.stages):
            if s.start != expected:
                what = "start at layer 0" if i == 0 else f"start where stage {i - 1} stops (layer {expected})"
                raise PlanError(
                    f"stage {i} covers layers [{s.start}, {s.stop}) but must {what}",
                    fix="stages must cover every layer once, in order, with half-open [start, stop) ranges",
                )
            if s.stop <= s.start:
                raise PlanError(f"stage {i} covers layers [{s.start}, {s.stop}), which is empty", fix="every stage needs stop > start")
            expected = s.stop
        if num_layers is not None and expected != num_layers:
            raise PlanError(
                f"the stages cover layers [0, {expected}) but the model has {num_layers} layers",
                fix=f"the last stage must stop at layer {num_layers}",
            )

    def _validate_stage_kinds(self) -> None:
        for i, s in enumerate(self.stages):
            if s.degree < 1:
                raise PlanError(f"stage {i}: degree must be at least 1, got {s.degree}")
            if s.parallelism == "none" and s.degree != 1:
                raise PlanError(
                    f"stage {i}: parallelism 'none' needs degree 1, got {s.degree}",
                    fix="use 'data' or 'tensor' for a stage on several devices",
                )
            if len(s.devices) != s.degree:
                raise PlanError(
                    f"stage {i}: degree {s.degree} but {len(s.devices)} device(s) {list(s.devices)}",
                    fix="list exactly 'degree' devices",
                )
            if s.zero and s.data_degree < 2:
                raise PlanError(
                    f"stage {i} ({s.describe()}): ZeRO-{s.zero} shards over the data-parallel group, and the stage has"
                    " no data parallelism",
                    fix='drop "zero", or make the stage data-parallel ("data" or "data+tensor" with a data degree above 1)',
                )
            if s.data_degree > 1 and self.microbatch_size % s.data_degree:
                raise PlanError(
                    f"stage {i}: data-parallel degree {s.data_degree} does not divide the micro-batch size {self.microbatch_size}"
                    f" (global batch {self.global_batch_size} / {self.num_microbatches} micro-batches)",
                    fix="choose a batch size or micro-batch count giving a micro-batch divisible by every data-parallel degree",
                )

    def _validate_devices(self, cluster: Cluster | None) -> None:
        seen: dict[int, int] = {}
        for i, s in enumerate(self.stages):
            for d in s.devices:
                if d < 0:
                    raise PlanError(f"stage {i}: device index {d} is negative")
                if d in seen:
                    raise PlanError(
                        f"device {d} is used by stage {seen[d]} and stage {i}", fix="each device runs exactly one stage"
                    )
                seen[d] = i
        if cluster is None:
            return
        for i, s in enumerate(self.stages):
            for d in s.devices:
                if d >= cluster.num_devices:
                    raise PlanError(
                        f"stage {i}: device {d} does not exist on cluster {cluster.shape} (devices 0..{cluster.num_devices - 1})",
                        fix="use device indices below the cluster's device count, or a larger --cluster",
                    )
            for r in range(s.data_degree):
                nodes = {cluster.node_of(d) for d in s.tensor_group(r)}
                if len(nodes) > 1:
                    group = "" if s.data_degree == 1 else f": tensor group {r} {list(s.tensor_group(r))}"
                    raise PlanError(
                        f"stage {i} ({s.describe()}){group} spans nodes {sorted(nodes)} of cluster {cluster.shape}",
                        fix=f"a tensor-parallel group must share a node (node = device // {cluster.devices_per_node});"
                        " only the data-parallel replicas of a stage may be on different nodes",
                    )
        unused = [d for d in range(cluster.num_devices) if d not in seen]
        if unused:
            raise PlanError(
                f"device(s) {unused} of cluster {cluster.shape} are not used by any stage",
                fix="every device must belong to exactly one stage (on each node the stages' degrees sum to the devices"
                " per node); to use fewer devices, give a smaller --cluster",
            )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
