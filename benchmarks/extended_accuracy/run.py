"""Prediction error over random plans of the extended space on 2x4: data x tensor, ZeRO, recompute, across nodes.

The composite-stages issue's accuracy target: over at least 100 random plans that use the new stage kinds (at
least 3 models, 8 devices, both schedules), at least 90% of the per-device predictions within 2% of the CPU
runtime, and all within 5%. benchmarks/composite_accuracy covers data x tensor stages on 1x8 and
benchmarks/zero_accuracy ZeRO stages on 1x4; this one draws from the whole space the predictor covers today:

- a 2x4 mesh, so that stages across nodes appear (a data or data x tensor stage over both nodes); inside a node
  data, tensor and data x tensor (2 x 2) stages, ZeRO-1 and ZeRO-3 on data stages, each stage recomputed or not;
- each model is profiled twice (profiles.py): the default scenarios with ``--zero``, and the same taken with
  activation checkpointing, which predicts the recomputed stages (``--recompute-db``);
- per model and schedule, ``--plans`` plans drawn uniformly (hybridplan/workflows/sampling.py) from
  ``PlanSpace(composite, zero, recompute, cross_node)`` among the plans every stage of which the profiles predict
  and that hold at least one new kind, and ``--cross`` plans drawn from those with a stage across the nodes (such
  a stage takes all 8 devices here, so they are one-stage plans: uniform draws would almost never give one);
- every plan is measured on simulated devices, each distinct stage once (workflows/stage_cache.py; a ZeRO
  stage device by device), and the first ``--check-real`` uniform plans and the first across-nodes plan of each
  model and schedule also on the real CPU runtime (8 processes, gloo): the same bytes on every device, or the
  script stops;
- predictions are not stored: each run (and ``--rescore``, which measures nothing) predicts every stored plan
  again from the two profiles with ``MemoryPredictor``, so a better predictor is scored on the same measurements.

``--with-unpredicted`` also draws plans with the stage kinds today's predictor refuses (ZeRO-2 data stages; ZeRO on
data x tensor stages), stored apart (keys ``future/...``); a plan the runtime refuses is kept as not run, and a
refused prediction is counted, not scored.

Run from the repository root (resumable: rerun to continue)::

    .venv/bin/python -m benchmarks.extended_accuracy.run --plans 17 --cross 3 --check-real 1
    # or one process per model (each writes its own results-<model>.json), then --rescore to score them all:
    .venv/bin/python -m benchmarks.extended_accuracy.run --models gpt-tiny
    .venv/bin/python -m benchmarks.extended_accuracy.run --rescore     # predictions only, from the stored runs
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from hybridplan.errors import HybridPlanError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.search import PlanSpace
from hybridplan.search.memory.configs import StageChoice, StageConfig
from hybridplan.workflows.runs import ResultStore, measure_plan, plan_from_choices
from hybridplan.workflows.sampling import count_kept_plans, sample_plans
from hybridplan.workflows.stage_cache import StageCache

from benchmarks.extended_accuracy.profiles import HERE, MESH, MODELS, WORK, base_profile, recompute_profile

SCHEDULES = ("gpipe", "1f1b")
ZERO3_DT = "zero3 data x tensor"
"""The stratum of ``--zero3-data-tensor``: plans with at least one ZeRO-3 data x tensor stage (keys ``.../z<i>``)."""
ZERO2_DT = "zero2 data x tensor"
"""The stratum of ``--zero2-data-tensor``: plans with at least one ZeRO-2 data x tensor stage (keys ``.../w<i>``)."""
RECOMPUTED_DT = "recomputed zero2/3 data x tensor"
"""The stratum of ``--recomputed-zero-data-tensor``: plans with at least one recomputed ZeRO-2 or ZeRO-3 data x tensor
stage (keys ``.../r<i>``; predicted since [Note: a recomputed ZeRO-3 stage])."""
ENDING_DT = "zero2/3 data x tensor ending the model"
"""The stratum of ``--ending-zero-data-tensor``: plans whose last stage is a ZeRO-2 or ZeRO-3 data x tensor stage
(keys ``.../e<i>``; predicted since [Note: the layers before the head])."""
THRESHOLDS = (0.02, 0.05)
OVERALL = ("every device", "devices of a new-kind stage", "devices of an old-kind stage",
           "every device but those of data stages across nodes", "... nor of ZeRO-3 or recomputed stages",
           "devices of plans drawn --with-unpredicted", "per plan (its largest device error)")
"""Rows of the overall table, in order."""


@dataclass(frozen=True)
class UnpredictedSpace(PlanSpace):
    """The sampled space plus the stage configs today's predictor refuses or the search leaves out
    (``--with-unpredicted``): ZeRO-2 data stages at every degree the space has, recomputed or not (ZeRO-1/2/3 data x
    tensor stages are in the space since [Note: ZeRO-3 composed from an unsharded stage])."""

    @cached_property
    def configs(self) -> tuple[StageConfig, ...]:
        plain = tuple(c for c in PlanSpace.configs.func(self) if not c.recompute)  # type: ignore[attr-defined]
        more = tuple(c._replace(zero=2) for c in plain if c.kind == "data" and not c.zero)
        out = plain + tuple(c for c in more if c not in plain)  # the space has ZeRO-2 data stages now: no duplicates
        return out + tuple(c._replace(recompute=True) for c in out)


def stage_tags(stage: Any, devices_per_node: int) -> list[str]:
    """What a stage is: its parallelism, then each new kind it uses ("zero1", "recompute", "across nodes")."""
    tags = [stage.kind]
    if stage.zero:
        tags.append(f"zero{stage.zero}")
    if stage.recompute == "full":
        tags.append("recompute")
    if len({d // devices_per_node for d in stage.devices}) > 1:
        tags.append("across nodes")
    return tags


def is_new(tags: list[str]) -> bool:
    """Whether a stage uses a kind outside CAPTURE's space."""
    return tags[0] == "data+tensor" or len(tags) > 1


def predictor_of(model: str, schedule: str) -> MemoryPredictor:
    """The predictor from the model's two stored profiles (read only: nothing is profiled here)."""
    base = WORK / f"{model}-{MESH}-zero.sqlite"
    recompute = WORK / f"{model}-{MESH}-recompute.sqlite"
    for path in (base, recompute):
        if not path.exists():
            raise SystemExit(f"{path} is missing: run 'python -m benchmarks.extended_accuracy.run' (it profiles first)")
    return MemoryPredictor.from_db(base, schedule=schedule, recompute_db=recompute)


def draw(model: str, schedule: str, args: argparse.Namespace) -> list[tuple[str, str, Plan]]:
    """``(key, stratum, plan)`` of the plans drawn for a model and schedule."""
    predictor = predictor_of(model, schedule)
    cluster = Cluster.parse(MESH)
    kind = UnpredictedSpace if args.with_unpredicted else PlanSpace
    space = kind(predictor.num_layers, cluster.num_nodes, cluster.devices_per_node, composite=True, zero=True,
                 recompute=True, cross_node=True)
    k = cluster.devices_per_node
    unpredicted = set(space.configs) - set(PlanSpace.for_cluster(cluster, predictor.num_layers, composite=True,
                                                                 zero=True, recompute=True, cross_node=True).configs)

    def keep(choice: StageChoice, after: int) -> bool:
        cfg = space.configs[choice.config]
        if cfg in unpredicted:
            return predictor.microbatch_size % (cfg.degree // max(1, cfg.tensor_degree)) == 0
        return predictor.allowed(choice.start, choice.stop, cfg.kind, cfg.degree, **cfg.model_kwargs)

    def across(choice: StageChoice, after: int) -> bool:
        return space.configs[choice.config].degree > k and keep(choice, after)

    def new_kind(plan: tuple[StageChoice, ...]) -> bool:
        cfgs = [space.configs[c.config] for c in plan]
        if args.ending_zero_data_tensor:
            return plan[-1].stop == predictor.num_layers and cfgs[-1].kind == "data+tensor" and cfgs[-1].zero in (2, 3)
        if args.recomputed_zero_data_tensor:
            return any(c.kind == "data+tensor" and c.zero in (2, 3) and c.recompute for c in cfgs)
        if args.zero3_data_tensor or args.zero2_data_tensor:
            return any(c.kind == "data+tensor" and c.zero == (3 if args.zero3_data_tensor else 2) for c in cfgs)
        if args.with_unpredicted:
            return any(c in unpredicted for c in cfgs)
        return any(c.kind == "data+tensor" or c.zero or c.recompute or c.degree > k for c in cfgs)

    prefix = "future/" if args.with_unpredicted else ""
    out = []
    strata: list[tuple[str, Callable[[StageChoice, int], bool], int]] = [("uniform", keep, args.plans),
                                                                         ("across nodes", across, args.cross)]
    if args.recomputed_zero_data_tensor:  # only this stratum: the others' stored draws stay as they are
        strata = [(RECOMPUTED_DT, keep, args.recomputed_zero_data_tensor)]
    elif args.ending_zero_data_tensor:
        strata = [(ENDING_DT, keep, args.ending_zero_data_tensor)]
    elif args.zero3_data_tensor:
        strata = [(ZERO3_DT, keep, args.zero3_data_tensor)]
    elif args.zero2_data_tensor:
        strata = [(ZERO2_DT, keep, args.zero2_data_tensor)]
    for stratum, admit, count in strata:
        if count == 0:
            continue
        chosen = sample_plans(space, count, seed=args.seed, keep=admit, keep_plan=new_kind)
        print(f"{model} {schedule} {stratum}: {len(chosen)} plans drawn of {count_kept_plans(space, admit):,} admitted"
              " (before the new-kind filter)", flush=True)
        for i, choices in enumerate(chosen):
            plan = plan_from_choices(space, choices, schedule=schedule, global_batch_size=predictor.global_batch_size,
                                     num_microbatches=predictor.num_microbatches)
            tag = {"uniform": "", ZERO3_DT: "z", ZERO2_DT: "w", RECOMPUTED_DT: "r", ENDING_DT: "e"}.get(stratum, "x")
            out.append((f"{prefix}{model}/{schedule}/{tag}{i}", stratum, plan))
    return out


def measure(model: str, schedule: str, args: argparse.Namespace, store: ResultStore) -> None:
    """Measure the drawn plans not measured yet (simulated devices; a few on the real runtime too)."""
    base_profile(model)
    recompute_profile(model)
    cluster = Cluster.parse(MESH)
    # A cache file per schedule (stage_key names the schedule too; its first version did not, and the real-runtime
    # check caught a GPipe last stage reused for 1F1B's).
    cache = StageCache(WORK / f"stages-{model}-{schedule}.json", model=model, cluster=cluster,
                       run_options={"backend": "sim"})
    firsts: dict[str, int] = {}
    for key, stratum, plan in draw(model, schedule, args):
        n = firsts[stratum] = firsts.get(stratum, -1) + 1
        real = n < (args.check_real if stratum == "uniform" else min(1, args.check_real))
        old = store.records.get(key)
        if old is not None and old["plan"] == plan.to_dict() and old["status"] != "not run" and (
                old.get("checked_real") or not real):
            continue
        started = time.perf_counter()
        record: dict[str, Any] = {"plan": plan.to_dict(), "stratum": stratum, "model": model, "status": "ok",
                                  "kinds": [stage_tags(s, cluster.devices_per_node) for s in plan.stages]}
        try:
            measured = cache.measure(plan)
        except HybridPlanError as e:  # --with-unpredicted: a kind the runtime does not run yet
            store.put(key, {**record, "status": "not run", "reason": str(e).splitlines()[0]})
            print(f"{key}: not run: {store[key]['reason']}", flush=True)
            continue
        record["measured"] = [d.measured for d in measured]
        if real:
            whole = measure_plan(base_profile(model), plan, cluster=cluster, backend="real")
            if whole.status != "ok" or [d.measured for d in whole.devices] != record["measured"]:
                raise SystemExit(f"{key} {plan.to_dict()}: the real runtime ({whole.status}) disagrees with the"
                                 f" simulated stages: {[d.measured for d in whole.devices]} vs {record['measured']}")
            record["checked_real"] = True
        record["seconds"] = round(time.perf_counter() - started, 2)
        store.put(key, record)
        print(f"{key}: {plan.num_stages} stages ({', '.join('+'.join(t) for t in record['kinds'])}) measured in"
              f" {record['seconds']} s{' (real runtime identical)' if real else ''}", flush=True)


# ---------------------------------------------------------------------------------------------- scoring
@dataclass
class Row:
    """Per-device errors of one group."""

    errors: list[float]

    def cells(self) -> list[str]:
        e = self.errors
        if not e:
            return ["0", "", "", "", ""]
        share = lambda t: f"{100 * sum(x <= t for x in e) / len(e):.1f}%"  # noqa: E731
        return [str(len(e)), share(THRESHOLDS[0]), share(THRESHOLDS[1]), f"{100 * max(e):.2f}%",
                f"{100 * sum(x == 0 for x in e) / len(e):.1f}%"]


def stores() -> dict[str, ResultStore]:
    """The measurements of each model: ``results-<model>.json`` (one file per model, so that models can be
    measured by separate processes at once)."""
    return {model: ResultStore(HERE / f"results-{model}.json") for model in MODELS}


def score(stored: dict[str, ResultStore]) -> dict[str, Any]:
    """Predict every stored plan again and compare with its measured bytes; prints and returns the tables."""
    predictors: dict[tuple[str, str], MemoryPredictor] = {}
    scored, refused, not_run = [], [], 0
    records = sorted((key, rec) for store in stored.values() for key, rec in store.records.items())
    for key, rec in records:
        if rec["status"] != "ok":
            not_run += 1
            continue
        plan = Plan.from_dict(rec["plan"])
        pk = (rec["model"], plan.schedule)
        if pk not in predictors:
            predictors[pk] = predictor_of(*pk)
        try:
            predicted = [d.peak_memory_bytes for d in predictors[pk].predict(plan).devices]
        except HybridPlanError as e:
            refused.append((key, str(e).splitlines()[0]))
            continue
        scored.append((key, rec, plan, predicted))
    groups: dict[str, dict[str, list[float]]] = {"overall": {}, "model": {}, "kind": {}}
    plans_out = []
    worst = (0.0, "")
    where: dict[tuple[str, str], tuple[float, str]] = {}
    for key, rec, plan, predicted in scored:
        devices = []
        for s, stage in enumerate(plan.stages):
            tags = rec["kinds"][s]
            for d in stage.devices:
                p, m = predicted[d], rec["measured"][d]
                err = abs(p - m) / m
                devices.append({"device": d, "stage": s, "predicted": p, "measured": m})
                if err > worst[0]:
                    worst = (err, f"{key} device {d} ({'+'.join(tags)}, layers {stage.start}-{stage.stop})")
                label = f"{100 * (p - m) / m:+.2f}% on {key} device {d} ({'+'.join(tags)}, layers {stage.start}-{stage.stop})"

                def add(group: str, name: str) -> None:
                    groups[group].setdefault(name, []).append(err)
                    if err > where.get((group, name), (-1.0, ""))[0]:
                        where[(group, name)] = (err, label)

                add("overall", "every device")
                if key.startswith("future/"):
                    add("overall", "devices of plans drawn --with-unpredicted")
                add("overall", "devices of a new-kind stage" if is_new(tags) else "devices of an old-kind stage")
                if not (tags[0] == "data" and "across nodes" in tags):  # extrapolated degrees: see the diagnostic
                    add("overall", "every device but those of data stages across nodes")
                    if "zero3" not in tags and "recompute" not in tags:
                        add("overall", "... nor of ZeRO-3 or recomputed stages")
                add("model", f"{rec['model']} | {'GPipe' if plan.schedule == 'gpipe' else '1F1B'}")
                add("kind", {"none": "pipeline-only", "data": "data", "tensor": "tensor",
                             "data+tensor": "data x tensor"}[tags[0]])
                for tag in tags[1:]:
                    add("kind", {"zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}.get(tag, tag))
                    if tag.startswith("zero") and "across nodes" not in tags:
                        add("kind", f"ZeRO-{tag[4:]} inside a node")
                    if tag.startswith("zero") and tags[0] == "data+tensor":
                        add("kind", f"ZeRO-{tag[4:]} of data x tensor")
                if not is_new(tags):
                    add("kind", "none of the new kinds")
        plans_out.append({"plan": rec["plan"], "devices": devices})
        groups["overall"].setdefault("per plan (its largest device error)", []).append(
            max(abs(d["predicted"] - d["measured"]) / d["measured"] for d in devices))
    stages: dict[str, int] = {}
    for _, rec, _, _ in scored:
        for tags in rec["kinds"]:
            for tag in ["+".join(tags)] if not is_new(tags) else tags[:1] * (tags[0] == "data+tensor") + tags[1:]:
                stages[tag] = stages.get(tag, 0) + 1
    lines = [f"The scored plans hold {sum(len(rec['kinds']) for _, rec, _, _ in scored)} stages; by kind (a stage counts"
             " under each new kind it has, an old-kind stage under its parallelism): "
             + ", ".join(f"{k} {v}" for k, v in sorted(stages.items())) + ".", ""]
    lines += [f"{len(scored)} plans scored ({sum(1 for _, r, _, _ in scored if r.get('checked_real'))} also on the real"
             f" runtime, identical), {len(refused)} refused by the predictor, {not_run} not run", ""]
    for name, head in (("overall", ""), ("model", "model | schedule"), ("kind", "stage kind")):
        if name == "kind":
            lines += ["A device counts under each kind its stage has (a recomputed ZeRO-1 data stage: data, ZeRO-1,"
                      " recompute).", ""]
        cols = head.count("|") + 1
        lines += [f"| {head} | devices | within 2% | within 5% | largest | exact to the byte |",
                  "|" + "---|" * cols + "---:|" * 5]
        order = sorted(groups[name], key=OVERALL.index) if name == "overall" else sorted(groups[name])
        lines += [f"| {g} | " + " | ".join(Row(groups[name][g]).cells()) + " |" for g in order] + [""]
    if worst[1]:
        lines.append(f"largest error: {100 * worst[0]:.2f}% on {worst[1]}")
        lines += ["", "Where each stage kind's largest error is (predicted - measured, of the measured):", ""]
        lines += [f"- {name}: {where[('kind', name)][1]}" for name in sorted(groups["kind"])]
    lines += composed_across_nodes(scored, predictors)
    for key, why in refused[:5]:
        lines.append(f"refused: {key}: {why}")
    text = "\n".join(lines)
    print(text)
    doc = {"format": "hybridplan.prediction_errors", "thresholds": list(THRESHOLDS),
           "title": f"{len(scored)} random plans of the extended space on {MESH} ({', '.join(MODELS)}; GPipe and 1F1B)",
           "plans": plans_out}
    (HERE / "errors.json").write_text(json.dumps(doc) + "\n")
    (HERE / "summary.md").write_text(text + "\n")
    return {"scored": len(scored), "refused": len(refused), "not_run": not_run,
            "largest": worst[0] if scored else math.nan}


def composed_across_nodes(scored: list[tuple[str, dict, Plan, list[int]]],
                           predictors: dict[tuple[str, str], MemoryPredictor]) -> list[str]:
    """A diagnostic, not the predictor's method: data stages above the profiled degrees (here data x8 across the
    two nodes; the predictor extrapolates CAPTURE's degree fit from data x2 and x4) composed instead as the
    largest profiled data degree ``d`` at the global batch ``B * d / D``, whose replicas hold the same rows, as a
    data x tensor stage is composed from the tensor stage; a ZeRO-1 stage moved by its share
    (``ZeroLayout.static_delta``). ZeRO-3 is left out: its parameter and gradient shards change with the degree."""
    rows = []
    for key, rec, plan, predicted in scored:
        for i, stage in enumerate(plan.stages):
            base = predictors[(rec["model"], plan.schedule)]
            base = base.recomputed if stage.recompute == "full" and base.recomputed is not None else base
            profiled = base.profiled_degrees("data")
            if stage.kind != "data" or stage.zero not in (0, 1) or not profiled or stage.degree <= profiled[-1]:
                continue
            d = profiled[-1]
            replica = base.retargeted(global_batch_size=plan.global_batch_size * d // stage.degree)
            value = replica.stage_memory(stage.start, stage.stop, "data", d, plan.num_stages - 1 - i)
            layout = base.zero_layout
            measured = [rec["measured"][dev] for dev in stage.devices]
            composed = [value + (layout.static_delta(stage.start, stage.stop, 1, stage.degree, r)
                                 if stage.zero and layout is not None else 0) for r in range(stage.degree)]
            now = max(abs(predicted[dev] - m) / m for dev, m in zip(stage.devices, measured))
            then = max(abs(c - m) / m for c, m in zip(composed, measured))
            rows.append(f"| {key} stage {i} | {'+'.join(rec['kinds'][i])} x{stage.degree} | {100 * now:.2f}% |"
                        f" {100 * then:.2f}% |")
    if not rows:
        return []
    return ["", "Data stages above the profiled degrees, largest device error: the predictor's (which composes them"
            " since [Note: a data stage wider than the profiled ones] in predict/memory.py; CAPTURE's degree fit"
            " before) against the stage composed as data x d (the largest profiled) at the global batch B*d/D"
            " (a diagnostic written before the predictor did it: composed_across_nodes in run.py):", "",
            "| plan, stage | kind | predictor | composed |", "|---|---|---:|---:|"] + rows


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=17, help="uniformly drawn plans per model and schedule")
    ap.add_argument("--cross", type=int, default=3, help="plans with a stage across nodes per model and schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-real", type=int, default=1,
                    help="uniform plans per model and schedule also run on real processes (and one across nodes)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    ap.add_argument("--with-unpredicted", action="store_true",
                    help="draw plans with the kinds today's predictor refuses (ZeRO-2; ZeRO on data x tensor) instead")
    ap.add_argument("--zero3-data-tensor", type=int, default=0, metavar="N",
                    help="instead: N plans per model and schedule with a ZeRO-3 data x tensor stage (keys .../z<i>)")
    ap.add_argument("--zero2-data-tensor", type=int, default=0, metavar="N",
                    help="instead: N plans per model and schedule with a ZeRO-2 data x tensor stage (keys .../w<i>)")
    ap.add_argument("--recomputed-zero-data-tensor", type=int, default=0, metavar="N",
                    help="instead: N plans per model and schedule with a recomputed ZeRO-2/3 data x tensor stage"
                    " (keys .../r<i>)")
    ap.add_argument("--ending-zero-data-tensor", type=int, default=0, metavar="N",
                    help="instead: N plans per model and schedule whose last stage is a ZeRO-2/3 data x tensor stage"
                    " (keys .../e<i>)")
    ap.add_argument("--rescore", action="store_true", help="measure nothing: predict the stored plans again and score")
    args = ap.parse_args(None if argv is None else list(argv))
    stored = stores()
    if not args.rescore:
        for model in args.models.split(","):
            if model not in MODELS:
                raise SystemExit(f"--models: unknown {model!r}; use some of {', '.join(MODELS)}")
            for schedule in SCHEDULES:
                measure(model, schedule, args, stored[model])
    score(stored)


if __name__ == "__main__":
    main()
