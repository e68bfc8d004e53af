"""Cutting a layer chain into pipeline stages: AMP's dynamic program and a min-max partition.

The throughput search cuts with :mod:`hybridplan.search.time.bottleneck_cuts` (the same optimum, orders of
magnitude faster at hundreds of layers, and the gradient sync too); AMP's program stays here as the reference
the fast cut is tested against (tests/search/time/test_bottleneck_cuts.py) and as ``cuts="amp"``.

[Note: AMP's layer assignment] (seed 002 section 3.5, proof in 6.4) minimises eq. 5,
``(gas - 1) max_i t_i + sum_i t_i + sum_i e_i``, exactly. The max term does not decompose over stages, so
AMP adds a *tolerance* ``m`` and solves ``(gas - 1) max(0, max_i t_i - m) + sum t_i + sum e_i`` (eq. 6) for
every ``m`` among the possible stage times (every contiguous sum of layer times, and 0). With
``dp[i][j][m]`` the best cost of the first ``i`` layers in ``j + 1`` stages:

- base: ``dp[i][0][m] = (gas - 1) max(0, t(0, i) - m) + t(0, i)`` (eq. 7);
- step: ``dp[i][j][m] = min over i' of dp[i'][j-1][max(t(i', i), m)] + (gas - 1) max(0, t(i', i) - m)
  + t(i', i) + e(i')`` (eq. 8). The identity of section 6.4, ``max(0, T1 - max(t2, m)) + max(0, t2 - m) =
  max(0, max(T1, t2) - m)``, makes the step exact: passing the tolerance ``max(t2, m)`` down charges the
  earlier stages only for the part of their maximum that exceeds both ``m`` and the new stage;
- answer: ``dp[L][k-1][0]``, which is eq. 5.

Three details of our version. (1) Stage times may depend on the stage (``stage_costs[j]``: a stage's devices
may be slower), so the tolerance values are every contiguous sum of every stage's costs. (2) The max term may
also hold a per-boundary *floor* (``cut_floors``): the time model lets a one-way transfer longer than every
stage pace the steady state (:mod:`hybridplan.predict.time_model`, note on p2p overlap). A stage then enters the
max with ``u = max(t(i', i), floor(i'))``; the identity above holds for any per-stage values, so the program
stays exact with ``u`` in place of ``t`` in the max terms (tolerance values: every ``u``). With zero floors
it is AMP's program. (3) We vectorise over ``m`` with numpy: ``max(u2, m)`` is an index into the sorted
tolerance values, ``max(index(u2), m_index)``. Cost ``O(k L^2 |m|)`` with ``|m| = O(L^2)`` (``O(k L^2)`` for
stage-dependent costs or floors): AMP's ``O(k L^4)``. (AMP's published code differs from the paper: when it
stores the best cost it subtracts the p2p term it used to choose, so its table drops ``e``; we follow the paper.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hybridplan.errors import PlanError

__all__ = ["Assignment", "amp_layer_assignment", "min_max_assignment", "assignment_objective"]

_SINGLE_MICROBATCH_WEIGHT = 1e-9
"""Weight of the max term when gas = 1, where eq. 5 has none and nearly every cut ties: the most balanced of
the tied cuts wins (AMP's code splits layers evenly in that case) at a cost of at most 1e-9 x the slowest
stage. A tie-break, not a measured value."""


@dataclass(frozen=True)
class Assignment:
    """Stage boundaries ``(0, b_1, ..., L)`` and the objective value they reach."""

    boundaries: tuple[int, ...]
    objective: float


def _check(stage_costs: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray]) -> tuple[int, int]:
    k = len(stage_costs)
    if k < 1:
        raise PlanError("need at least one stage")
    num_layers = len(stage_costs[0])
    if any(len(c) != num_layers for c in stage_costs):
        raise PlanError("every stage's cost vector must have one entry per layer")
    if k > num_layers:
        raise PlanError(f"cannot cut {num_layers} layers into {k} non-empty stages",
                        fix=f"use at most {num_layers} stages (one per layer): fewer devices, or more per stage")
    if len(cut_costs) != k - 1 or any(len(c) < num_layers - 1 for c in cut_costs):
        raise PlanError(f"{k} stages need {k - 1} boundary-cost vectors of at least {num_layers - 1} entries")
    return k, num_layers


def assignment_objective(
    boundaries: Sequence[int],
    stage_costs: Sequence[np.ndarray],
    cut_costs: Sequence[np.ndarray],
    num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None,
) -> float:
    """The objective for given boundaries: ``(gas - 1) max(max_j t_j, max_j floor_j) + sum t + sum e``.

    Stage ``j`` holds layers ``[b_j, b_{j+1})``; ``cut_costs[j-1][l]`` (``cut_floors[j-1][l]``) is ``e`` (the
    floor) of a boundary after layer ``l`` between stages ``j - 1`` and ``j``. Without floors: eq. 5.
    """
    t = [float(np.sum(stage_costs[j][boundaries[j] : boundaries[j + 1]])) for j in range(len(boundaries) - 1)]
    e = [float(cut_costs[j - 1][boundaries[j] - 1]) for j in range(1, len(boundaries) - 1)]
    floors = [float(cut_floors[j - 1][boundaries[j] - 1]) for j in range(1, len(boundaries) - 1)] if cut_floors else []
    return (num_microbatches - 1) * max(t + floors) + sum(t) + sum(e)


def amp_layer_assignment(
    stage_costs: Sequence[np.ndarray],
    cut_costs: Sequence[np.ndarray],
    num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None,
) -> Assignment:
    """The boundaries minimising :func:`assignment_objective` by AMP's dynamic program (module note).

    Args:
        stage_costs: for each stage ``j``, the seconds of each layer per micro-batch on that stage.
        cut_costs: for ``j = 1 .. k-1``, ``e`` per micro-batch of a boundary after each layer between stages
            ``j - 1`` and ``j`` (index = last layer of stage ``j - 1``).
        num_microbatches: gas.
        cut_floors: like ``cut_costs``, the least steady-state period a boundary imposes (default: none).

    Raises:
        PlanError: for more stages than layers or mismatched vector lengths.

    Example:
        >>> a = amp_layer_assignment([np.array([1., 1., 2.])] * 2, [np.zeros(3)], num_microbatches=4)
        >>> a.boundaries, a.objective     # stages {0, 1} and {2}: 3 * 2 + 4
        ((0, 2, 3), 10.0)
    """
    k, num_layers = _check(stage_costs, cut_costs)
    if cut_floors is not None:
        _check(stage_costs, cut_floors)
    g = float(num_microbatches - 1) or _SINGLE_MICROBATCH_WEIGHT
    prefix = [np.concatenate(([0.0], np.cumsum(np.asarray(c, dtype=float)))) for c in stage_costs]
    seg = [p[None, :] - p[:, None] for p in prefix]  # seg[j][a, b] = time of layers [a, b) on stage j
    bottleneck = [seg[0]]  # u[j][a, b]: what stage j holding [a, b) puts in the max term
    for j in range(1, k):
        floor = np.zeros(num_layers + 1)
        if cut_floors is not None:
            floor[1:num_layers] = np.asarray(cut_floors[j - 1], dtype=float)[: num_layers - 1]
        bottleneck.append(np.maximum(seg[j], floor[:, None]))
    upper = np.triu_indices(num_layers + 1, 1)
    cands = np.unique(np.concatenate([[0.0]] + [u[upper] for u in bottleneck]))
    idx = [np.searchsorted(cands, np.where(u >= 0, u, 0.0)) for u in bottleneck]
    ms = np.arange(len(cands))
    t0 = seg[0][0]
    table = g * np.maximum(0.0, t0[:, None] - cands[None, :]) + t0[:, None]
    table[0] = np.inf
    choices: list[np.ndarray] = []
    for j in range(1, k):
        new = np.full_like(table, np.inf)
        choice = np.zeros(table.shape, dtype=int)
        e = np.asarray(cut_costs[j - 1], dtype=float)
        for i in range(j + 1, num_layers + 1):
            prev = np.arange(j, i)  # layers held by the first j stages
            t2, u2, at = seg[j][prev, i], bottleneck[j][prev, i], idx[j][prev, i]
            # table[i', max(at, m)]: the row itself for m >= at, its entry at `at` below
            earlier = np.where(ms[None, :] < at[:, None], table[prev, at][:, None], table[prev])
            cost = earlier + g * np.maximum(0.0, u2[:, None] - cands[None, :]) + (t2 + e[prev - 1])[:, None]
            best = np.argmin(cost, axis=0)
            new[i] = cost[best, ms]
            choice[i] = prev[best]
        table = new
        choices.append(choice)
    bounds = [num_layers]
    i, m = num_layers, 0
    for j in range(k - 1, 0, -1):
        ip = int(choices[j - 1][i, m])
        m = max(int(idx[j][ip, i]), m)
        bounds.append(ip)
        i = ip
    bounds.append(0)
    boundaries = tuple(reversed(bounds))
    return Assignment(boundaries, assignment_objective(boundaries, stage_costs, cut_costs, num_microbatches, cut_floors))


def min_max_assignment(
    stage_costs: Sequence[np.ndarray], cut_floors: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray] | None = None
) -> Assignment:
    """The boundaries minimising ``P = max(max_j t_j, max_j floor_j)``: the slowest stage or boundary transfer,
    the steady-state period of a pipeline that never flushes (PipeDream-2BW).

    Many cuts often reach the same ``P``; among them we take the one with the least ``sum t + sum e``
    (``e`` from ``cut_costs``, default the floors): the one-time pipeline fill, and no empty-looking stages.
    Two exact dynamic programs over (stages, layers), ``O(k L^2)`` each. Arguments as in
    :func:`amp_layer_assignment`; ``objective`` of the result is ``P``.
    """
    k, num_layers = _check(stage_costs, cut_floors)
    costs = cut_floors if cut_costs is None else cut_costs
    _check(stage_costs, costs)
    prefix = [np.concatenate(([0.0], np.cumsum(np.asarray(c, dtype=float)))) for c in stage_costs]
    floors = [np.asarray(f, dtype=float) for f in cut_floors]
    best = prefix[0].copy()
    best[0] = np.inf
    for j in range(1, k):
        new = np.full(num_layers + 1, np.inf)
        for i in range(j + 1, num_layers + 1):
            prev = np.arange(j, i)
            new[i] = np.min(np.maximum(np.maximum(best[prev], prefix[j][i] - prefix[j][prev]), floors[j - 1][prev - 1]))
        best = new
    period = float(best[num_layers])
    cap = period * (1 + 1e-12) + 1e-300  # the optimum itself must pass despite rounding
    total = np.where(prefix[0] <= cap, prefix[0], np.inf)
    total[0] = np.inf
    choices = []
    for j in range(1, k):
        e = np.asarray(costs[j - 1], dtype=float)
        new = np.full(num_layers + 1, np.inf)
        choice = np.zeros(num_layers + 1, dtype=int)
        for i in range(j + 1, num_layers + 1):
            prev = np.arange(j, i)
            t = prefix[j][i] - prefix[j][prev]
            ok = (t <= cap) & (floors[j - 1][prev - 1] <= cap)
            value = np.where(ok, total[prev] + t + e[prev - 1], np.inf)
            b = int(np.argmin(value))
            new[i], choice[i] = value[b], prev[b]
        total = new
        choices.append(choice)
    bounds = [num_layers]
    i = num_layers
    for j in range(k - 1, 0, -1):
        i = int(choices[j - 1][i])
        bounds.append(i)
    bounds.append(0)
    return Assignment(tuple(reversed(bounds)), period)
