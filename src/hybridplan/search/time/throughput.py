"""AMP's throughput search (seed 002 section 3.6, algorithm 1): the fastest plans by predicted iteration time.

For every ``(pp, dp, tp)`` with ``pp * dp * tp`` = the cluster's devices and every micro-batch size ``mbs``
dividing ``global batch / dp``: place ranks (:mod:`hybridplan.search.time.rank_placement`, Megatron's heuristic),
cut the layers into ``pp`` stages so as to minimise the predicted iteration time, the round trip of 1F1B and the
gradient sync (its per-message latency too) included (:mod:`hybridplan.search.time.bottleneck_cuts`; AMP's dynamic
program of :mod:`hybridplan.search.time.stage_cuts` minimises eq. 5 alone, and stays as ``cuts="amp"``), and predict
the iteration time (:mod:`hybridplan.predict.time_model`). Optionally re-place the best few by simulated annealing
over device orderings. Candidates that ``memory_ok`` rejects are dropped; with ``stage_windows`` a strategy
whose fastest cut is rejected is first cut again, the fastest cut whose every stage fits (search/time/
bottleneck_cuts.py, [Note: cutting within memory]). The result is the candidates by predicted time, or
(``objective="pareto"``) the frontier of (peak memory, time).

[Note: uniform strategies as Plans] A strategy is the plan of :meth:`~hybridplan.plan.plan.Plan.uniform`:
AMP's ``dp`` replicas of ``mbs`` samples become a plan whose micro-batch is ``dp * mbs`` samples, split ``dp``
ways by every stage. A plan stage may be "data+tensor", and the cost model times such stages, but neither the
runtime runs them and the memory predictor predicts them from the tensor scenario's statistics; with
``composite=False`` (AMP's space as CAPTURE's plans can express it) the search keeps to strategies with
``dp == 1`` or ``tp == 1`` (``enumerate_degrees(plan_expressible=True)``): every stage is then "data" x dp,
"tensor" x tp, or "none"; ``composite=True`` searches all of AMP's strategies. A stage holds ``dp * tp`` devices
and may span nodes; ``node_local_stages=True`` keeps only plans whose stages each sit in one node (with
``composite``: whose tensor groups each do, as ``Plan.validate(cluster=...)`` requires).

The search depends on no memory model: ``memory_ok(plan) -> bool`` filters, ``peak_memory(plan) -> bytes``
feeds the Pareto objective and ``stage_windows(plan)`` gives each stage's ranges of layers that fit; all come
from the caller (the memory predictor: search/time/feasibility.py).

With ``zero_levels`` and/or ``recompute`` every stage of a strategy's plan may also shard its training state
(ZeRO) and recompute its activations: per stage, the fastest options that fit, chosen exactly
(search/time/stage_options.py, [Note: choosing stage options by thresholds]; the per-stage peaks come from
``stage_peaks``); the Pareto objective keeps the fastest choice under every memory threshold.

[Note: cutting for the stage options] The cut for the plain stages' times may leave a stage that fits only with
an option that slows it, or under none, where another cut fits faster (tests/search/time/test_stage_options.py
has three random cases: 8.7% and 31% slower, and no plan at all). So with stage options a strategy is cut up to
:data:`CUT_ROUNDS` times, options chosen exactly for every cut, the fastest that fits kept (pareto: every
choice, for the frontier): first for the plain stages' times; then for the options chosen on the previous cut
(a recomputed stage's layers cost their forward once more, a ZeRO-2/3 stage's its per-micro-batch collectives
per parameter byte, a ZeRO-1 stage's sync, bandwidth and latency, 1.5 times: [Note: ZeRO and recompute in
time] in predict/communication.py, shared parameters counted per layer there). Where some stage fits under no option,
the next cut is for the options saving the most memory with that stage's layer times weighted twice as much
(again each round it does not fit; when another stage stops fitting instead, the step shrinks to its square
root: layers moved back and forth), which moves layers off it; once a cut fits, the weights go halfway back to
1 (in ratio), towards the least move that fits. It stops when a cut repeats with every stage fitting. The plain
cut being the first, the result is never slower than the plain cut's. It is a heuristic, not the optimum over
every cut and combination. Against enumerating every strategy, cut and option combination on the tests' random
cases (tests/search/time/test_stage_options.py ``_random_case`` and ``_fastest_by_enumeration``: seeds 0-299
with 3 to 5 layers, and the 239 of seeds 0-599 with 6 or 7 layers, on 2 or 4 devices) it found a slower plan
in one, seed 461 (7 layers, 4 stages), by 0.38%: the best plain cut fits under no option and the re-cut settles
on a fitting cut other than the fastest fitting one. (An earlier miss, 1.2% on a case where the plain cut fits,
came from the cut's objective leaving out the round trip of 1F1B, [Note: the round trip of 1F1B] in
predict/time_model.py; the cut now minimises the time model's own pipeline term: [Note: bottleneck search].)
With ``stage_windows`` one more cut closes that gap: where some cut left a stage that fits under no option, the
fastest cut whose every stage fits under its option saving the most memory (the bottleneck cut within memory
windows, [Note: cutting within memory] in search/time/bottleneck_cuts.py, timed for those options), its options
then chosen exactly as for every cut. Some plan of the strategy then fits wherever one does, as long as the
last option of :func:`~hybridplan.search.time.stage_options.stage_options` (the highest ZeRO level, recomputed)
needs no more than the others and memory grows with a stage's range; on the cases above it found the
enumeration's plan in all 539, seed 461 included, and in all 2,400 of seeds 600-2999 (3 to 7 layers), where
the re-cuts alone missed in 9: 5 with no plan, 4 slower by 0.47% to 42% (tests/search/time/test_stage_options.py
``test_with_windows_the_fastest_plan_that_fits_on_random_cases``, marked slow; ``-s`` prints them). Still not an exact search over
every cut and combination: the window cut is the fastest for the most saving options, and faster options on
another fitting cut may beat it. Without stage options the window cut is exact (a strategy's fastest plan that
fits, where the windows hold every fitting range); it runs only when ``memory_ok`` rejects the fastest cut, so
the common case costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from hybridplan.errors import UsageError
from hybridplan.plan import SCHEDULES, Cluster, Plan
from hybridplan.predict.time_breakdown import TimeBreakdown
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.search.progress import Progress, ProgressCallback
from hybridplan.search.time.stage_cuts import Assignment
from hybridplan.search.time.stage_options import (
    Option,
    StagePeaks,
    choose_options,
    option_table,
    options_label,
    stage_options,
    with_options,
)
from hybridplan.search.time.rank_placement import anneal_placement, megatron_placement
from hybridplan.search.time.strategy_cut import CutAlgorithm, assign_layers, parameter_range_bytes, parameter_range_tensors

__all__ = [
    "ThroughputCandidate",
    "ThroughputSearchResult",
    "divisors",
    "enumerate_degrees",
    "supported_tensor_degrees",
    "pareto_frontier",
    "search_throughput",
]

MemoryOk = Callable[[Plan], bool]
PeakMemory = Callable[[Plan], float]
StageWindows = Callable[[Plan], Sequence[np.ndarray] | None]
"""Per stage of a strategy's plan (its stages' kinds, degrees, devices, positions and options; the layers as cut),
the least start of a range of layers that fits the stage's memory, per end ``i = 0 .. L`` (``i``: none does):
the ``starts`` of search/time/bottleneck_cuts.py's [Note: cutting within memory]. ``None`` where the strategy
cannot be predicted (search/time/feasibility.py ``Feasibility.stage_windows``)."""
CUT_ROUNDS = 4
"""At most this many cuts per strategy with stage options ([Note: cutting for the stage options]); each costs a
cut and an option table (one prediction of time and peaks per option)."""


@dataclass(frozen=True)
class ThroughputCandidate:
    """One evaluated strategy."""

    plan: Plan
    predicted: TimeBreakdown
    pipeline_degree: int
    data_degree: int
    tensor_degree: int
    micro_batch_size: int
    """AMP's mbs: samples per micro-batch of ONE data replica (the Plan's micro-batch is ``dp`` times this)."""
    peak_memory_bytes: float | None = None

    @property
    def iteration_s(self) -> float:
        """Predicted seconds per iteration."""
        return self.predicted.total_s


@dataclass(frozen=True)
class ThroughputSearchResult:
    """Candidates, best first (by time; or the Pareto frontier by increasing memory), and search statistics."""

    candidates: tuple[ThroughputCandidate, ...]
    objective: str
    evaluated: int
    """Strategies whose time was predicted (annealing moves included)."""
    rejected_by_memory: int
    seconds: float
    """Wall-clock planning time."""

    @property
    def best(self) -> ThroughputCandidate:
        """The fastest candidate.

        Raises:
            UsageError: if every strategy was rejected.
        """
        if not self.candidates and self.evaluated == 0:
            raise UsageError(
                "no strategy to evaluate: no (pp, dp, tp, micro-batch size) fits the devices, the layers and the"
                " global batch (pp at most the layers, dp dividing the global batch)",
                fix="use fewer devices (e.g. a smaller --cluster), or a global batch divisible by more data degrees",
            )
        if not self.candidates:
            raise UsageError(
                f"no feasible plan: {self.rejected_by_memory} of {self.evaluated} strategies were rejected by the memory check",
                fix="use more devices, a smaller global batch, or a model that fits",
            )
        return min(self.candidates, key=lambda c: c.iteration_s)

    def table(self, top: int = 10) -> str:
        """Terminal table of the first ``top`` candidates."""
        lines = [f"{'#':>3} {'pp':>3} {'dp':>3} {'tp':>3} {'mbs':>4} {'time s':>8} {'memory':>10}  boundaries"]
        for i, c in enumerate(self.candidates[:top]):
            mem = "-" if c.peak_memory_bytes is None else f"{c.peak_memory_bytes / 2**30:.2f} GiB"
            lines.append(
                f"{i + 1:>3} {c.pipeline_degree:>3} {c.data_degree:>3} {c.tensor_degree:>3} {c.micro_batch_size:>4}"
                f" {c.iteration_s:>8.3f} {mem:>10}  {list(c.plan.boundaries)}{options_label(c.plan)}"
            )
        lines.append(
            f"{self.evaluated} strategies evaluated, {self.rejected_by_memory} rejected by memory, {self.seconds:.3f} s"
        )
        return "\n".join(lines)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_degrees(
    num_devices: int, num_layers: int, tensor_degrees: Sequence[int], *, plan_expressible: bool = True
) -> list[tuple[int, int, int]]:
    """Every ``(pp, dp, tp)`` with ``pp * dp * tp == num_devices``, ``pp <= num_layers``, ``tp`` in
    ``tensor_degrees`` and, when ``plan_expressible``, not both ``dp > 1`` and ``tp > 1`` (module note)."""
    out = []
    for tp in sorted(set(tensor_degrees)):
        if num_devices % tp:
            continue
        for pp in divisors(num_devices // tp):
            dp = num_devices // (tp * pp)
            if pp <= num_layers and not (plan_expressible and dp > 1 and tp > 1):
                out.append((pp, dp, tp))
    return out


def supported_tensor_degrees(profile: TimeProfile, cluster: Cluster) -> tuple[int, ...]:
    """Tensor degrees the profile has for every device type of the cluster (unprofiled types use the
    reference type's)."""
    types = {d.type if d.type in profile.device_types else profile.reference_device_type for d in cluster.devices}
    common = set.intersection(*(set(profile.tensor_degrees(t)) for t in types))
    return tuple(sorted(common))


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (both minimised), by increasing first
    coordinate. Of identical points the first is kept.

    Example:
        >>> pareto_frontier([(1, 5), (2, 3), (2, 4), (3, 3), (4, 1)])
        [0, 1, 4]
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    frontier, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            frontier.append(i)
            best = points[i][1]
    return frontier


def _node_local(cluster: Cluster, devices: Sequence[int], stage_size: int) -> bool:
    return all(
        len({cluster.node_of(d) for d in devices[s : s + stage_size]}) == 1 for s in range(0, len(devices), stage_size)
    )


def search_throughput(
    profile: TimeProfile,
    cluster: Cluster,
    global_batch_size: int,
    *,
    objective: Literal["time", "pareto"] = "time",
    memory_ok: MemoryOk | None = None,
    peak_memory: PeakMemory | None = None,
    placement: Literal["megatron", "anneal"] = "megatron",
    anneal_iterations: int = 200,
    anneal_top: int = 3,
    seed: int = 0,
    node_local_stages: bool = False,
    schedule: str = "1f1b",
    composite: bool = False,
    progress: ProgressCallback | None = None,
    cuts: CutAlgorithm = "bottleneck",
    zero_levels: Sequence[int] = (),
    recompute: bool = False,
    stage_peaks: StagePeaks | None = None,
    stage_windows: StageWindows | None = None,
) -> ThroughputSearchResult:
    """AMP's search over ``(pp, dp, tp, mbs)`` (module docstring).

    Args:
        profile: the model's layer times.
        cluster: the devices to fill, all of them.
        global_batch_size: samples per iteration.
        objective: "time" (fastest first) or "pareto" (frontier of peak memory and time; needs ``peak_memory``).
        memory_ok: keeps a plan when it returns True (default: every plan fits).
        peak_memory: predicted peak bytes of a plan, for the Pareto objective.
        placement: "megatron" (AMP's default) or "anneal" (also anneal the best ``anneal_top`` strategies'
            device orderings, ``anneal_iterations`` moves each, from ``seed``).
        node_local_stages: keep only plans whose every stage sits in one node (with ``composite``: whose every
            tensor group does; the replicas of a stage may then be on several nodes).
        composite: also AMP's strategies with both dp > 1 and tp > 1 (stages of data x tensor devices).
        schedule: the Plan schedule to write and time ("1f1b", "gpipe", "flush", or "2bw", which has no flush;
            AMP's runs use DeepSpeed's 1F1B).
        cuts: how each strategy's stages are cut (:data:`~hybridplan.search.time.strategy_cut.CutAlgorithm`; "amp": the reference, slow at scale).
        zero_levels: ZeRO levels (of 1, 2, 3) each stage with data replicas may take (module docstring).
        recompute: each stage may recompute its activations.
        stage_peaks: per-stage predicted peaks for the choice of those options (default: every option fits;
            ``memory_ok`` still checks the chosen plan).
        stage_windows: per stage, the ranges of layers that fit its memory (:data:`StageWindows`): a strategy whose
            fastest cut ``memory_ok`` rejects is cut again within them ([Note: cutting within memory] in
            search/time/bottleneck_cuts.py; ``cuts="bottleneck"`` only). Default: such a strategy is dropped.
        progress: receives a line now and then on a long search, e.g. ``"throughput search: strategy 3/12
            (pp 4, dp 2, tp 1), 40 evaluated, 3.0 s"`` (:mod:`~hybridplan.search.progress`); ``None``: silent.

    Raises:
        UsageError: for a bad objective, placement or batch size.

    Example:
        >>> from hybridplan.profiling.layer_info import LayerInfo
        >>> from hybridplan.profiling.timing_table import TimingTable
        >>> p = TimeProfile(model="toy", layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1e3,
        ...     parameter_bytes=1e6) for i in range(4)), timings=(TimingTable(device_type="cpu", tensor_degree=1,
        ...     micro_batch_size=1, forward_s=(1e-3,) * 4, backward_s=(2e-3,) * 4),))
        >>> result = search_throughput(p, Cluster.uniform(1, 2), 8)
        >>> (result.best.pipeline_degree, result.best.data_degree) in {(1, 2), (2, 1)}
        True
    """
    start = time.perf_counter()
    if objective not in ("time", "pareto"):
        raise UsageError(f"unknown objective {objective!r}", fix="use 'time' or 'pareto'")
    if objective == "pareto" and peak_memory is None:
        raise UsageError("the Pareto objective needs a peak_memory callback", fix="pass peak_memory=lambda plan: bytes")
    if placement not in ("megatron", "anneal"):
        raise UsageError(f"unknown placement {placement!r}", fix="use 'megatron' or 'anneal'")
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise UsageError(f"global batch size must be a positive integer, got {global_batch_size!r}")
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}", fix=f"use one of {list(SCHEDULES)}")
    if cuts not in ("bottleneck", "amp"):
        raise UsageError(f"unknown stage-cut algorithm {cuts!r}", fix="use 'bottleneck' or 'amp'")
    if any(isinstance(z, bool) or z not in (1, 2, 3) for z in zero_levels):
        raise UsageError(f"ZeRO levels must be among 1, 2, 3, got {list(zero_levels)!r}", fix="e.g. zero_levels=(1, 3)")
    with_stage_options = bool(zero_levels) or recompute
    report = Progress.of(progress)
    evaluated = rejected = 0
    cache: dict[bytes, Assignment | None] = {}
    range_bytes, range_tensors = parameter_range_bytes(profile), parameter_range_tensors(profile)

    def cut(devices: Sequence[int], pp: int, dp: int, tp: int, mbs: int, options: Sequence[Option] | None = None,
            weights: Sequence[float] | None = None) -> Plan:
        return assign_layers(profile, cluster, devices, pipeline_degree=pp, data_degree=dp, tensor_degree=tp,
                             micro_batch_size=mbs, global_batch_size=global_batch_size, cache=cache, schedule=schedule,
                             cuts=cuts, range_bytes=range_bytes, range_tensors=range_tensors, options=options, weights=weights)

    def fitting_cut(plan: Plan, devices: Sequence[int], pp: int, dp: int, tp: int, mbs: int,
                    options: Sequence[Option] | None = None) -> Plan | None:
        """The fastest cut of ``plan``'s strategy whose every stage fits (:data:`StageWindows`; with ``options``,
        under them, timed for them), None where no cut does, or without windows."""
        starts = None
        if stage_windows is not None and cuts == "bottleneck":
            starts = stage_windows(plan if options is None else with_options(plan, options))
        if starts is None:
            return None
        return assign_layers(profile, cluster, devices, pipeline_degree=pp, data_degree=dp, tensor_degree=tp,
                             micro_batch_size=mbs, global_batch_size=global_batch_size, cache=cache, schedule=schedule,
                             cuts=cuts, range_bytes=range_bytes, range_tensors=range_tensors, options=options,
                             starts=starts)

    def evaluate(devices: Sequence[int], pp: int, dp: int, tp: int, mbs: int) -> list[ThroughputCandidate]:
        """The strategy's candidates: its plan, or with stage options the fastest choice over the cuts of
        [Note: cutting for the stage options] (pareto: under every memory threshold); empty where none is kept."""
        nonlocal evaluated, rejected
        plan = cut(devices, pp, dp, tp, mbs)
        evaluated += 1
        plans = [plan]
        if with_stage_options:
            plans = []
            weights, step, last_unfit = np.ones(pp), 2.0, np.zeros(pp, dtype=bool)
            seen: dict[tuple[int, ...], tuple[list[tuple[Option, ...]], np.ndarray]] = {}

            def choose(plan: Plan) -> None:
                """The options of this cut, exactly; its fastest choice and the stages that fit under none kept."""
                table = option_table(plan, profile, cluster, zero_levels=zero_levels, recompute=recompute,
                                     stage_peaks=stage_peaks)
                fastest = choose_options(table)
                chosen = choose_options(table, pareto=True) if objective == "pareto" else fastest
                plans.extend(with_options(plan, c) for c in chosen)
                seen[plan.boundaries] = fastest, ~np.isfinite(table.peak).any(axis=1)

            for _ in range(CUT_ROUNDS):
                if plan.boundaries not in seen:
                    choose(plan)
                elif not seen[plan.boundaries][1].any():
                    break  # the cut for these options is one already chosen for
                fastest, unfit = seen[plan.boundaries]
                # the next cut: for the options chosen here, or where some stage fits under no option, for the
                # options saving the most memory, with that stage's layer times doubled; once a cut fits, the
                # weights go halfway back to 1 (in ratio), towards the least move of layers that fits
                if unfit.any() and last_unfit.any() and (unfit != last_unfit).any():
                    step = np.sqrt(step)  # layers moved back and forth: a smaller step
                weights = np.where(unfit, step * weights, weights) if unfit.any() else np.sqrt(weights)
                last_unfit = unfit
                options = fastest[0] if fastest else [stage_options(s, zero_levels, recompute)[-1] for s in plan.stages]
                plan = cut(devices, pp, dp, tp, mbs, options, tuple(weights))
            if any(unfit.any() for _, unfit in seen.values()):
                # some cut left a stage that fits under no option: also the fastest cut whose every stage fits
                # under its option saving the most memory ([Note: cutting for the stage options])
                saving = [stage_options(s, zero_levels, recompute)[-1] for s in plan.stages]
                fitting = fitting_cut(plan, devices, pp, dp, tp, mbs, saving)
                if fitting is not None and fitting.boundaries not in seen:
                    choose(fitting)
        kept = [ThroughputCandidate(p, predict_iteration_time(p, profile, cluster), pp, dp, tp, mbs)
                for p in plans if memory_ok is None or memory_ok(p)]
        if not kept and not with_stage_options and memory_ok is not None:
            # the fastest cut does not fit: the fastest that does ([Note: cutting within memory])
            fitting = fitting_cut(plan, devices, pp, dp, tp, mbs)
            if fitting is not None and fitting.boundaries != plan.boundaries and memory_ok(fitting):
                kept = [ThroughputCandidate(fitting, predict_iteration_time(fitting, profile, cluster), pp, dp, tp, mbs)]
        if not kept:
            rejected += 1
        if objective == "time" and kept:
            kept = [min(kept, key=lambda c: c.iteration_s)]  # one candidate per strategy (the first of equals)
        return kept

    found: list[ThroughputCandidate] = []
    strategies = enumerate_degrees(cluster.num_devices, profile.num_layers, supported_tensor_degrees(profile, cluster),
                                   plan_expressible=not composite)
    for i, (pp, dp, tp) in enumerate(strategies, 1):
        if global_batch_size % dp:
            continue
        devices = megatron_placement(cluster, pp, dp, tp)
        if node_local_stages and not _node_local(cluster, devices, tp if composite else dp * tp):
            continue
        for mbs in divisors(global_batch_size // dp):
            if schedule == "2bw" and global_batch_size // (dp * mbs) < pp:
                continue  # 2BW's two weight versions cover the in-flight micro-batches only if m >= pp (pipedream_2bw.py)
            if report.due():
                report.update(f"throughput search: strategy {i}/{len(strategies)} (pp {pp}, dp {dp}, tp {tp},"
                              f" micro-batch size {mbs}), {evaluated} evaluated")
            found.extend(evaluate(devices, pp, dp, tp, mbs))
    found.sort(key=lambda c: c.iteration_s)

    if placement == "anneal":
        annealed = found[:anneal_top]
        for rank, c in enumerate(annealed):
            degrees = (c.pipeline_degree, c.data_degree, c.tensor_degree, c.micro_batch_size)
            size = c.data_degree * c.tensor_degree

            def cost(devices: tuple[int, ...], degrees: tuple[int, int, int, int] = degrees,
                     rank: int = rank) -> float:
                if report.due():
                    report.update(f"throughput search: annealing the placement of candidate {rank + 1}"
                                  f"/{len(annealed)}, {evaluated} evaluated")
                return min((c.iteration_s for c in evaluate(devices, *degrees)), default=float("inf"))

            group = c.tensor_degree if composite else size
            allowed = (lambda d, group=group: _node_local(cluster, d, group)) if node_local_stages else None
            start_devices = tuple(d for s in c.plan.stages for d in s.devices)  # rank order
            devices, _ = anneal_placement(cost, start_devices, iterations=anneal_iterations, seed=seed + rank, allowed=allowed)
            found.extend(b for b in evaluate(devices, *degrees) if b.iteration_s < c.iteration_s)
        found.sort(key=lambda c: c.iteration_s)

    if objective == "pareto" and peak_memory is not None:
        found = [replace(c, peak_memory_bytes=float(peak_memory(c.plan))) for c in found]
        keep = pareto_frontier([(c.peak_memory_bytes or 0.0, c.iteration_s) for c in found])
        found = [found[i] for i in keep]
    return ThroughputSearchResult(tuple(found), objective, evaluated, rejected, time.perf_counter() - start)
