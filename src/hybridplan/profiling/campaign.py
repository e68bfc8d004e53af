"""The profiling campaign: run the profiling partitionings, record them, and derive the statistics.

For each profiled batch size (by default half and a quarter of the target global batch, seed 000
III-A2, with the target's micro-batch count) and each scenario (pipeline-only; data- and
tensor-parallel at degrees 2 and 4 where the nodes have that many devices and the layers can be
split), the campaign packs the spans still to measure into runs (profiling/partitions.py), runs each
on the runtime for two iterations, and writes every device's measurement to the database the moment
the run ends. Progress goes to ``progress`` (runs done/total, time left). Before the first run it records the
tables computed without running the model (profiling/auxiliary_tables.py).

Resuming: a run is identified by its scenario, batch size and plan; a campaign started again on the
same database skips every run it finds there and continues where it stopped, however the first one ended
(SIGTERM, SIGINT, SIGKILL, power loss: each run's rows are one transaction, profiling/store.py). A run whose
ranks were stopped by SIGINT or SIGTERM from outside (the campaign's process group ended) is run again, not
counted as a failure of its plan; recorded again, it replaces its earlier record.

Failures (mCAP substituted partitionings by hand; here it is automatic): a span whose stage ran out of
memory is replaced by the smallest spans that yield the same statistic (``M_a(l)`` from ``l-1..l``
instead of a longer chain); a filler that ran out of memory makes later runs split gaps into more
fillers; a run that failed otherwise is retried once. Statistics that stay unmeasurable are reported
by name and make the predictor refuse plans that need them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.models.base import parameter_shapes
from hybridplan.plan import Plan, Schedule, as_schedule
from hybridplan.plan import StagePlan
from hybridplan.profiling.auxiliary_tables import record_auxiliary_tables
from hybridplan.profiling.campaign_sizes import (check_scenarios, default_scenarios, no_zero_note, profiled_batch_sizes,
                                                 replica_batch_sizes, sizes_of)
from hybridplan.profiling.merger import LayerGroups, merge_layers
from hybridplan.profiling.partitions import ProfilingRun, Scenario, Span, default_neighbors, pack_run, required_spans
from hybridplan.profiling.execution import failed_stage, interrupted, measurements_of, run_plan, simulate_stages
from hybridplan.profiling.statistics import anchor_of, statistics_of
from hybridplan.profiling.stage_memo import LAYER_CLASSES_META, StageMemo
from hybridplan.profiling.store import ProfileStore
from hybridplan.models.boundaries import boundary_specs

if TYPE_CHECKING:
    from hybridplan.runtime.config import RunConfig

__all__ = ["CampaignConfig", "Campaign", "CampaignSummary", "default_scenarios"]

_MAX_ATTEMPTS = 2


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    """What to profile and how."""

    model: str
    """Zoo name or ``module:function``."""
    cluster: Cluster
    """The target mesh: the device budget of a run and the node size that bounds degrees."""
    global_batch_size: int
    """The target global batch (B)."""
    num_microbatches: int
    """The target micro-batch count (m), kept in every profiling run."""
    schedule: Schedule = "1f1b"
    """Schedule of the profiling runs; the statistics serve every schedule (profiling/quantities.py)."""
    batch_sizes: tuple[int, ...] | None = None
    """Profiled global batch sizes (two); default B/2 and B/4 (seed 000 III-A2)."""
    replica_batch_sizes: tuple[int, ...] = ()
    """Further global batch sizes profiled in the pipeline and tensor scenarios only: the rows of the replicas of
    data and data x tensor stages below the profiled sizes ([Note: a replica's rows are measured])."""
    scenarios: tuple[Scenario, ...] | None = None
    """Default: pipeline, data2, data4, tensor2, tensor4 where possible (:func:`default_scenarios`)."""
    zero: bool = False
    """Profile ZeRO-3 data-parallel scenarios too (:func:`default_scenarios`), for predicting ZeRO stages."""
    neighbors: int | None = None
    """Chain length per anchor for M_a; default ceil(L / G) as Description 1."""
    seed: int = 0
    iterations: int = 2
    """Iterations per run: one warm-up and one measured (seed 000: two training iterations)."""
    timeout_s: float = 900.0
    merge_to: int | None = None
    """Merge layers to this many after the pipeline scenario (seed 000's layer merger); the parallel
    scenarios are then profiled on the merged layers."""
    run_options: dict[str, Any] = field(default_factory=dict)
    """Further RunConfig fields (e.g. precision) applied to every run."""

    def __post_init__(self) -> None:
        as_schedule(self.schedule)
        for name in ("global_batch_size", "num_microbatches", "iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfileError(f"campaign: {name} must be a positive integer, got {value!r}")
        if self.global_batch_size % self.num_microbatches:
            raise ProfileError(f"campaign: global batch {self.global_batch_size} does not split into"
                               f" {self.num_microbatches} micro-batches",
                               fix="choose a micro-batch count that divides the global batch")
        if not self.timeout_s > 0:
            raise ProfileError(f"campaign: timeout_s must be positive, got {self.timeout_s!r}")


@dataclass
class CampaignSummary:
    """What a campaign did."""

    runs_total: int = 0
    runs_executed: int = 0
    runs_resumed: int = 0
    runs_failed: int = 0
    runs_per_scenario: dict[str, int] = field(default_factory=dict)
    unmeasured: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    seconds: float = 0.0


class Campaign:
    """Runs a :class:`CampaignConfig` into a :class:`ProfileStore`.

    Args:
        cfg: the campaign.
        store: the database (resumed if it holds this campaign already).
        progress: called with one line per event.
        execute: runs a plan and returns the run result (default: ``launch`` of a RunConfig); tests
            and the simulator substitute their own.
        launch: runs a RunConfig (default: the runtime's front door, runtime/launch.py, on this machine;
            runtime/multinode.py's ``MultiNode.launch`` runs it on several).
        memo: on simulated devices, where stages simulated before are kept (profiling/stage_memo.py; default: in
            this process only, so a campaign simulates each distinct stage once).
    """

    def __init__(
        self,
        cfg: CampaignConfig,
        store: ProfileStore,
        *,
        progress: Callable[[str], None] | None = None,
        execute: Callable[[Plan, Cluster], Any] | None = None,
        launch: Callable[[RunConfig], Any] | None = None,
        memo: StageMemo | None = None,
    ) -> None:
        from hybridplan.models.zoo import resolve_model

        self.cfg = cfg
        self.memo = memo if memo is not None else StageMemo()
        self.store = store
        self.say = progress or (lambda _msg: None)
        self.model = resolve_model(cfg.model)
        self.execute = execute or self._launch
        self._launcher = launch
        self._specs: list[Any] | None = None
        self.L = self.model.num_layers
        g = self.model.sample_granularity
        self.batch_sizes = profiled_batch_sizes(cfg.batch_sizes, cfg.global_batch_size, cfg.num_microbatches, g)
        self.replica_batch_sizes = replica_batch_sizes(cfg.replica_batch_sizes, self.batch_sizes,
                                                       cfg.num_microbatches, g)
        micro = [b // cfg.num_microbatches for b in self.batch_sizes]
        self.scenarios = list(cfg.scenarios) if cfg.scenarios else default_scenarios(self.model, cfg.cluster, micro,
                                                                                           zero=cfg.zero)
        check_scenarios(self.scenarios, cfg.cluster, micro, g)
        if cfg.zero and not cfg.scenarios and not any(s.zero for s in self.scenarios):
            self.say(no_zero_note(cfg.cluster, self.batch_sizes, cfg.num_microbatches, g))
        self.groups = LayerGroups(store.get_meta("merge_groups")) if store.get_meta("merge_groups") else None
        self._packed: dict[tuple[object, ...], ProfilingRun | None] = {}
        self._record_meta()

    # ------------------------------------------------------------------ setup
    def _record_meta(self) -> None:
        cfg = self.cfg
        identity = {
            "model": cfg.model,
            "model_config": self.model.config(),
            "num_layers": self.L,
            "layer_names": [self.model.layer_name(i) for i in range(self.L)],
            "cluster": cfg.cluster.to_dict(),
            "global_batch_size": cfg.global_batch_size,
            "num_microbatches": cfg.num_microbatches,
            "batch_sizes": self.batch_sizes,
            **({"replica_batch_sizes": self.replica_batch_sizes} if self.replica_batch_sizes else {}),
            "seed": cfg.seed,
            "merge_to": cfg.merge_to,
            "run_options": cfg.run_options,
        }
        old = self.store.get_meta("identity")
        if old is not None and old != json.loads(json.dumps(identity)):
            diff = sorted(k for k in identity if old.get(k) != json.loads(json.dumps(identity[k])))
            raise ProfileError(
                f"{str(self.store.path)!r} holds another campaign (differs in {diff})",
                fix="use a new --db file for a different model, cluster or batch configuration",
            )
        self.store.set_meta("identity", identity)
        for key in ("model", "num_layers", "global_batch_size", "num_microbatches", "batch_sizes"):
            self.store.set_meta(key, identity[key])
        if self.replica_batch_sizes:
            self.store.set_meta("replica_batch_sizes", self.replica_batch_sizes)
        self.store.set_meta("schedule", cfg.schedule)
        if self.store.get_meta("parameter_shapes") is None:
            self.store.set_meta("parameter_shapes", parameter_shapes(self.model))
        self.store.set_meta("scenarios", [s.name for s in self.scenarios])
        self.store.set_meta("neighbors", {s.name: self._neighbors(s) for s in self.scenarios})
        signatures = [self.model.layer_signature(i) for i in range(self.L)]
        if (cfg.run_options.get("backend") == "sim" and not cfg.merge_to and None not in signatures
                and all(self._neighbors(s) == 1 for s in self.scenarios)):
            # every M_i and M_a then comes from spans of one or two layers, measured by signature: [Note: identical
            # spans predict alike] in predict/span_tables.py
            self.store.set_meta(LAYER_CLASSES_META, signatures)

    # ------------------------------------------------------------------ spans
    def _units(self, scenario: Scenario) -> LayerGroups:
        """The layers a scenario is profiled on: merged ones for the parallel scenarios if merging."""
        if self.groups is not None and scenario.degree > 1:
            return self.groups
        return LayerGroups.identity(self.L)

    def _allowed(self, scenario: Scenario) -> Callable[[Span], bool]:
        if scenario.kind != "tensor":
            return lambda span: True
        ok = [self.model.tensor_parallel_problem(l, scenario.degree) is None for l in range(self.L)]
        units = self._units(scenario)
        return lambda span: all(ok[units.bounds[span.start] : units.bounds[span.stop]])

    def _groups(self, scenario: Scenario) -> int:
        c = self.cfg.cluster
        return c.num_nodes * (c.devices_per_node // scenario.degree)

    def _requests(self, scenario: Scenario) -> set[Span]:
        """Spans to measure, in the scenario's units."""
        G, d = self.cfg.cluster.num_devices, scenario.degree
        allowed, n = self._allowed(scenario), self._units(scenario).num_groups
        if G - d >= 2:
            return set(required_spans(n, self._neighbors(scenario), allowed))
        # One or no device is left besides the stage: only prefixes/suffixes (or the whole model) can
        # occur in a plan, and they are measured directly.
        spans = {Span(0, n)} if G == d else {Span(0, b) for b in range(1, n)} | {Span(a, n) for a in range(1, n)}
        return {s for s in spans if allowed(s)}

    def _neighbors(self, scenario: Scenario) -> int:
        return self.cfg.neighbors or default_neighbors(self._units(scenario).num_groups, self._groups(scenario))

    def anchor(self, scenario: Scenario) -> Callable[[int], int]:
        """The neighbour anchor the campaign profiles for layer ``l`` in ``scenario``."""
        return anchor_of(self._neighbors(scenario))

    # ------------------------------------------------------------------ running
    def run(self) -> CampaignSummary:
        """Profile everything not yet in the database; returns what was done."""
        summary = CampaignSummary()
        started = time.perf_counter()
        record_auxiliary_tables(self.store, self.model, self.scenarios, self.cfg.run_options, self.say, self.memo)
        # The pipeline scenario first: the layer merger needs its statistics.
        order = sorted(self.scenarios, key=lambda s: s.degree > 1)
        plan = [(b, s) for s in order for b in sizes_of(s, self.batch_sizes, self.replica_batch_sizes)]
        estimate = {key: self._estimate_runs(key[1]) for key in plan}
        summary.runs_total = sum(estimate.values())
        executed_seconds: list[float] = []
        for batch, scenario in plan:
            if scenario.degree > 1 and self.cfg.merge_to and self.groups is None:
                self._merge()
                summary.runs_total = summary.runs_executed + summary.runs_resumed + sum(
                    self._estimate_runs(s) for b, s in plan if s.degree > 1
                )
            self._profile(batch, scenario, summary, estimate, executed_seconds)
            self._refresh_statistics(batch, scenario)
        summary.seconds = time.perf_counter() - started
        self.store.set_meta("complete", True)
        return summary

    def dry_run(self) -> list[tuple[int, Scenario, ProfilingRun]]:
        """The runs the campaign would make if every run succeeded, without running anything.

        With layer merging, the parallel scenarios are counted on the original layers (the merged ones
        are only known after the pipeline scenario ran).
        """
        return [(batch, scenario, run) for scenario in sorted(self.scenarios, key=lambda s: s.degree > 1)
                for batch in sizes_of(scenario, self.batch_sizes, self.replica_batch_sizes)
                for run in self._planned_runs(scenario)]

    def _merge(self) -> None:
        stats = statistics_of(self.store, Scenario("none", 1), max(self.batch_sizes), self.L, self.anchor(Scenario("none", 1)))
        if stats is None:
            raise ProfileError("the layer merger needs the pipeline scenario's statistics", fix="profile the pipeline scenario too")
        self.groups = merge_layers(stats, self.cfg.merge_to or self.L, schedule=self.cfg.schedule,
                                   num_microbatches=self.cfg.num_microbatches)
        self.store.set_meta("merge_groups", self.groups.to_list())
        self.store.set_meta("neighbors", {s.name: self._neighbors(s) for s in self.scenarios})
        self.say(f"merged {self.L} layers into {self.groups.num_groups}: groups start at layers {self.groups.bounds[:-1]}")

    def _estimate_runs(self, scenario: Scenario) -> int:
        return len(self._planned_runs(scenario))

    def _planned_runs(self, scenario: Scenario) -> list[ProfilingRun]:
        """The runs of one batch size of ``scenario`` if every run succeeded."""
        pending, runs = self._requests(scenario), []
        while pending and (run := self._pack(pending, scenario, 1)) is not None:
            pending -= set(run.measured)
            runs.append(run)
        return runs

    def _pack(self, pending: set[Span], scenario: Scenario, fillers: int) -> ProfilingRun | None:
        """The next run of ``scenario`` for ``pending`` (:func:`~hybridplan.profiling.partitions.pack_run`), packed
        once per pending set: the run-count estimate of every batch size and the runs themselves pack the same sets
        (a campaign of Llama-3-70B on 32x8 packed each four times, a third of the simulated profile's time)."""
        units = self._units(scenario)
        key = (scenario, fillers, tuple(units.bounds), frozenset(pending))
        if key not in self._packed:
            self._packed[key] = self._pack_units(pending, scenario, fillers, units)
        return self._packed[key]

    def _pack_units(self, pending: set[Span], scenario: Scenario, fillers: int, units: LayerGroups) -> ProfilingRun | None:
        run = pack_run(
            pending,
            num_layers=units.num_groups,
            scenario=scenario,
            devices=self.cfg.cluster.num_devices,
            max_groups=self._groups(scenario),
            fillers_per_gap=fillers,
        )
        if run is None or units.num_groups == self.L:
            return run
        stages = tuple(StagePlan(*units.original(s.start, s.stop), s.parallelism, s.degree, s.devices) for s in run.stages)
        return ProfilingRun(run.scenario, stages, run.measured)

    def _profile(self, batch: int, scenario: Scenario, summary: CampaignSummary, estimate: dict, seconds: list[float]) -> None:
        pending = self._requests(scenario)
        attempts: dict[Span, int] = {}
        given_up: dict[Span, str] = {}
        fillers = 1
        done_here = 0
        while True:
            todo = pending - given_up.keys()
            run = self._pack(todo, scenario, fillers)
            if run is None:
                for span in sorted(todo):
                    given_up[span] = "does not fit on the mesh"
                break
            plan = run.plan(schedule=self.cfg.schedule, global_batch_size=batch, num_microbatches=self.cfg.num_microbatches)
            attempt = max(attempts.get(s, 0) for s in run.measured)
            key = f"{scenario.name}|{batch}|{fillers}|{attempt}|{json.dumps(plan.to_dict(), sort_keys=True)}"
            stored = self.store.find_run(key)
            if stored is not None and stored.status != "ok" and interrupted(stored.reason):
                stored = None  # stopped from outside: run it again (module docstring, Resuming)
            done_here += 1
            total = max(summary.runs_total, summary.runs_executed + summary.runs_resumed + 1)
            if stored is not None:
                status, reason, failed = stored.status, stored.reason, failed_stage(stored.reason)
                summary.runs_resumed += 1
            else:
                status, reason, failed, wall = self._run_one(run, plan, key, scenario, batch)
                seconds.append(wall)
                summary.runs_executed += 1
                done = summary.runs_executed + summary.runs_resumed
                left = max(0, total - done) * (sum(seconds) / len(seconds))
                spans = " ".join(f"[{s.start},{s.stop})" for s in run.measured)
                self.say(
                    f"[{done}/{total}] {scenario.name} @ batch {batch}: {status} in {wall:.1f} s, measured {spans}"
                    f" on {run.devices} devices; about {_duration(left)} left"
                )
            summary.runs_per_scenario[f"{scenario.name}@{batch}"] = done_here
            if status == "ok":
                pending -= set(run.measured)
                continue
            summary.runs_failed += 1
            fillers = self._after_failure(run, status, reason, failed, pending, attempts, given_up, fillers)
        if given_up:
            units = self._units(scenario)
            summary.unmeasured[f"{scenario.name}@{batch}"] = [units.original(s.start, s.stop) for s in sorted(given_up)]
            self.say(f"{scenario.name} @ batch {batch}: could not measure {len(given_up)} span(s): "
                     + ", ".join(f"[{s.start},{s.stop}) ({why})" for s, why in sorted(given_up.items())[:5]))

    def _after_failure(
        self,
        run: ProfilingRun,
        status: str,
        reason: str | None,
        failed_stage: int | None,
        pending: set[Span],
        attempts: dict[Span, int],
        given_up: dict[Span, str],
        fillers: int,
    ) -> int:
        """Bookkeeping after a failed run; returns the filler split for the next runs."""
        stage = run.stages[failed_stage] if failed_stage is not None and failed_stage < len(run.stages) else None
        merged = self._units(run.scenario).merged(stage.start, stage.stop) if stage is not None else None
        culprit = Span(*merged) if merged is not None else None
        if status == "oom" and culprit is not None and culprit in run.measured:
            given_up[culprit] = "out of memory"
            self._substitute(culprit, pending, given_up, self._units(run.scenario).num_groups)
            return fillers
        if status == "oom" and culprit is not None:  # a filler ran out of memory: split gaps finer
            if fillers < self.cfg.cluster.num_devices:
                return fillers + 1
        for span in run.measured:
            attempts[span] = attempts.get(span, 0) + 1
            if attempts[span] >= _MAX_ATTEMPTS:
                given_up[span] = f"{status}: {reason}"
        return fillers

    def _substitute(self, span: Span, pending: set[Span], given_up: dict[Span, str], units: int) -> None:
        """Replace an unmeasurable chain span by the nearest-neighbour pair giving the same M_a."""
        if len(span) < 2:
            return
        l = span.stop - 1  # the span was [n, l+1) or [n, l) of some layer's pair
        for layer in (l, l + 1):
            if 1 <= layer < units:
                for s in (Span(layer - 1, layer), Span(layer - 1, layer + 1)):
                    if s not in given_up:
                        pending.add(s)

    def _run_one(self, run: ProfilingRun, plan: Plan, key: str, scenario: Scenario, batch: int) -> tuple[str, str | None, int | None, float]:
        memory = self.cfg.cluster.memory_of(0)
        cluster = Cluster.uniform(1, run.devices, device_type=self.cfg.cluster.devices[0].type, memory_bytes=memory,
                                  gpu=self.cfg.cluster.devices[0].gpu)
        started = time.perf_counter()
        if self.cfg.run_options.get("backend") == "sim":
            if self._specs is None:
                self._specs = boundary_specs(self.model)
            spans = {(s.start, s.stop) for s in self._units(run.scenario).original_spans(run.measured)}
            outcome = simulate_stages(plan, cluster, spans, model=self.model, seed=self.cfg.seed, iterations=self.cfg.iterations,
                                      run_options={**self.cfg.run_options, "timeout_s": self.cfg.timeout_s}, specs=self._specs,
                                      memo=self.memo)
        else:
            outcome = run_plan(plan, cluster, self.execute)
        wall = time.perf_counter() - started
        self.store.record_run(
            key=key, scenario=scenario.name, batch_size=batch, plan=plan.to_dict(), status=outcome.status,
            reason=outcome.reason, wall_seconds=wall, measurements=measurements_of(outcome, plan, batch),
        )
        return outcome.status, outcome.reason, outcome.failed_stage, wall

    def _launch(self, plan: Plan, cluster: Cluster) -> Any:
        from hybridplan.runtime.config import RunConfig
        from hybridplan.runtime.launch import launch

        cfg = RunConfig(
            model=self.cfg.model, plan=plan, cluster=cluster, iterations=self.cfg.iterations, seed=self.cfg.seed,
            timeout_s=self.cfg.timeout_s, **self.cfg.run_options,
        )
        return (self._launcher or launch)(cfg)

    def _refresh_statistics(self, batch: int, scenario: Scenario) -> None:
        units = self._units(scenario)
        bounds = units.bounds if units.num_groups != self.L else None
        stats = statistics_of(self.store, scenario, batch, units.num_groups, self.anchor(scenario), bounds)
        if stats is not None:
            self.store.replace_statistics(scenario.name, batch, stats.rows())


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
