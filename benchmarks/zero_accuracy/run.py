"""Prediction error over random plans with ZeRO-sharded data stages (1x4, gpt-tiny and wresnet-tiny, both schedules).

A small first look at [Note: predicting ZeRO from a profile] (predict/zero_layout.py) over random plans, sized for a shared
2-core machine (the issue's full target, 100 plans of 3 models on 8 devices, needs profiles twice as long as
benchmarks/composite_accuracy's and is left to a later run):

- each model is profiled once on 1x4 simulated devices: pipeline, data x2 and x4, and their ZeRO-3 scenarios
  (``hybridplan profile --zero`` without the tensor scenarios, which these plans do not use);
- plans are drawn uniformly (hybridplan/workflows/sampling.py) from CAPTURE's 1x4 space with ZeRO data stages
  (``PlanSpace(zero=True)``) among those the profile predicts: a first set with ZeRO-1 and ZeRO-3 stages (at least
  one), a second with at least one ZeRO-2 stage;
- every plan is measured whole on simulated devices (a ZeRO stage's replicas differ, so stages are not cached;
  simulated devices equal the real CPU runtime byte for byte on ZeRO stages: tests/runtime/test_sharding.py)
  and predicted by ``MemoryPredictor``.

Run from the repository root (resumable: rerun to continue)::

    .venv/bin/python -m benchmarks.zero_accuracy.run --plans 10 --zero2-plans 5

A plan already measured is not run again; every plan is predicted again by the current predictor.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hybridplan.plan import Cluster
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.partitions import Scenario
from hybridplan.report.data import view_from_dict
from hybridplan.report.tables import render_table
from hybridplan.search import PlanSpace
from hybridplan.workflows.runs import ResultStore, devices_json, ensure_profile, plan_from_choices
from hybridplan.workflows.sampling import sample_plans
from hybridplan.workflows.validate import validate_plan

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "1x4"
MODELS = ("gpt-tiny", "wresnet-tiny")
BATCH, MICRO = 64, 4
"""Global batch and micro-batches: micro-batches of 16, which data x4 divides; profiled at 16 and 32."""
SCHEDULES = ("gpipe", "1f1b")
SCENARIOS = (Scenario("none", 1), Scenario("data", 2), Scenario("data", 2, 3), Scenario("data", 4), Scenario("data", 4, 3))


def profile(model: str) -> Path:
    say = lambda msg: print(f"  [{model}] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{model}-{MESH}-zero.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=BATCH, num_microbatches=MICRO, run_options={"backend": "sim"},
                          scenarios=SCENARIOS, progress=say)


def measure(model: str, schedule: str, count: int, seed: int, store: ResultStore, *, zero2: bool = False) -> list[dict]:
    """``count`` plans measured (resumed from ``store``) and predicted by today's predictor: with ``zero2`` plans
    holding a ZeRO-2 stage, else the first set's, with ZeRO-1 and ZeRO-3 stages only (the same draws as before
    ZeRO-2 was predicted: its configs come last in the space and are kept out)."""
    db = profile(model)
    predictor = MemoryPredictor.from_db(db, schedule=schedule)
    cluster = Cluster.parse(MESH)
    space = PlanSpace.for_cluster(cluster, predictor.num_layers, zero=True)
    level = lambda c: space.configs[c.config].zero  # noqa: E731
    predictable = lambda c, after: (zero2 or level(c) != 2) and predictor.allowed(c.start, c.stop, **_config(space, c))  # noqa: E731
    sharded = lambda plan: any(level(c) == 2 for c in plan) if zero2 else any(level(c) for c in plan)  # noqa: E731
    done = []
    for i, choices in enumerate(sample_plans(space, count, seed=seed, keep=predictable, keep_plan=sharded)):
        key = f"{model}/{schedule}/" + ("zero2/" if zero2 else "") + str(i)
        plan = plan_from_choices(space, choices, schedule=schedule, global_batch_size=BATCH, num_microbatches=MICRO)
        if key not in store or store[key]["plan"] != plan.to_dict():
            report = validate_plan(db, plan, cluster=cluster, model=model, run_options={"backend": "sim"})
            if not report.run.ok:
                raise SystemExit(f"{key}: {report.run.reason}")
            store.put(key, {"plan": plan.to_dict(), "status": "ok", "devices": devices_json(report.rows)})
        record = store[key]
        predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
        record = {**record, "devices": [{**d, "predicted": predicted[d["device"]]} for d in record["devices"]]}
        if record != store[key]:  # measured once; predicted again by the predictor of today
            store.put(key, record)
        errors = [abs(d["predicted"] - d["measured"]) / d["measured"] for d in record["devices"]]
        print(f"{key}: {plan.num_stages} stages, largest device error {100 * max(errors):.2f}%", flush=True)
        done.append(record)
    return done


def by_kind(done: list[dict]) -> str:
    """Per kind of stage (ZeRO level, data, pipeline-only): devices, share within 2% and 5%, largest error."""
    errors: dict[str, list[float]] = {}
    for r in done:
        stages = r["plan"]["stages"]
        for d in r["devices"]:
            stage = stages[d["stage"]]
            kind = f"ZeRO-{stage['zero']}" if stage.get("zero") else stage["parallelism"]
            errors.setdefault(kind, []).append(abs(d["predicted"] - d["measured"]) / d["measured"])
    return "\n".join(f"{k}: {len(v)} devices, {100 * sum(e <= 0.02 for e in v) / len(v):.1f}% within 2%,"
                     f" {100 * sum(e <= 0.05 for e in v) / len(v):.1f}% within 5%, largest {100 * max(v):.2f}%,"
                     f" {100 * sum(e == 0 for e in v) / len(v):.1f}% exact" for k, v in sorted(errors.items()))


def _config(space: PlanSpace, choice: object) -> dict:
    cfg = space.configs[choice.config]  # type: ignore[attr-defined]
    return {"kind": cfg.kind, "degree": cfg.degree, **cfg.model_kwargs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=10, help="plans per model and schedule")
    ap.add_argument("--zero2-plans", type=int, default=5, help="plans with a ZeRO-2 stage per model and schedule")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    store = ResultStore(HERE / "results.json")
    done = [r for model in MODELS for schedule in SCHEDULES for zero2, count in ((False, args.plans), (True, args.zero2_plans))
            for r in measure(model, schedule, count, args.seed, store, zero2=zero2)]
    doc = {"format": "hybridplan.prediction_errors", "thresholds": [0.02, 0.05],
           "title": f"{len(done)} random plans with ZeRO stages on {MESH} ({', '.join(MODELS)}; GPipe and 1F1B)",
           "plans": [{"plan": r["plan"], "devices": r["devices"]} for r in done]}
    (HERE / "errors.json").write_text(json.dumps(doc) + "\n")
    print(render_table(view_from_dict(doc, "errors")))
    print(by_kind(done))


if __name__ == "__main__":
    main()
