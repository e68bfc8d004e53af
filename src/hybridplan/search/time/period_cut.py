"""PipeDream-2BW's stage cut for its period alone: the least steady-state period of a pipeline that never
flushes, by the windows and sweep of the bottleneck search ([Note: bottleneck search] in
search/time/bottleneck_cuts.py). The throughput search cuts 2BW by its periods, sync and step together where it
has a sync or a measured step ([Note: 2BW's cut with the sync and the step] there); this cut is the rest (one data
replica, no measured step) and PipeDream-2BW's own planner (search/time/pipedream_2bw.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.predict.time_model import pipeline_seconds_from
from hybridplan.search.time.bottleneck_cuts import _sweep
from hybridplan.search.time.cut_problem import _Problem
from hybridplan.search.time.stage_cuts import _SINGLE_MICROBATCH_WEIGHT, Assignment, _check

__all__ = ["bottleneck_min_max"]


@overload
def bottleneck_min_max(
    stage_costs: Sequence[np.ndarray], cut_floors: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray] | None = None,
    num_microbatches: int = 1, in_flight: int | None = None, starts: None = None,
) -> Assignment: ...


@overload
def bottleneck_min_max(
    stage_costs: Sequence[np.ndarray], cut_floors: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray] | None = None,
    num_microbatches: int = 1, in_flight: int | None = None, *, starts: Sequence[np.ndarray] | None,
) -> Assignment | None: ...


def bottleneck_min_max(
    stage_costs: Sequence[np.ndarray], cut_floors: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray] | None = None,
    num_microbatches: int = 1, in_flight: int | None = None, starts: Sequence[np.ndarray] | None = None,
) -> Assignment | None:
    """The cut of :func:`~hybridplan.search.time.stage_cuts.min_max_assignment` (the least steady-state period
    ``P = max(max_j t_j, max_j floor_j)``, of a pipeline that never flushes; among the cuts within 1e-9 of it in
    ratio, periods that differ by rounding, the least ``sum t + sum e``) by the same windows: a binary search for
    the least candidate ``P`` some cut fits, then ``S(P (1 + 1e-9), inf)``. ``objective`` of the result is its
    period.

    With ``in_flight`` fewer than ``num_microbatches`` (PipeDream-2BW holds one micro-batch per stage) the period is
    the time model's, at least the round trip ``sum t + sum e`` over ``in_flight`` ([Note: the round trip of 1F1B]
    in predict/time_model.py): ``max(P, S / in_flight)``, the time model's
    :func:`~hybridplan.predict.time_model.pipeline_seconds_from` without a flush, over gas. Its least value over
    the caps, ``pipe(P, S(P))`` per candidate ``P``, is the optimum (the least-sum cut under an optimum's own ``P``
    is no slower), found by the sweep of [Note: bottleneck search] over the candidates from the least feasible one
    while ``pipe(P, least sum)`` can still beat the min-max cut (one candidate where the round trip does not bind);
    the fill still breaks ties (1e-9 of it added). ``objective`` is then that period. ``starts``: memory windows
    as in :func:`~hybridplan.search.time.bottleneck_cuts.bottleneck_assignment` (None where no cut fits them).

    Example:
        >>> ones = np.ones(4)
        >>> bottleneck_min_max([ones, ones], [np.array([0.0, 5.0, 0.0])], [np.array([0.0, 0.0, 1.0])]).boundaries
        (0, 1, 4)
    """
    _check(stage_costs, cut_floors)
    problem = _Problem(stage_costs, cut_floors if cut_costs is None else cut_costs, cut_floors, None, starts)
    if starts is not None and problem.evaluate(np.inf, np.inf)[1] is None:
        return None  # no cut fits the memory windows
    ps, _ = problem.candidates((0.0, np.inf), 0.0)
    lo, hi = 0, len(ps) - 1  # the largest candidate fits: every stage and floor is at most it
    while lo < hi:
        mid = (lo + hi) // 2
        if problem.evaluate(float(ps[mid]), np.inf)[1] is None:
            lo = mid + 1
        else:
            hi = mid
    # the least fill among the cuts whose period is within the tie-break's weight of the least one: periods
    # that differ by rounding alone (sums in another order) tie, as they do in the sweep below
    _, cut = problem.evaluate(float(ps[lo]) * (1 + _SINGLE_MICROBATCH_WEIGHT), np.inf)
    if cut is None:
        raise PlanError("no cut of the layers into stages has a finite period",
                        fix="check the stage and boundary costs: they must be finite")
    if in_flight is None or in_flight >= num_microbatches or cut_costs is None:
        return Assignment(cut, problem.maxima(cut)[0])

    def period(u: np.ndarray | float, total: np.ndarray | float) -> np.ndarray:
        """The time model's steady-state period of cuts of bottleneck ``u`` and round trip ``total``."""
        return pipeline_seconds_from(u, total, num_microbatches, flush=False, in_flight=in_flight) / num_microbatches

    def pipeline(u: np.ndarray | float, total: np.ndarray | float) -> np.ndarray:
        """What the sweep minimises: the period, the fill breaking ties."""
        return period(u, total) + _SINGLE_MICROBATCH_WEIGHT * np.asarray(total, dtype=float)

    least_sum, _ = problem.evaluate(np.inf, np.inf)
    _, cut = _sweep(problem, ps[lo:], pipeline, least_sum, problem.value(cut, pipeline)[0], cut)
    return Assignment(cut, problem.value(cut, period)[0])
