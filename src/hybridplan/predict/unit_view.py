"""The memory predictor seen on merged layers, as the search sees it.

When a profile merged layers (``hybridplan profile --merge-layers``; profiling/merger.py, CAPTURE's fewer, bigger
layers), the search runs on those units and asks for a stage's memory in unit indices. :class:`UnitView` answers
in those, through the predictor's answers in the model's layers, and maps a plan found on units back to the
model's layers; it adds no arithmetic of its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hybridplan.plan import Plan

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["UnitView"]


class UnitView:
    """A :class:`MemoryPredictor` on merged layers: unit ``i`` is original layers ``[bounds[i], bounds[i+1])``.

    Implements the search's stage-memory protocol in unit indices; :meth:`to_original` maps a plan
    found on units back to the model's layers.
    """

    def __init__(self, predictor: MemoryPredictor, bounds: list[int]) -> None:
        self.predictor = predictor
        self.bounds = list(bounds)
        self.position_horizon = predictor.position_horizon

    @property
    def num_layers(self) -> int:
        return len(self.bounds) - 1

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int, *,
                     tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> float:
        return self.predictor.stage_memory(self.bounds[start], self.bounds[stop], kind, degree, stages_after,
                                           tensor_degree=tensor_degree, zero=zero, recompute=recompute)

    def allowed(self, start: int, stop: int, kind: str, degree: int, *, tensor_degree: int = 0, zero: int = 0,
                recompute: bool = False) -> bool:
        return self.predictor.allowed(self.bounds[start], self.bounds[stop], kind, degree, tensor_degree=tensor_degree,
                                      zero=zero, recompute=recompute)

    def stage_memory_matrix(self, kind: str, degree: int, stages_after: int, num_layers: int, *,
                            tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        full = self.predictor.stage_memory_matrix(kind, degree, stages_after, self.predictor.num_layers,
                                                  tensor_degree=tensor_degree, zero=zero, recompute=recompute)
        b = np.array(self.bounds)
        return full[np.ix_(b[:-1], b)]

    def to_original(self, plan: Plan) -> Plan:
        """``plan`` with unit indices turned into the model's layer indices."""
        stages = tuple(replace(s, start=self.bounds[s.start], stop=self.bounds[s.stop]) for s in plan.stages)
        return Plan(plan.schedule, plan.global_batch_size, plan.num_microbatches, stages, plan.extra)
