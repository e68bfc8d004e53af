"""A stage's peak under any schedule position, from its quantities (profiling/quantities.py).

The runtime's memory moves through a stage's actions like this (measured, see the quantities note):
the level starts at ``static + data``; a forward peaks at ``level + forward_transient`` and leaves
``activation`` more; the first backward peaks at ``level + first_backward_transient`` and leaves
``gradient - activation`` more; each later backward peaks at ``level + backward_transient`` and frees
``activation``; then the batch is dropped and the step peaks at ``level + step_transient``.

Replaying an action list symbolically gives the peak as the maximum of a few linear forms of the
quantity vector (:func:`peak_terms`), computed once per (schedule, position, micro-batches) and then
applied to any number of stages at once with numpy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hybridplan.profiling.quantities import INDEX, QUANTITIES
from hybridplan.plan.schedule import stage_actions

__all__ = ["peak_terms", "stage_peak", "stage_peaks"]


def _unit(name: str) -> np.ndarray:
    v = np.zeros(len(QUANTITIES))
    v[INDEX[name]] = 1.0
    return v


@lru_cache(maxsize=4096)
def _terms(schedule: str, stages_after: int, num_microbatches: int) -> tuple[tuple[float, ...], ...]:
    actions = stage_actions(schedule, stages_after + 1, 0, num_microbatches)
    level = _unit("static") + _unit("data")
    terms = []
    first_backward = True
    for action in actions:
        if action.kind == "F":
            terms.append(level + _unit("forward_transient"))
            level = level + _unit("activation")
        elif first_backward:
            terms.append(level + _unit("first_backward_transient"))
            level = level + _unit("gradient") - _unit("activation")
            first_backward = False
        else:
            terms.append(level + _unit("backward_transient"))
            level = level - _unit("activation")
    level = level - _unit("data")
    terms.append(level + _unit("step_transient"))
    return tuple(sorted({tuple(t) for t in terms}))


def peak_terms(schedule: str, stages_after: int, num_microbatches: int) -> np.ndarray:
    """Coefficient rows ``C`` such that the stage's peak is ``max(C @ q)``.

    ``stages_after`` is the number of stages after this one; under 1F1B it sets the warm-up depth,
    under GPipe it does not matter.
    """
    stages_after = min(stages_after, num_microbatches)  # deeper positions run the same actions
    if schedule == "gpipe":
        stages_after = 0
    return _terms_array(schedule, stages_after, num_microbatches)


@lru_cache(maxsize=4096)
def _terms_array(schedule: str, stages_after: int, num_microbatches: int) -> np.ndarray:
    """:func:`_terms` as a read-only array, made once (a search replays thousands of spans per position)."""
    out = np.array(_terms(schedule, stages_after, num_microbatches))
    out.setflags(write=False)
    return out


def stage_peak(q: np.ndarray, schedule: str, stages_after: int, num_microbatches: int) -> float:
    """Peak bytes of one stage with quantity vector ``q``."""
    return float(np.max(peak_terms(schedule, stages_after, num_microbatches) @ q))


def stage_peaks(qs: np.ndarray, schedule: str, stages_after: int, num_microbatches: int) -> np.ndarray:
    """Peaks of many stages at once: ``qs`` has one quantity vector per row."""
    return np.max(qs @ peak_terms(schedule, stages_after, num_microbatches).T, axis=-1)
