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

Predictions are cached per plan, so the Pareto objective's ``peak_memory`` reuses them. The stage matrices of
:meth:`Feasibility.stage_windows` and the stage peaks of :meth:`Feasibility.stage_peaks` are kept in
:attr:`Feasibility.matrices` and :attr:`Feasibility.peaks`, which a caller may fill from disk and keep there
(workflows/table_cache.py): a question asked again is then searched without predicting them again.

:meth:`Feasibility.stage_windows` gives the throughput search what it cuts within ([Note: cutting within memory]
in search/time/bottleneck_cuts.py): per stage of a strategy, which ranges of layers its devices can hold, from
the predictor's matrix of every span's stage memory (predict/span_tables.py) and the model's tensor-parallel
rules, tested against the same capacities as :meth:`Feasibility.__call__`, never more strictly (see there).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError, ProfileError
from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import TensorParallelPlan
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.prediction import PlanPrediction
from hybridplan.search.time.bottleneck_cuts import fitting_starts

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


def _digest(plan: Plan) -> str:
    """The key of ``plan`` in :class:`Feasibility`'s kept results: the SHA-1 of its JSON."""
    return hashlib.sha1(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()


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
    _targets: dict[tuple[str, int, int], MemoryPredictor] = field(default_factory=dict, repr=False)
    matrices: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """:meth:`stage_windows`' stage matrices, by target and stage configuration."""
    peaks: dict[str, list[float]] = field(default_factory=dict, repr=False)
    """:meth:`stage_peaks` of the plans it could predict, by the SHA-1 of the plan's JSON."""
    verdicts: dict[str, tuple[str, str, float]] = field(default_factory=dict, repr=False)
    """:meth:`__call__`'s verdict on each plan it checked, by the SHA-1 of the plan's JSON: ``"kept"`` or the kind
    of rejection, its reason ("" for none), and the plan's :meth:`peak_memory` (NaN where not predicted)."""
    _why: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, _CachedRules):
            self.model = _CachedRules(self.model)

    def prediction(self, plan: Plan) -> PlanPrediction | None:
        """The plan's predicted per-device peaks (None without a predictor, or where it cannot predict)."""
        if self.predictor is None:
            return None
        key = _digest(plan)
        if key not in self._cache:
            try:
                self._cache[key] = self.predictor.predict(plan)
            except (ProfileError, PlanError) as e:
                self.reasons.setdefault("unpredictable", e.message)
                self._why[key] = e.message
                self._cache[key] = None
        return self._cache[key]

    def peak_memory(self, plan: Plan) -> float:
        """Predicted peak bytes of the plan's fullest device (``inf`` where unpredictable, 0 without a predictor)."""
        if self.predictor is None:
            return 0.0
        kept = self.verdicts.get(_digest(plan))
        if kept is not None and not math.isnan(kept[2]):
            return kept[2]
        prediction = self.prediction(plan)
        return math.inf if prediction is None else float(prediction.peak_memory_bytes)

    def stage_peaks(self, plan: Plan) -> list[float] | None:
        """Per stage, the predicted peak of its fullest device, ``inf`` where a device exceeds its capacity; ``None``
        where the plan is invalid or unpredictable (the ``stage_peaks`` of search/time/stage_options.py; counted
        in no rejection: the plan chosen from them goes through :meth:`__call__`). Without a predictor every
        stage fits at 0. Kept in :attr:`peaks` where predicted."""
        key = _digest(plan)
        if key in self.peaks:
            return list(self.peaks[key])
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
        self.peaks[key] = list(peaks)
        return peaks

    def stage_windows(self, plan: Plan) -> list[np.ndarray] | None:
        """Per stage of ``plan`` (its kinds, degrees, devices, options and positions; its layers are not read),
        the least start of a range of layers that fits, per end: the ``stage_windows`` of
        search/time/throughput.py, by :func:`~hybridplan.search.time.bottleneck_cuts.fitting_starts` ([Note:
        cutting within memory] there). A range ``[a, i)`` fits stage ``j`` where the model can split its layers at
        the stage's tensor degree (``Plan.validate``'s rule) and ``stage memory + outside <= capacity + 1`` on its
        devices, the stage memory from the predictor's matrix at the plan's schedule, batch and micro-batch count
        and the stage's position (``stage_memory_matrix``, what :meth:`MemoryPredictor.predict` predicts span by
        span, up to the last bits of a float: hence the byte), ``outside`` the bytes the device holds outside the
        allocator (CUDA; they do not depend on the layers, ``MemoryPredictor.outside_bytes``). That is a lower
        bound of what :meth:`__call__` checks (``needed_bytes``: the reserved peak, at least the rounded tensor
        peak, plus outside), so no plan that fits is left out; a window too loose costs only a plan that
        :meth:`__call__` then rejects. A ZeRO stage's ranks differ: its largest rank against its roomiest device,
        again a lower bound.

        None without a predictor (every plan fits), where the plan's recompute differs from the profile's, or where
        its layers are not the profile's.
        """
        if self.predictor is None:
            return None
        if (bool(plan.extra.get("recompute", self.recompute_profiled)) != self.recompute_profiled
                or plan.stages[-1].stop != self.predictor.num_layers):
            return None
        target = (plan.schedule, plan.global_batch_size, plan.num_microbatches)
        if target not in self._targets:
            base = self.predictor
            self._targets[target] = base if target == (base.schedule, base.global_batch_size, base.num_microbatches) \
                else base.retargeted(schedule=target[0], global_batch_size=target[1], num_microbatches=target[2])
        predictor = self._targets[target]
        L = predictor.num_layers
        out = []
        outside = predictor.outside_bytes_by_device(plan) or {}
        for j, stage in enumerate(plan.stages):
            after = min(plan.num_stages - 1 - j, predictor.position_horizon - 1)
            recompute = stage.recompute == "full"
            key = "|".join(map(str, (*target, stage.kind, stage.degree, stage.tensor_degree, stage.zero,
                                     int(recompute), after)))
            if key not in self.matrices:
                self.matrices[key] = predictor.stage_memory_matrix(
                    stage.kind, stage.degree, after, L, tensor_degree=stage.tensor_degree, zero=stage.zero,
                    recompute=recompute)
            room = [math.inf if (c := self.cluster.memory_of(d)) is None
                    else c - outside.get(d, 0) for d in stage.devices]
            fits = self.matrices[key] <= (max(room) if stage.zero else min(room)) + 1
            if self.model is not None and stage.tensor_degree > 1:
                bad = np.concatenate(([0], np.cumsum([self.model.tensor_parallel_problem(i, stage.tensor_degree)
                                                      is not None for i in range(L)])))
                fits &= (bad[None, :] - bad[:L, None]) == 0
            out.append(fitting_starts(fits))
        return out

    def __call__(self, plan: Plan) -> bool:
        """Whether ``plan`` is kept (``memory_ok``); its verdict kept in :attr:`verdicts`."""
        key = _digest(plan)
        if key not in self.verdicts:
            self.verdicts[key] = self._verdict(plan)
        kind, reason, _ = self.verdicts[key]
        if kind == "kept":
            return True
        setattr(self, kind, getattr(self, kind) + 1)
        if reason:
            self.reasons.setdefault(kind, reason)
        return False

    def _verdict(self, plan: Plan) -> tuple[str, str, float]:
        """:meth:`__call__`'s verdict on ``plan``: ``"kept"``, ``"invalid"``, ``"unpredictable"`` or ``"too_large"``,
        the reason, and its peak (NaN where not predicted)."""
        try:
            plan.validate(model=self.model, cluster=self.cluster)
        except PlanError as e:
            return "invalid", e.message, math.nan
        if self.predictor is None:
            return "kept", "", math.nan
        if bool(plan.extra.get("recompute", self.recompute_profiled)) != self.recompute_profiled:
            return ("unpredictable", f"the profile was taken {'with' if self.recompute_profiled else 'without'}"
                    " activation checkpointing; plans that differ cannot be predicted", math.nan)
        prediction = self.prediction(plan)
        if prediction is None:
            return "unpredictable", self._why.get(_digest(plan), ""), math.nan
        peak = float(prediction.peak_memory_bytes)
        for d in prediction.devices:
            capacity = self.cluster.memory_of(d.device)
            if capacity is not None and d.needed_bytes > capacity:  # on CUDA with what the allocator leaves out
                return "too_large", f"device {d.device} would need {d.needed_bytes} bytes, it has {capacity}", peak
        return "kept", "", peak

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
