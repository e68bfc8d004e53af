"""Prediction error over random plans with data x tensor stages, on 8 devices, three models, both schedules.

The composite-stages issue asks that at least 90% of per-device predictions of at least 100 random plans that
use the new stage kinds (at least 3 models, 8 devices, both schedules) be within 2% of the CPU runtime, and
all within 5%. Here:

- each model is profiled once on a 1x8 mesh (``hybridplan profile``'s default scenarios: pipeline, data and
  tensor at degrees 2, 4 and 8; simulated devices, fp32);
- plans are drawn uniformly (hybridplan/workflows/sampling.py) from the extended plan space of the 1x8 mesh
  (CAPTURE's stages plus data x tensor stages), among those holding at least one data x tensor stage;
- every plan is measured on simulated devices, each distinct stage once (hybridplan/workflows/stage_cache.py;
  byte-identical to the real CPU runtime: tests/runtime/test_sim_agreement.py), and the first ``--check-real``
  plans of each model and schedule also on the real CPU runtime (8 processes, gloo), which must give the same
  bytes on every device or the script stops;
- each is predicted by ``MemoryPredictor`` (a data x tensor stage is the tensor stage at the replica's batch,
  predict/plan_prediction.py [Note: a data x tensor stage is a tensor stage at a smaller batch]).

Run from the repository root (resumable: rerun to continue)::

    .venv/bin/python -m benchmarks.composite_accuracy.run --plans 20
    .venv/bin/hybridplan report benchmarks/composite_accuracy/errors.json --png benchmarks/composite_accuracy/histogram.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.report.data import view_from_dict
from hybridplan.report.tables import render_table
from hybridplan.search import PlanSpace
from hybridplan.workflows.runs import ResultStore, devices_json, ensure_profile, measure_plan, plan_from_choices
from hybridplan.workflows.sampling import sample_plans
from hybridplan.workflows.stage_cache import StageCache
from hybridplan.workflows.validate import DeviceMemory

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "1x8"
MODELS = {"gpt-tiny": (64, 4), "wresnet-tiny": (64, 4), "moe-tiny": (64, 4)}
"""Model -> (global batch, micro-batches): micro-batches of 16 samples, which every data degree of 8 devices divides."""
SCHEDULES = ("gpipe", "1f1b")


def profile(model: str) -> Path:
    batch, micro = MODELS[model]
    say = lambda msg: print(f"  [{model}] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{model}-{MESH}-b{batch}-m{micro}.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=batch, num_microbatches=micro, run_options={"backend": "sim"}, progress=say)


def has_data_x_tensor(space: PlanSpace):
    return lambda plan: any(space.configs[c.config].kind == "data+tensor" for c in plan)


def measure(model: str, schedule: str, count: int, seed: int, check_real: int, store: ResultStore) -> list[dict]:
    db = profile(model)
    predictor = MemoryPredictor.from_db(db, schedule=schedule)
    cluster = Cluster.parse(MESH)
    space = PlanSpace.for_cluster(cluster, predictor.num_layers, composite=True)
    cache = StageCache(WORK / f"stages-{model}-{schedule}.json", model=model, cluster=cluster,
                       run_options={"backend": "sim"})
    plans = sample_plans(space, count, seed=seed, keep_plan=has_data_x_tensor(space))
    done = []
    for i, choices in enumerate(plans):
        key = f"{model}/{schedule}/{i}"
        plan = plan_from_choices(space, choices, schedule=schedule, global_batch_size=predictor.global_batch_size,
                                 num_microbatches=predictor.num_microbatches)
        if key not in store or store[key]["plan"] != plan.to_dict():
            store.put(key, _measure_one(db, plan, predictor, cache, cluster, real=i < check_real))
            errors = [abs(d["predicted"] - d["measured"]) / d["measured"] for d in store[key]["devices"]]
            print(f"{key}: {plan.num_stages} stages, largest device error {100 * max(errors):.2f}%", flush=True)
        done.append(store[key])
    return done


def _measure_one(db: Path, plan: Plan, predictor: MemoryPredictor, cache: StageCache, cluster: Cluster, *,
                 real: bool) -> dict:
    started = time.perf_counter()
    measured = {d.device: d.measured for d in cache.measure(plan)}
    predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
    devices = [DeviceMemory(d, s, predicted[d], measured[d]) for s, stage in enumerate(plan.stages) for d in stage.devices]
    record = {"plan": plan.to_dict(), "status": "ok", "devices": devices_json(sorted(devices, key=lambda d: d.device))}
    if real:
        whole = measure_plan(db, plan, cluster=cluster, backend="real")
        if [d.measured for d in whole.devices] != [measured[d.device] for d in whole.devices]:
            raise SystemExit(f"{plan.to_dict()}: the real runtime disagrees with the simulated stages; stopping")
        record["checked_real"] = True
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=20, help="plans per model and schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-real", type=int, default=2, help="plans per model and schedule also run on real processes")
    args = ap.parse_args()
    store = ResultStore(HERE / "results.json")
    done = [r for model in MODELS for schedule in SCHEDULES
            for r in measure(model, schedule, args.plans, args.seed, args.check_real, store)]
    doc = {"format": "hybridplan.prediction_errors", "thresholds": [0.02, 0.05],
           "title": f"{len(done)} random plans with data x tensor stages on {MESH} ({', '.join(MODELS)}; GPipe and 1F1B)",
           "plans": [{"plan": r["plan"], "devices": r["devices"]} for r in done]}
    (HERE / "errors.json").write_text(json.dumps(doc) + "\n")
    print(render_table(view_from_dict(doc, "errors")))
    print(f"checked on the real runtime: {sum(1 for r in done if r.get('checked_real'))} plans, every device identical")


if __name__ == "__main__":
    main()
