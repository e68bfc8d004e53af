"""Per-stage ZeRO and recompute in the throughput search: the fastest choice per stage that fits, exactly.

AMP's search (search/time/throughput.py) fixes a strategy's stages: their layers, devices and degrees. Each
stage may then also shard its training state over its data replicas (ZeRO-1, 2 or 3, where it has replicas)
and recompute its activations (issue 11). These *options* trade time for memory stage by stage: ZeRO-1 syncs
more and steps less, ZeRO-2/3 add collectives to every micro-batch, recompute adds a forward
([Note: ZeRO and recompute in time] in predict/communication.py); each lowers the stage's peak memory.

[Note: choosing stage options by thresholds]
A stage's option changes only that stage's terms: its per-micro-batch compute ``t_i``, its sync ``s_i``, its
optimizer step ``o_i`` (its per-iteration overhead ``h_i`` does not depend on the option) and its predicted
peak ``m_i`` (a stage is predicted from its own layers, kind and position: predict/memory.py; the chosen plan
is checked whole again). The iteration time is

    ``T = pipeline(t_1..t_p) + max_i s_i + max_i o_i + max_i h_i``

with ``pipeline`` non-decreasing in every ``t_i`` (eq. 5 with the p2p overlap and the round trip of 1F1B: the time
model's own ``pipeline_seconds_of``, which the table's times call, so that a choice is timed exactly as the model
will time the chosen plan; a copy of eq. 5 without the round trip once picked combinations the model finds slower).
So for thresholds ``(S, O)`` the best choice with every ``s_i <= S`` and ``o_i <= O`` takes, per stage, the fitting
option of least ``t_i`` among those within the thresholds; and the fastest combination overall is the best of these
over the ``(S, O)`` that occur (for the optimum ``c*``, the thresholds ``max s(c*)``, ``max o(c*)`` give per stage a
``t_i`` no larger, and maxima no larger: a ``T`` no larger). That is ``|S| |O|`` cheap choices instead of
``options^p`` combinations. For the Pareto objective a memory threshold ``M`` joins them (``m_i <= M``): the fastest
combination under each ``M`` includes every combination on the frontier of (plan peak, ``T``).
tests/search/time/test_stage_options.py checks both against enumerating every combination.

The choice is for a given cut of the layers; the throughput search chooses for a few cuts, the plain stages' one
first ([Note: cutting for the stage options] in search/time/throughput.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hybridplan.plan import Cluster, Plan, StagePlan, spec
from hybridplan.predict.time_model import first_stage_in_flight, pipeline_seconds_of, predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile

__all__ = ["Option", "StagePeaks", "OptionTable", "stage_options", "with_options", "option_table", "choose_options",
           "options_label"]

Option = tuple[int, bool]
"""A stage's (ZeRO level, recompute)."""

StagePeaks = Callable[[Plan], Sequence[float] | None]
"""Per stage of a plan, its predicted peak bytes (the largest of its devices; ``inf`` where a device would exceed
its capacity), or ``None`` where the plan cannot run or be predicted (search/time/feasibility.py)."""


def stage_options(stage: StagePlan, zero_levels: Sequence[int], recompute: bool) -> tuple[Option, ...]:
    """The options of a stage, the plain one first: ZeRO levels only with data replicas (on a data x tensor stage
    too: the runtime shards each tensor rank's shards over its data group, the time model times the collectives
    on them, predict/communication.py, and the memory predictor refuses the ones it cannot predict, which then
    never fit), each with and without recompute when ``recompute``.

    >>> replicas = StagePlan.of(0, 2, (0, 1), data_degree=2, tensor_degree=1)
    >>> stage_options(replicas, (1, 2, 3), True)
    ((0, False), (1, False), (2, False), (3, False), (0, True), (1, True), (2, True), (3, True))
    >>> stage_options(StagePlan.of(0, 2, (0, 1, 2, 3), data_degree=2, tensor_degree=2), (1, 2, 3), False)
    ((0, False), (1, False), (2, False), (3, False))
    >>> stage_options(StagePlan.of(0, 2, (0, 1), data_degree=1, tensor_degree=2), (1, 2, 3), False)
    ((0, False),)
    """
    zeros = [0] + sorted({z for z in zero_levels if z > 0 and stage.data_degree > 1})
    return tuple((z, r) for r in ((False, True) if recompute else (False,)) for z in zeros)


def with_options(plan: Plan, options: Sequence[Option]) -> Plan:
    """``plan`` with each stage's ZeRO level and recompute set."""
    stages = tuple(replace(s, zero=z, recompute="full" if r else "none") for s, (z, r) in zip(plan.stages, options, strict=True))
    return replace(plan, stages=stages)


@dataclass(frozen=True)
class OptionTable:
    """Every stage's options and their terms ([Note: choosing stage options by thresholds]); arrays are
    ``(stages, options)`` over the union of the options, ``inf`` where a stage lacks one or it does not fit."""

    options: tuple[Option, ...]
    compute: np.ndarray
    sync: np.ndarray
    step: np.ndarray
    overhead: np.ndarray
    peak: np.ndarray
    p2p: tuple[float, ...]
    num_microbatches: int
    flush: bool
    in_flight: int
    """Micro-batches the first stage holds at once ([Note: the round trip of 1F1B] in predict/time_model.py)."""

    def times(self, choice: np.ndarray) -> np.ndarray:
        """``T`` of choices, an integer array ``(..., stages)`` of option indices, by the time model's own
        pipeline term (predict/time_model.py ``pipeline_seconds_of``: eq. 5 with the p2p overlap and the round
        trip of 1F1B), so that the choice is timed exactly as the chosen plan will be."""
        rows = np.arange(self.compute.shape[0])
        pipe = pipeline_seconds_of(self.compute[rows, choice], self.p2p, self.num_microbatches, flush=self.flush,
                                   in_flight=self.in_flight)
        out: np.ndarray = (pipe + self.sync[rows, choice].max(axis=-1) + self.step[rows, choice].max(axis=-1)
                           + self.overhead[rows, choice].max(axis=-1))
        return out


def option_table(plan: Plan, profile: TimeProfile, cluster: Cluster, *, zero_levels: Sequence[int], recompute: bool,
                 stage_peaks: StagePeaks | None = None) -> OptionTable:
    """The terms of every stage's options, from one prediction per option applied to every stage that has it.

    Args:
        plan: the plain plan (no ZeRO, no recompute).
        profile, cluster: for the iteration-time terms.
        zero_levels: the ZeRO levels a stage with data replicas may take.
        recompute: whether a stage may recompute.
        stage_peaks: per-stage peaks (None: every option fits, peak 0).
    """
    per_stage = [stage_options(s, zero_levels, recompute) for s in plan.stages]
    options = tuple(dict.fromkeys(o for opts in per_stage for o in opts))
    p, n = plan.num_stages, len(options)
    tables = {name: np.full((p, n), np.inf) for name in ("compute", "sync", "step", "overhead", "peak")}
    p2p: tuple[float, ...] = ()
    for j, option in enumerate(options):
        has = [option in opts for opts in per_stage]
        uniform = with_options(plan, [option if h else (0, option[1]) for h in has])
        timed = predict_iteration_time(uniform, profile, cluster)
        p2p = tuple(s.p2p_s for s in timed.stages[:-1])
        peaks = [0.0] * p if stage_peaks is None else stage_peaks(uniform)
        if peaks is None:
            continue
        for i, (stage, peak) in enumerate(zip(timed.stages, peaks)):
            if has[i] and np.isfinite(peak):
                for name, value in (("compute", stage.compute_s), ("sync", stage.sync_s), ("step", stage.optimizer_s),
                                    ("overhead", stage.overhead_s), ("peak", peak)):
                    tables[name][i, j] = value
    if not p2p and p > 1:
        p2p = tuple(s.p2p_s for s in predict_iteration_time(plan, profile, cluster).stages[:-1])
    return OptionTable(options, tables["compute"], tables["sync"], tables["step"], tables["overhead"], tables["peak"],
                       p2p, plan.num_microbatches, spec(plan.schedule).flushes,
                       first_stage_in_flight(plan.schedule, p, plan.num_microbatches))


def choose_options(table: OptionTable, *, pareto: bool = False) -> list[tuple[Option, ...]]:
    """The fastest combination of stage options that fits ([Note: choosing stage options by thresholds]); with
    ``pareto``, the fastest under every memory threshold (a superset of the frontier of peak and time), by
    increasing peak. Empty when some stage has no option that fits. Of equally fast choices the one of the
    earliest options, stage by stage, wins (plain first: an option is taken only where it pays)."""
    fits = np.isfinite(table.peak)
    if not fits.any(axis=1).all():
        return []
    def levels(values: np.ndarray) -> np.ndarray:
        return np.unique(values[fits])

    memories = levels(table.peak) if pareto else np.array([np.inf])
    syncs, steps = levels(table.sync), levels(table.step)
    out: list[tuple[Option, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for memory in memories:
        ok = (fits & (table.peak <= memory))[None, None]  # (1, 1, p, n)
        ok = ok & (table.sync[None, None] <= syncs[:, None, None, None]) & (table.step[None, None] <= steps[None, :, None, None])
        compute = np.where(ok, table.compute[None, None], np.inf)
        choice = compute.argmin(axis=-1)  # (S, O, p): the first of the least compute
        valid = np.isfinite(compute.min(axis=-1)).all(axis=-1)
        if not valid.any():
            continue
        times = np.where(valid, table.times(choice), np.inf)
        tied = choice[times == times.min()]  # equally fast choices: the earliest options (plain first) win
        key = min(tuple(int(c) for c in row) for row in tied)
        if key not in seen:
            seen.add(key)
            out.append(tuple(table.options[c] for c in key))
    return out


def options_label(plan: Plan) -> str:
    """The stages' options in a candidate's label, e.g. ``" zero=[1,0] recompute=[1,0]"`` ("" when none)."""
    zeros = [s.zero for s in plan.stages]
    recomputes = [int(s.recompute != "none") for s in plan.stages]
    parts = [f"{name}=[{','.join(map(str, values))}]" for name, values in (("zero", zeros), ("recompute", recomputes))
             if any(values)]
    return "".join(" " + part for part in parts)
