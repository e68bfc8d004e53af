"""Cutting a layer chain into pipeline stages fast: branch and bound on the bottleneck values.

[Note: bottleneck search] The objective is the time model's pipeline term ``pipe(U, S)`` of a cut's
bottleneck ``U = max_j u_j`` (``u_j`` the stage time or the floor of its incoming boundary) and round trip
``S = sum_j (t_j + e_j)``: :func:`~hybridplan.predict.time_model.pipeline_seconds_from`, called, not copied, so
that the cut is timed as the model times the plan. That is eq. 5, ``g U + S`` (``g = gas - 1``: the objective of
:func:`~hybridplan.search.time.stage_cuts.assignment_objective`), or with ``in_flight = k`` micro-batches in flight
(1F1B: [Note: the round trip of 1F1B] in predict/time_model.py) ``g max(U, S / k) + S``; optionally plus the
data-parallel gradient sync ``max_j q_j`` with ``q_j = c_j w_j + l_j n_j`` (``w_j`` the gradient bytes of stage
``j``'s layers, ``c_j`` seconds per byte of its ring all-reduce, ``n_j`` their parameter tensors, ``l_j`` the
seconds each tensor's ring of messages adds, its per-message latency: the time model's sync term exactly,
:class:`~hybridplan.search.time.sync_costs.SyncCosts`). Its max terms do not decompose over stages. AMP's
program (stage_cuts.py) carries the max as a tolerance index through the table, ``O(k L^2 |m|)`` (and knows no
round trip). Here we fix the maxima instead: for caps ``P`` (pipeline) and ``Q`` (sync), ``S(P, Q)`` = the least
``sum (t + e)`` over cuts whose every ``u_j <= P`` and ``q_j <= Q``. Then

    optimum = min over (P, Q) of  pipe(P, S(P, Q)) + Q,

and it suffices to try the values ``P`` and ``Q`` that some stage can take (the candidates). What the search
needs of ``pipe`` is only that it is non-decreasing in ``U`` and in ``S`` (the least-sum cut under the optimum's
own maxima is then no slower than the optimum) and at least ``g U + S`` (the ranges of the caps below): both hold
with the round trip, whose ``S / k`` only adds to the period. A bound ``pipe(P_lo, S_lo) + Q_lo`` of a box is
therefore still a lower bound of every objective inside, tighter than ``g P_lo + S_lo + Q_lo`` where the round
trip binds. Three facts make this fast:

1. ``S(P, Q)`` is a shortest path over (stage, layer) in which stage ``j`` may hold ``[a, i)`` only when
   ``a >= lo_j(i)``: layer times, bytes and tensors are non-negative, so a range's time and sync grow with it
   (the sync's two terms each do, and ``c_j, l_j >= 0``) and the allowed starts form a window ``[lo_j(i), i - 1]``
   (boundaries whose floor exceeds ``P`` are masked). Shared parameters (tied embeddings) count once per range,
   with the group's first layer in the range (as the time model counts them): the sync then still grows with
   the range where a group's later layers hold no more bytes and tensors than its first, as tied copies do;
   where a later one holds more, dropping the first from the range adds the difference, the windows' premise
   fails, and the search may miss the optimum (the profiles the project writes tie no such layers:
   ``profile --time`` ties none, AMP's GPT-2 importer ties a logits layer no larger than its embedding). With
   ``t_j(a, i) = p_j(i) - p_j(a)`` (prefix sums), ``f_j(i) = p_j(i) + min_{a in window} (f_{j-1}(a) - p_j(a)
   + e_j(a))``: a minimum over a window, for all ``i`` in one numpy pass (``reduceat`` or a sparse table);
   the windows come from a binary search over all ends at once. ``O(k L log L)`` per evaluation (cost note
   below), and a batch of caps in one pass.
2. ``S`` is non-increasing in both caps, and the cut found at ``(P, Q)`` has its own maxima ``(P', Q') <= (P,
   Q)`` with the same sum: every ``(P'', Q'')`` with ``P' <= P'' <= P`` and ``Q' <= Q'' <= Q`` is dominated by
   ``(P', Q')``. One evaluation therefore removes a quadrant of the candidate box; more generally a known cut
   of sum ``S_c`` dominates the quadrant above its maxima in any box whose sums are all ``>= S_c``, and an
   infeasible evaluation kills the quadrant below its caps.
3. Within a box of candidates ``[P_lo, P_hi] x [Q_lo, Q_hi]`` cut out of a parent whose sum was ``S``, no
   objective is below ``pipe(P_lo, S) + Q_lo`` (``>= g P_lo + Q_lo + S``). Boxes are searched best bound
   first and halved along the side over which that bound varies most before evaluation (a binary search on
   the bottleneck; with one micro-batch ``g`` is tiny and the sync side goes first), so the search stops as
   soon as the best bound left cannot beat the best cut found.

Before the boxes: two incumbents (the least sum without caps, whose sum bounds every sum, and stages of equal
time) bound the caps a better cut can have, so only candidates in that range are built; then a binary search
finds the least feasible ``P`` (any ``Q``) and the least feasible ``Q`` (any ``P``), below which all is dead.

The search is exact: every candidate pair is either evaluated, dominated or bounded out.

[Note: bottleneck search cost] What the search costs at worst, and why that is not ``O(k L^2)``.

*One evaluation* of ``S(P, Q)`` costs ``O(k L log L)``: the windows' starts by a binary search over all ends,
``O(L log L)`` per distinct stage cost vector and sync (factor, latency) pair; per stage the window minima
either by ``reduceat`` (``O(L w)``) or by a sparse table (``O(L log w)``), whichever is cheaper for those
windows (both give the same floats, a minimum being exact:
:class:`~hybridplan.search.time.window_minima._WindowMinima`); the traceback ``O(k w)``.

*The number of evaluations* ``E`` is at most ``1 + |C_P| |C_Q|``, with ``C_P`` the candidate bottlenecks in
``[p_floor, p_max]`` and ``C_Q`` the candidate syncs up to ``q_max`` (and 0). Proof: after the first
evaluation (no caps), the binary searches and the boxes evaluate only at pairs ``(ps[i], qs[j])`` of candidates,
through ``seen``, a cache keyed by the pair, so no pair is evaluated twice; and the search ends, since a popped
box is either dropped or evaluated at its top corner ``(ph, qh)``, and the boxes it leaves (``P < ps[pu]`` or
``Q < qs[qu]``, with ``pu <= ph`` and ``qu <= qh``) lie inside it without that corner. Without a sync term
(``|C_Q| = 1``) the search stops after :data:`SWEEP_AFTER` evaluations and computes ``S(P)`` of every
candidate ``P`` left, ascending, in batches of caps (one numpy pass per stage for the batch,
:meth:`~hybridplan.search.time.cut_problem._Problem.sums`; batches past ``pipe(P, least sum) >= best`` are
skipped, and each batch's best cap is evaluated for its cut): again each candidate at most once, with numpy
instead of Python setting the pace.
``|C_P| <= L + D L (L + 1) / 2`` with ``D`` the distinct (stage cost vector, boundary floors) pairs of stages
1 .. k-1 (stage 0 only holds prefixes), and ``|C_Q| <= 1 + F L (L + 1) / 2`` with ``F`` the distinct sync
(factor, latency) pairs. So the whole search costs, at worst, ``O(D k L^3 log L)`` without a sync term
(``O(k L^3 log L)`` on one device type) and ``O(D F k L^5 log L)`` with one; on the plan search's inputs ``E``
is about 20.

*Why not* ``O(k L^2)``. The tied-corners family (tests/search/time/test_bottleneck_cuts.py,
benchmarks/search_time/worst_case.py) makes ``Theta(L^2)`` cuts tie up to noise: layer times about 1 (all range
sums distinct), three or more stages, and boundary costs ``e_0(m) = g p(m)`` and ``e_1(m') = g (p(L) - p(m'))``
that pay back ``g`` times the middle stage's time ``p(m') - p(m)``, so that every cut whose middle stage is the
slowest costs ``g p(L)`` plus the noise. Each is the least-sum cut for the caps from its own bottleneck ``B_c``
up to the next one, so an evaluation reveals one of them, and the bound the other evaluations give it (``g B_c +
S(B_next)``, ``g (B_next - B_c)`` below ``g p(L)``) cannot exclude it: a search that learns ``S`` by evaluating
it must evaluate at a cap of each, ``Omega(L^2)`` evaluations reading ``Theta(k L)`` table entries each,
``Omega(k L^3)``, which the search reaches up to the ``log L``. A second tie on the sync, on other stages,
multiplies the corners (``Theta(L^4)``: the ``|C_P| |C_Q|`` above). The programs that do not evaluate cap by cap
are no cheaper at worst: AMP's carries the tolerance, ``O(k L^2 |C_P|) = O(k L^4)`` (no sync); one carrying the
Pareto set of (bottleneck, sum) per (stage, end) holds ``Theta(L)`` labels per state on this family and up to
``|C_P|`` in general, ``O(k L^2 |C_P|)`` as well. benchmarks/search_time (worst case) measures both searches
on these families; the search stays exact on every one (the tests against AMP's program and brute force).

[Note: cutting within memory] With ``starts`` (per stage ``j`` and end ``i``, the least start ``m_j(i)`` of the
ranges ``[a, i)`` that stage may hold) the search keeps to the cuts whose every stage starts in its memory
window ``[m_j(i), i - 1]``: fact 1's windows become ``[max(lo_j(i), m_j(i)), i - 1]`` (stage 0 still starts at
0), so ``S(P, Q)`` is the least sum over the cuts that fit the caps *and* memory, still non-increasing in both
caps, and the cut it returns still has its own maxima under the caps: facts 2 and 3, and the search's
exactness, hold over that set of cuts (the incumbents are taken from it: the least sum without caps, and the
balanced cut only where it fits). Nothing else changes, and without ``starts`` nothing at all. The windows are
the caller's: search/time/feasibility.py ``Feasibility.stage_windows`` takes ``m_j(i)`` as the least ``a``
whose every ``[a', i)``, ``a <= a' < i``, is predicted to fit stage ``j``'s devices (at its position in the
pipeline), the largest contiguous window of fitting starts. That is every fitting start wherever a stage's
predicted memory does not fall as its range grows (a range's parameters and activations only add), and so the
cut is then the fastest of the cuts that fit; where the prediction is not monotone (a loss head whose backward
floor a longer range hides, measurement noise between spans), a fitting range beyond a non-fitting one is left
out: the cut found then fits but may not be the fastest that does. tests/search/time/test_bottleneck_cuts.py
checks it against every cut whose stages all fit. :func:`~hybridplan.search.time.period_cut.bottleneck_min_max` (2BW's period) takes the same
windows; AMP's program (``cuts="amp"``, the reference) does not, and the throughput search then cuts no strategy
again (search/time/throughput.py: a strategy is cut within memory where its fastest cut does not fit, and with
stage options where some stage fits under none).

[Note: 2BW's cut with the sync and the step] A schedule that never flushes (PipeDream-2BW) pays ``gas`` periods
per iteration, ``pipe(U, S) = gas max(U, S / k)`` (the fill once per run: predict/time_model.py), and the time model
adds the sync and the step to it as for the others. The search above needs of ``pipe`` that it grows with ``U`` and
``S`` and bounds the objective from below by a line ``g U + w S + Q``: here ``g = gas`` and ``w`` the fill's
tie-break weight (1e-9, as :func:`~hybridplan.search.time.period_cut.bottleneck_min_max` breaks ties), so the caps' ranges and the boxes' bounds hold
as they are, and the same search (``flush=False``) cuts 2BW for its period, sync and step together.
:func:`~hybridplan.search.time.period_cut.bottleneck_min_max`, the period alone, stays where there is neither (one data replica, no measured step).
On test_throughput.py's random cases under 2BW (seeds 0-1999, no ZeRO, a measured step), the cut for the period
alone was slower in 134 (6.7%), by up to 75.7%; checked against every cut there and in test_bottleneck_cuts.py.

[Note: the optimizer step's maximum] The time model closes an iteration with the slowest stage's optimizer step
(``max_j r_j``, ``r_j`` the stage's seconds per parameter byte times its range's bytes: predict/time_model.py,
search/time/step_costs.py), a third maximum beside the bottleneck and the sync. Like the sync it grows with the
range, so a cap ``R`` on it is a window per stage and end (the least start whose range steps within ``R``),
which :func:`bottleneck_assignment` combines with the memory windows and hands to the search above: ``O(R)`` =
the least pipeline term plus sync over the cuts whose every step is at most ``R``, non-increasing in ``R``. The
optimum is ``min_R O(R) + R`` over the values a stage's step can take, found with the caps taken downwards from
none: the cut found under ``R`` steps ``R' <= R`` and is also the best under every cap in ``[R', R]`` (it lies
in them, and they hold fewer cuts), so the next cap is the largest value below ``R'``; the cap at or above the
optimum's own step and nearest it is reached, and there the cut found is no slower than the optimum. The caps
stop when ``O(R)`` alone reaches the best found (a lower cap only raises it, and the step is at least 0) or no
cut is left: on the plan search's cases a few searches, where the step is small beside the pipeline. Checked
against every cut (tests/search/time/test_bottleneck_cuts.py, test_throughput.py with a measured step). On
test_throughput.py's random cases with a measured step (seeds 0-1999: 3 to 7 layers of 1 to 5 ms, up to 10 MB of
parameters each, 0.01 to 10 ns per byte, random ZeRO levels), the cut that left the step out was slower in 64
(3.2%), by up to 39.3%. A window keeps only starts whose every later start also steps within the cap
(:meth:`~hybridplan.search.time.step_costs.StepCosts.starts`): a tied layer's copy makes two ranges a last bit apart,
and a window of the first start within the cap once held a later one above it (seed 1167: the same cut at every
cap, without end).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import overload

import numpy as np

from hybridplan.errors import PlanError
from hybridplan.predict.time_model import pipeline_seconds_from
from hybridplan.search.time.cut_problem import _Problem
from hybridplan.search.time.stage_cuts import _SINGLE_MICROBATCH_WEIGHT, Assignment, _check
from hybridplan.search.time.step_costs import StepCosts
from hybridplan.search.time.sync_costs import SyncCosts

__all__ = ["bottleneck_assignment", "fitting_starts"]


SWEEP_AFTER = 64
"""Evaluations of the box search after which a search without sync sweeps the candidates left instead (module
note): about three times what the search needs on the plan search's cases (benchmarks/search_time: about 20
per cut), so that the sweep only takes over where corners are many. A choice of speed, not of result: both
are exact: tests/search/time/test_bottleneck_cuts.py sets it to 0, 4 and 64 and finds AMP's optimum each time."""

Pipeline = Callable[[np.ndarray | float, np.ndarray | float], np.ndarray]
"""The pipeline term of cuts from their bottleneck ``max u`` and round trip ``sum (t + e)``: the time model's
(:func:`~hybridplan.predict.time_model.pipeline_seconds_from`), non-decreasing in both (module note)."""

_SWEEP_ELEMENTS = 1 << 18
"""Caps per sweep batch times ``L + 2``: a batch's arrays of about 2 MB each (the sparse table ``log w`` of
them), small against memory and large enough that numpy, not Python, sets the pace."""


class _KnownCuts:
    """The cuts found, as the indices of their maxima ``(pu, qu)`` and their sums: what shrinks a box (module
    note, fact 2). Arrays that grow by doubling, so that shrinking a box is one numpy pass, not a Python loop
    over every cut found (thousands on the adversarial inputs)."""

    def __init__(self) -> None:
        self.size = 0
        self.p, self.q, self.sums = np.zeros(16, dtype=np.intp), np.zeros(16, dtype=np.intp), np.zeros(16)

    def add(self, pu: int, qu: int, total: float) -> None:
        if self.size == len(self.p):
            self.p = np.concatenate((self.p, np.zeros_like(self.p)))
            self.q = np.concatenate((self.q, np.zeros_like(self.q)))
            self.sums = np.concatenate((self.sums, np.zeros_like(self.sums)))
        self.p[self.size], self.q[self.size], self.sums[self.size] = pu, qu, total
        self.size += 1

    def shrink(self, pl: int, ph: int, ql: int, qh: int, total: float) -> tuple[int, int]:
        """The box's top corner once every known cut of sum ``<= total`` has removed what it dominates: ``P >=
        its pu`` where it spans the box's whole ``Q`` side (``qu <= ql``), and likewise ``Q >= qu``."""
        p, q = self.p[: self.size], self.q[: self.size]
        cheaper = self.sums[: self.size] <= total
        ph = min(ph, int(p[cheaper & (q <= ql)].min(initial=ph + 1)) - 1)
        qh = min(qh, int(q[cheaper & (p <= pl)].min(initial=qh + 1)) - 1)
        return ph, qh


def _sweep(problem: _Problem, caps: np.ndarray, pipeline: Pipeline, least_sum: float, best_value: float,
           best_cut: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
    """The best cut among the incumbent and those of ``S(P)`` for every cap ``P`` in ``caps`` (sorted) with
    ``pipeline(P, least_sum) < best_value``: ``S`` of a batch of caps at once
    (:meth:`~hybridplan.search.time.cut_problem._Problem.sums`), then the cut of the batch's best cap, which becomes
    the incumbent and prunes the later batches."""
    rows = max(1, _SWEEP_ELEMENTS // (problem.n + 2))
    for start in range(0, len(caps), rows):
        batch = caps[start : start + rows]
        batch = batch[pipeline(batch, least_sum) < best_value]  # sorted: an empty batch ends the sweep
        if len(batch) == 0:
            break
        values = pipeline(batch, problem.sums(batch, 0.0))
        r = int(np.argmin(values))
        if values[r] < best_value:
            total, cut = problem.evaluate(float(batch[r]), 0.0)
            if cut is not None and problem.value(cut, pipeline)[0] < best_value:
                best_value, best_cut = problem.value(cut, pipeline)[0], cut
    return best_value, best_cut


@overload
def bottleneck_assignment(
    stage_costs: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray], num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None, sync: SyncCosts | None = None, in_flight: int | None = None,
    starts: None = None, step: StepCosts | None = None, flush: bool = True,
) -> Assignment: ...


@overload
def bottleneck_assignment(
    stage_costs: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray], num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None, sync: SyncCosts | None = None, in_flight: int | None = None,
    *, starts: Sequence[np.ndarray] | None, step: StepCosts | None = None, flush: bool = True,
) -> Assignment | None: ...


def bottleneck_assignment(
    stage_costs: Sequence[np.ndarray],
    cut_costs: Sequence[np.ndarray],
    num_microbatches: int,
    cut_floors: Sequence[np.ndarray] | None = None,
    sync: SyncCosts | None = None,
    in_flight: int | None = None,
    starts: Sequence[np.ndarray] | None = None,
    step: StepCosts | None = None,
    flush: bool = True,
) -> Assignment | None:
    """The boundaries minimising the time model's pipeline term (module note): without ``in_flight``
    :func:`~hybridplan.search.time.stage_cuts.assignment_objective` (the optimum of
    :func:`~hybridplan.search.time.stage_cuts.amp_layer_assignment`), with it the round trip of 1F1B too; plus
    ``sync.seconds`` when ``sync`` is given, and ``step.seconds`` when ``step`` is; by branch and bound on the
    bottleneck values.

    Args: as :func:`~hybridplan.search.time.stage_cuts.amp_layer_assignment`; ``sync``: the data-parallel
    gradient all-reduce per stage, bandwidth and per-message latency
    (:class:`~hybridplan.search.time.sync_costs.SyncCosts`), so that the cut
    minimises the whole predicted iteration time of the time model (eq. 4), not only its pipeline term;
    ``in_flight``: the micro-batches the first stage holds at once
    (:func:`~hybridplan.predict.time_model.first_stage_in_flight`; None: as many as there are, GPipe), whose
    round trip bounds the period ([Note: the round trip of 1F1B] in predict/time_model.py); ``starts``: per
    stage, the least start of a range that fits its memory, per end ``i`` (``i``: none fits), so that only cuts
    whose every stage fits are searched ([Note: cutting within memory]; None where no cut fits); ``step``: each
    stage's optimizer step (:class:`~hybridplan.search.time.step_costs.StepCosts`), the slowest of which closes
    the iteration ([Note: the optimizer step's maximum]); ``flush`` False: a schedule that never flushes
    (PipeDream-2BW), its pipeline term ``gas`` periods, the fill breaking ties ([Note: 2BW's cut with the sync and
    the step]). The objective returned is the time model's pipeline term (with one micro-batch, without the
    tie-break weight) plus the sync and the step.

    Raises:
        PlanError: for more stages than layers, mismatched vector lengths or negative layer times.

    Example:
        >>> a = bottleneck_assignment([np.array([1., 1., 2.])] * 2, [np.zeros(3)], num_microbatches=4)
        >>> a.boundaries, a.objective     # stages {0, 1} and {2}: 3 * 2 + 4
        ((0, 2, 3), 10.0)
    """
    if step is None or not any(step.rates):
        return _assignment(stage_costs, cut_costs, num_microbatches, cut_floors, sync, in_flight, starts, flush)
    # [Note: the optimizer step's maximum] the best cut under each cap R of the step, the caps taken downwards
    k = len(stage_costs)
    if len(step.rates) != k or step.range_bytes.shape != (len(stage_costs[0]) + 1,) * 2:
        raise PlanError(f"optimizer step costs need {k} rates and {len(stage_costs[0]) + 1} x"
                        f" {len(stage_costs[0]) + 1} range bytes")
    upper = np.triu(np.ones(step.range_bytes.shape, dtype=bool), 1)
    caps = np.unique(np.concatenate([step.matrix(j)[upper] for j in range(k)]))
    best: tuple[float, tuple[int, ...]] | None = None
    cap = np.inf
    while True:
        windows = [step.starts(j, cap) for j in range(k)]
        if starts is not None:
            windows = [np.maximum(w, np.asarray(s, dtype=np.intp)) for w, s in zip(windows, starts)]
        found = _assignment(stage_costs, cut_costs, num_microbatches, cut_floors, sync, in_flight, windows, flush)
        if found is None:
            break  # no cut steps within this cap (or fits memory): none does within a smaller one
        own = step.seconds(found.boundaries)
        if best is None or found.objective + own < best[0]:
            best = (found.objective + own, found.boundaries)
        # a smaller cap leaves fewer cuts: the rest of the objective only grows, the step is at least 0
        if found.objective >= best[0]:
            break
        below = int(np.searchsorted(caps, min(own, cap), side="left")) - 1  # caps in [own, cap]: this same cut
        if below < 0:
            break
        cap = float(caps[below])
    if best is None:
        if starts is not None:
            return None
        raise PlanError("no cut of the layers into stages has a finite time",
                        fix="check the stage and boundary costs: they must be finite")
    return Assignment(best[1], best[0])


def _assignment(stage_costs: Sequence[np.ndarray], cut_costs: Sequence[np.ndarray], num_microbatches: int,
                cut_floors: Sequence[np.ndarray] | None, sync: SyncCosts | None, in_flight: int | None,
                starts: Sequence[np.ndarray] | None, flush: bool = True) -> Assignment | None:
    """:func:`bottleneck_assignment` without the optimizer step (the module note's search); ``flush`` False:
    PipeDream-2BW's pipeline term ([Note: 2BW's cut with the sync and the step])."""
    problem = _Problem(stage_costs, cut_costs, cut_floors, sync, starts)
    if cut_floors is not None:
        _check(stage_costs, cut_floors)
    # the search's bound: the objective is at least g U + w S + Q (module note: with a flush g = gas - 1 and w = 1;
    # without one g = gas and w the tie-break weight on the fill)
    g = (float(num_microbatches - 1) or _SINGLE_MICROBATCH_WEIGHT) if flush else float(num_microbatches)
    w = 1.0 if flush else _SINGLE_MICROBATCH_WEIGHT

    def exact(u: np.ndarray | float, total: np.ndarray | float) -> np.ndarray:
        """The time model's pipeline term of cuts of bottleneck ``u`` and round trip ``total``."""
        return pipeline_seconds_from(u, total, num_microbatches, flush=flush, in_flight=in_flight)

    def pipeline(u: np.ndarray | float, total: np.ndarray | float) -> np.ndarray:
        """What the search minimises: :func:`exact`, with gas = 1 the tie-break weight on ``u`` too; without a flush
        the fill (paid once per run) breaking ties."""
        if not flush:
            return exact(u, total) + w * np.asarray(total, dtype=float)
        return exact(u, total) + (g - (num_microbatches - 1)) * np.asarray(u, dtype=float)

    # incumbents: the least sum without caps (its sum bounds every sum), and balanced stages
    least_sum, first = problem.evaluate(np.inf, np.inf)
    if first is None and starts is not None:
        return None  # no cut fits the memory windows
    if first is None:
        raise PlanError("no cut of the layers into stages has a finite time",
                        fix="check the stage and boundary costs: they must be finite")
    best_cut = first
    best_value = problem.value(best_cut, pipeline)[0]
    balanced = problem.balanced_cut() if problem.fits(problem.balanced_cut()) else first
    if problem.value(balanced, pipeline)[0] < best_value:
        best_value, best_cut = problem.value(balanced, pipeline)[0], balanced
    # a better cut has g P + Q + w S <= its objective < best with S >= least_sum (the round trip only adds):
    # only caps in these ranges can matter
    # (the slack covers rounding of the sums, so that the optimum's own maxima stay inside)
    slack = 1e-9 * (abs(best_value) + abs(least_sum))
    p_floor = problem.bottleneck_floor() * (1 - 1e-9)
    p_max = (best_value - w * least_sum + slack) / g
    q_max = best_value - w * least_sum - g * p_floor + slack
    ps, qs = problem.candidates((p_floor, p_max), q_max)
    if len(ps) == 0:
        ps = np.array([np.inf])  # unreachable: the incumbent's own bottleneck is in range
    # boxes of candidate indices [pl, ph] x [ql, qh], keyed by a lower bound of every objective inside
    # (the sum of the cut that left the box: a lower bound of every sum inside)
    boxes: list[tuple[float, int, int, int, int, int, float]] = [
        (-np.inf, 0, 0, len(ps) - 1, 0, len(qs) - 1, least_sum)]
    serial = 1
    # dead: (pi, qi) such that no cut fits caps P <= ps[pi] and Q <= qs[qi]
    known = _KnownCuts()

    def learn(cut: tuple[int, ...], total: float) -> tuple[int, int]:
        """Keep a cut found: as the incumbent if it is the best, and (always) for its dominance."""
        nonlocal best_value, best_cut
        value = problem.value(cut, pipeline)[0]
        if value < best_value:
            best_value, best_cut = value, cut
        u, q = problem.maxima(cut)
        pu, qu = int(np.searchsorted(ps, u, side="left")), int(np.searchsorted(qs, q, side="left"))
        known.add(pu, qu, total)
        return pu, qu

    for cut in {best_cut, balanced}:
        learn(cut, problem.value(cut, pipeline)[1])
    seen: dict[tuple[int, int], tuple[float, tuple[int, ...] | None]] = {}

    def least_feasible(count: int, caps: Callable[[int], tuple[int, int]]) -> int:
        """Binary search for the first index whose caps some cut fits (``count`` when none does)."""
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if caps(mid) not in seen:
                seen[caps(mid)] = problem.evaluate(float(ps[caps(mid)[0]]), float(qs[caps(mid)[1]]))
            total, cut = seen[caps(mid)]
            if cut is None:
                lo = mid + 1
            else:
                learn(cut, total)
                hi = mid
        return lo

    # the least feasible bottleneck with any sync, and the least feasible sync with any bottleneck: everything
    # below either is dead, which spares the search one evaluation per box along those edges
    first_p = least_feasible(len(ps), lambda i: (i, len(qs) - 1))
    first_q = least_feasible(len(qs), lambda i: (len(ps) - 1, i))
    dead: list[tuple[int, int]] = [(first_p - 1, len(qs) - 1), (len(ps) - 1, first_q - 1)]
    while boxes:
        if not problem.sync and len(seen) > SWEEP_AFTER:
            # many corners (module note, worst case): every candidate left, in batches, instead of the boxes
            best_value, best_cut = _sweep(problem, ps[first_p:], pipeline, least_sum, best_value, best_cut)
            break
        bound, _, pl, ph, ql, qh, total = heapq.heappop(boxes)
        if bound >= best_value:
            break
        # A known cut of sum S_c <= total (every sum in the box is >= total) beats every cap pair above its own
        # maxima; what earlier evaluations found infeasible lies below a dead corner. Both shrink the box.
        ph, qh = known.shrink(pl, ph, ql, qh, total)
        ql = max([ql] + [qi + 1 for pi, qi in dead if pi >= ph])
        pl = max([pl] + [pi + 1 for pi, qi in dead if qi >= qh])
        if pl > ph or ql > qh or float(pipeline(ps[pl], total)) + float(qs[ql]) >= best_value:
            continue
        if (ph, qh) not in seen:
            seen[ph, qh] = problem.evaluate(float(ps[ph]), float(qs[qh]))
        total, found = seen[ph, qh]
        if found is None:
            # no cut fits the box's largest caps, so none fits any smaller caps
            dead = [(pi, qi) for pi, qi in dead if not (pi <= ph and qi <= qh)] + [(ph, qh)]
            continue
        # what the cut does not dominate: P below its own u, or Q below its own q
        pu, qu = learn(found, total)
        pu, qu = min(pu, ph), min(qu, qh)  # u <= ps[ph] as the caps hold (clamped: progress even so)
        rest = []
        if pu > pl:
            rest.append((pl, pu - 1, ql, qh))
        if qu > ql:
            rest.append((max(pu, pl), ph, ql, qu - 1))
        for a, b, c, d in rest:
            halves = [(a, b, c, d)]
            # halve the side along which the bound varies most (with one micro-batch, g is tiny: Q first)
            if b > a and (d == c or float(pipeline(ps[b], total) - pipeline(ps[a], total)) >= float(qs[d] - qs[c])):
                mid = (a + b) // 2
                halves = [(a, mid, c, d), (mid + 1, b, c, d)]
            elif d > c:
                mid = (c + d) // 2
                halves = [(a, b, c, mid), (a, b, mid + 1, d)]
            for a2, b2, c2, d2 in halves:
                low = float(pipeline(ps[a2], total)) + float(qs[c2])
                if low < best_value:
                    heapq.heappush(boxes, (low, serial, a2, b2, c2, d2, total))
                    serial += 1
    return Assignment(best_cut, problem.value(best_cut, exact)[0])


def fitting_starts(fits: np.ndarray) -> np.ndarray:
    """The memory window of one stage from which of its ranges fit (``fits[a, i]``: ``[a, i)`` fits; ``L x (L +
    1)``, entries ``a >= i`` ignored): per end ``i`` the least ``a`` whose every ``[a', i)``, ``a <= a' < i``,
    fits (``i`` where ``[i - 1, i)`` does not), the ``starts`` of :func:`bottleneck_assignment` ([Note: cutting
    within memory]).

    Example:
        >>> fitting_starts(np.array([[True, True, False], [True, True, True]]))  # [0, 2) does not fit: end 2 from 1
        array([0, 0, 1])
    """
    n = fits.shape[1] - 1
    a = np.arange(n)[:, None]
    unfit = ~np.asarray(fits, dtype=bool) & (a < np.arange(n + 1)[None, :])
    return np.where(unfit, a + 1, 0).max(axis=0, initial=0).astype(np.intp)
