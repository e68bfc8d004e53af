"""Which plans the throughput searches may keep: the model can run them, and every device's predicted peak
memory fits its capacity.

AMP's cost model has no memory model (seed 002: its search returns plans that then run out of memory;
benchmarks/amp_trials), and the PipeDream-2BW planner leaves memory to its caller. :class:`Feasibility`
is the ``memory_ok`` callback both take (search/time/throughput.py, search/time/pipedream_2bw.py), built from the
memory predictor (predict/memory.py) and the cluster's per-device capacities. A plan is rejected

- as *invalid* if the model cannot run it (a tensor stage with a layer that cannot be split at its degree,
  a data shard that is not a multiple of the model's sample granularity, a stage spanning nodes:
  ``Plan.validate``);
- as *unpredictable* if the profile cannot predict one of its stages (a scenario or degree not profiled,
  a stage off the merged layers), or it recomputes activations and the profile was taken without (or the
  reverse: PipeDream-2BW's ``r``);
- as *too large* if some device's predicted peak exceeds its capacity (devices without a capacity always
  fit).

Predictions are cached per plan, so the Pareto objective's ``peak_memory`` reuses them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError, ProfileError
from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import TensorParallelPlan
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.prediction import PlanPrediction

__all__ = ["Feasibility"]


class _CachedRules(LayeredModel):
    """``model`` with its tensor-parallel answers cached: ``Plan.validate`` asks them for every tensor stage's
    layers, and each answer builds the layer on the meta device (~50 ms for a GPT block), while a search asks
    the same few (layer, degree) pairs again and again."""

    def __init__(self, model: LayeredModel) -> None:
        self.model = model
        self.name = model.name
        self._problems: dict[tuple[int, int], str | None] = {}

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def sample_granularity(self) -> int:
        return self.model.sample_granularity

    def layer_name(self, index: int) -> str:
        return self.model.layer_name(index)

    def build_layer(self, index: int) -> nn.Module:
        return self.model.build_layer(index)

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.make_batch(num_samples, generator)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.model.loss(output, target)

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        return self.model.tensor_parallel_plan(index)

    def tensor_parallel_problem(self, index: int, degree: int) -> str | None:
        key = (index, degree)
        if key not in self._problems:
            self._problems[key] = self.model.tensor_parallel_problem(index, degree)
        return self._problems[key]

    def config(self) -> dict[str, Any]:
        return self.model.config()


@dataclass
class Feasibility:
    """The ``memory_ok`` / ``peak_memory`` callbacks of the throughput searches (module docstring).

    Args:
        cluster: the devices and their capacities.
        predictor: the memory predictor; None checks validity only (every plan "fits").
        model: the model, for ``Plan.validate``; None skips the model's rules.
        recompute_profiled: whether the profile recomputed activations (its activation checkpointing).

    Example:
        >>> from hybridplan.plan import StagePlan
        >>> fit = Feasibility(Cluster.uniform(1, 2))
        >>> fit(Plan("1f1b", 4, 2, (StagePlan(0, 1, "none", 1, (0,)), StagePlan(1, 2, "none", 1, (1,)))))
        True
    """

    cluster: Cluster
    predictor: MemoryPredictor | None = None
    model: LayeredModel | None = None
    recompute_profiled: bool = False
    invalid: int = 0
    unpredictable: int = 0
    too_large: int = 0
    reasons: dict[str, str] = field(default_factory=dict)
    """One example reason per kind of rejection ("invalid", "unpredictable", "too_large")."""
    _cache: dict[str, PlanPrediction | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, _CachedRules):
            self.model = _CachedRules(self.model)

    def prediction(self, plan: Plan) -> PlanPrediction | None:
        """The plan's predicted per-device peaks (None without a predictor, or where it cannot predict)."""
        if self.predictor is None:
            return None
        key = json.dumps(plan.to_dict(), sort_keys=True)
        if key not in self._cache:
            try:
                self._cache[key] = self.predictor.predict(plan)
            except (ProfileError, PlanError) as e:
                self.reasons.setdefault("unpredictable", e.message)
                self._cache[key] = None
        return self._cache[key]

    def peak_memory(self, plan: Plan) -> float:
        """Predicted peak bytes of the plan's fullest device (``inf`` where unpredictable, 0 without a predictor)."""
        if self.predictor is None:
            return 0.0
        prediction = self.prediction(plan)
        return math.inf if prediction is None else float(prediction.peak_memory_bytes)

    def stage_peaks(self, plan: Plan) -> list[float] | None:
        """Per stage, the predicted peak of its fullest device, ``inf`` where a device exceeds its capacity; ``None``
        where the plan is invalid or unpredictable (the ``stage_peaks`` of search/time/stage_options.py; counted
        in no rejection: the plan chosen from them goes through :meth:`__call__`). Without a predictor every
        stage fits at 0."""
        try:
            plan.validate(model=self.model, cluster=self.cluster)
        except PlanError:
            return None
        if self.predictor is None:
            return [0.0] * plan.num_stages
        prediction = self.prediction(plan)
        if prediction is None:
            return None
        peaks = [0.0] * plan.num_stages
        for d in prediction.devices:
            capacity = self.cluster.memory_of(d.device)
            over = capacity is not None and d.needed_bytes > capacity
            peaks[d.stage] = math.inf if over else max(peaks[d.stage], float(d.peak_memory_bytes))
        return peaks

    def __call__(self, plan: Plan) -> bool:
        """Whether ``plan`` is kept (``memory_ok``)."""
        try:
            plan.validate(model=self.model, cluster=self.cluster)
        except PlanError as e:
            self.invalid += 1
            self.reasons.setdefault("invalid", e.message)
            return False
        if self.predictor is None:
            return True
        if bool(plan.extra.get("recompute", self.recompute_profiled)) != self.recompute_profiled:
            self.unpredictable += 1
            self.reasons.setdefault(
                "unpredictable",
                f"the profile was taken {'with' if self.recompute_profiled else 'without'} activation checkpointing;"
                " plans that differ cannot be predicted",
            )
            return False
        prediction = self.prediction(plan)
        if prediction is None:
            self.unpredictable += 1
            return False
        for d in prediction.devices:
            capacity = self.cluster.memory_of(d.device)
            if capacity is not None and d.needed_bytes > capacity:  # on CUDA with what the allocator leaves out
                self.too_large += 1
                self.reasons.setdefault(
                    "too_large", f"device {d.device} would need {d.needed_bytes} bytes, it has {capacity}"
                )
                return False
        return True

    @property
    def rejected(self) -> int:
        """Plans rejected for any reason."""
        return self.invalid + self.unpredictable + self.too_large

    def summary(self) -> str:
        """One line: how many plans were rejected, and why."""
        parts = [f"{n} {what}" for what, n in (("invalid for the model", self.invalid),
                                                 ("unpredictable from the profile", self.unpredictable),
                                                 ("over a device's memory", self.too_large)) if n]
        return "rejected: " + (", ".join(parts) if parts else "none")
