"""The plan: pipeline stages, each on ``data_degree x tensor_degree`` devices; its JSON form.

ONE plan type serves every stage of the data flow: the searches write it, the predictors and the cost
model read it, the runtime runs it. The JSON form (other tools rely on exactly these keys)::

    {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8,
     "stages": [
       {"layers": [0, 3],  "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
       {"layers": [3, 7],  "parallelism": "none",   "degree": 1, "devices": [2]},
       {"layers": [7, 10], "parallelism": "data",   "degree": 1, "devices": [3]}]}

A stage's fields, its data and tensor degrees and its JSON keys are described in :mod:`hybridplan.plan.stage`.

Besides these keys a plan holds only the annotations hybridplan writes (:data:`ANNOTATIONS`: the model, the
cluster, the predicted peak, ...) and the user's own, whose keys start with ``x-`` (``"x-note": "tried on
Monday"``, in a plan or in a stage): any other key is refused, so that a misspelt one (``"zeroo": 3``) is not
silently ignored. Every number is checked when the plan is read: batch and micro-batch counts, layer bounds,
degrees and device indices are integers within the bounds of hybridplan/limits.py.

Micro-batches: ``global_batch_size / num_microbatches`` samples enter the pipeline per micro-batch, and a
stage's replicas split them ``data_degree`` ways. AMP's strategy ``(pp, dp, tp, mbs)`` is the plan of
:meth:`Plan.uniform` with micro-batches of ``dp * mbs`` samples: each device sees ``mbs``.

The rules a plan must follow are in :mod:`hybridplan.plan.rules` (:meth:`Plan.validate`,
:meth:`Plan.check_fits`). This module imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridplan.errors import PlanError
from hybridplan.limits import (GLOBAL_BATCH_WHY, MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MICROBATCHES_WHY, JSONDataError,
                               count_problem, find_huge, load_json, shown)
from hybridplan.plan import rules
from hybridplan.plan.schedule import Schedule, as_schedule
from hybridplan.plan.stage import USER_PREFIX, StagePlan

if TYPE_CHECKING:
    from hybridplan.models.base import LayeredModel
    from hybridplan.plan.cluster import Cluster

__all__ = ["Plan", "ANNOTATIONS", "USER_PREFIX"]

_PLAN_KEYS = ("schedule", "global_batch_size", "num_microbatches", "stages")

ANNOTATIONS = ("model", "cluster", "predicted_peak_bytes", "predicted_iteration_s", "estimated_peak_bytes", "baseline",
               "pipeline", "recompute", "weight_versions", "nearest_for", "changes")
"""The keys hybridplan writes beside a plan's own (what it was planned for and predicted, the baseline or pipeline it
follows, what ``export --nearest`` changed); a user's annotation starts with :data:`USER_PREFIX`."""



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
        unknown = sorted(k for k in self.extra if k not in ANNOTATIONS and not str(k).startswith(USER_PREFIX))
        if unknown:
            raise PlanError(f"plan has unknown key(s) {', '.join(shown(k) for k in unknown[:5])}",
                            fix=f"the known keys are {list(_PLAN_KEYS + ANNOTATIONS)}; start an annotation of your own"
                            f" with {USER_PREFIX!r} (e.g. \"x-note\")")

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
            raise PlanError(f"a plan must be a JSON object with keys {list(_PLAN_KEYS)}, got {type(data).__name__}",
                            fix="give a plan JSON file (format: hybridplan/plan/plan.py), e.g. one 'hybridplan plan' wrote")
        missing = [k for k in _PLAN_KEYS if k not in data]
        if missing:
            raise PlanError(f"plan lacks key(s) {missing}", fix=f"a plan needs {list(_PLAN_KEYS)}")
        for key, high, why in (("global_batch_size", MAX_GLOBAL_BATCH, GLOBAL_BATCH_WHY),
                               ("num_microbatches", MAX_MICROBATCHES, MICROBATCHES_WHY)):
            problem = count_problem(data[key], high, why=why)
            if problem is not None:
                raise PlanError(f"plan '{key}' {problem}", fix=f"give '{key}' as a positive integer of at most {high:,}")
        stages = data["stages"]
        if not isinstance(stages, Sequence) or isinstance(stages, str) or not stages:
            raise PlanError(f"plan 'stages' must be a non-empty list of stages, got {shown(stages)}",
                            fix='write e.g. "stages": [{"layers": [0, 3], "parallelism": "none", "degree": 1, "devices": [0]}]')
        parsed = tuple(StagePlan.from_dict(s, i) for i, s in enumerate(stages))
        huge = find_huge(dict(data))  # in an annotation: the fields above name their own bounds
        if huge is not None:
            raise PlanError(f"plan: {huge[0]} is {huge[1]!r}", fix="no value of a plan needs more than 19 digits")
        return cls(
            schedule=as_schedule(data["schedule"]),
            global_batch_size=int(data["global_batch_size"]),
            num_microbatches=int(data["num_microbatches"]),
            stages=parsed,
            extra={k: v for k, v in data.items() if k not in _PLAN_KEYS},
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
            data = load_json(text)
        except JSONDataError as e:
            raise PlanError(f"plan file {str(p)!r} is not valid JSON: {e}",
                            fix="give a plan JSON file (format: hybridplan/plan/plan.py)") from None
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
        """Check every rule of the plan space (:mod:`hybridplan.plan.rules`) that the given context allows.

        Args:
            num_layers: the model's layer count (taken from ``model`` when given).
            cluster: the mesh the plan must fill exactly.
            model: the model, to check tensor-parallel support of tensor stages' layers.

        Raises:
            PlanError: naming the first broken rule, the bad value and the fix.
        """
        rules.validate(self, num_layers=num_layers, cluster=cluster, model=model)

    def check_fits(self, num_layers: int, cluster: Cluster) -> None:
        """What the cost model needs, short of :meth:`validate`'s plan-space rules: the stages cover
        ``num_layers`` and use only devices of ``cluster`` (AMP's plans may spread replicas over nodes).

        Raises:
            PlanError: naming the problem.
        """
        rules.check_fits(self, num_layers, cluster)
