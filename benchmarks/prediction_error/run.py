"""Prediction error over random plans (seed 001 IV-B): Wide-ResNet 1B, 4x4 mesh, GPipe, hybrid plans.

CAPTURE predicted 500 plans "randomly sampled from the set of possible plans that the recommender generates",
leaving out plans predicted to run out of memory, and compared with real runs: 44.8% / 65.5% / 97.1% of
the per-GPU predictions within 2% / 5% / 11% (per plan: 45.4% / 69.6% / 97.8%). Here the plans are drawn
uniformly from the CAPTURE plan space of the 4x4 mesh among those whose every stage is predicted to fit
40 GiB (hybridplan/workflows/sampling.py), and each is run on simulated devices (byte-identical to the
real runtime; GPU allocator terms) and compared device by device with the prediction.

A simulated device's memory depends only on its own stage and schedule position, so each distinct stage is
simulated once (hybridplan/workflows/stage_cache.py); the first ``--check`` plans are also simulated whole
(``launch(backend="sim")``) and must give the same bytes on every device, or the script stops.

Run from the repository root (resumable: rerun to continue; about an hour on 2 cores, most of it simulating
the few hundred distinct stages)::

    .venv/bin/python -m benchmarks.prediction_error.run --plans 500                   # GPipe, as CAPTURE
    .venv/bin/python -m benchmarks.prediction_error.run --plans 500 --schedule 1f1b
    .venv/bin/hybridplan report benchmarks/prediction_error/errors-gpipe.json --png benchmarks/prediction_error/histogram-gpipe.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hybridplan.predict.memory import MemoryPredictor
from hybridplan.report.data import view_from_dict
from hybridplan.report.tables import render_table
from hybridplan.search import PlanSpace, StageTable, count_plans
from hybridplan.units import parse_bytes
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan, plan_from_choices
from hybridplan.workflows.sampling import count_kept_plans, sample_plans
from hybridplan.workflows.stage_cache import StageCache
from hybridplan.workflows.validate import DeviceMemory

from benchmarks.paper_profiles import CAPACITY, CASES, profile

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="wresnet-1b")
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--plans", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=3, help="plans also simulated whole, to check the stage cache")
    ap.add_argument("--results", default=None, help="default: results-<schedule>.json here")
    args = ap.parse_args()
    case = CASES[args.model]
    db = profile(case)
    predictor = MemoryPredictor.from_db(db, schedule=args.schedule)
    space = PlanSpace.for_cluster(case.cluster(), predictor.num_layers)
    table = StageTable(predictor, space)
    capacity = parse_bytes(CAPACITY)
    keep = lambda choice, after: table.value(choice, after) <= capacity  # noqa: E731  (inf: not predictable)
    print(f"{count_kept_plans(space, keep):,} of {count_plans(space):,} plans have every stage predicted to fit"
          f" {CAPACITY}; drawing {args.plans}", flush=True)
    results = Path(args.results or HERE / f"results-{args.schedule}.json")
    store = ResultStore(results)
    cache = StageCache(results.with_name(f"stages-{args.model}-{args.schedule}.json"), model=case.model,
                       cluster=case.cluster(memory=None), run_options=case.run_options)
    plans = sample_plans(space, args.plans, seed=args.seed, keep=keep)
    for i, choices in enumerate(plans):
        key = str(i)
        plan = plan_from_choices(space, choices, schedule=args.schedule, global_batch_size=predictor.global_batch_size,
                                 num_microbatches=predictor.num_microbatches)
        if key in store and store[key]["plan"] == plan.to_dict():
            continue
        started, before = time.perf_counter(), cache.simulated
        measured = {d.device: d.measured for d in cache.measure(plan)}
        predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
        devices = [DeviceMemory(d, s, predicted[d], measured[d]) for s, stage in enumerate(plan.stages) for d in stage.devices]
        record = {"plan": plan.to_dict(), "status": "ok", "devices": devices_json(sorted(devices, key=lambda d: d.device))}
        if i < args.check:
            whole = measure_plan(db, plan, cluster=case.cluster(memory=None), backend=case.backend)
            if [d.measured for d in whole.devices] != [measured[d.device] for d in whole.devices]:
                raise SystemExit(f"plan {i}: the stage cache disagrees with a whole-plan simulation; stopping")
            record["checked_whole"] = True
        store.put(key, record)
        errors = [abs(d.error) for d in devices if d.error is not None]
        print(f"[{i + 1}/{len(plans)}] {len(plan.stages)} stages ({cache.simulated - before} simulated now,"
              f" {len(cache.peaks)} known), largest device error {100 * max(errors):.2f}%"
              f" ({time.perf_counter() - started:.1f} s)", flush=True)
    done = [store[str(i)] for i in range(len(plans)) if str(i) in store and store[str(i)]["status"] == "ok"]
    doc = {"format": "hybridplan.prediction_errors", "thresholds": [0.02, 0.05, 0.11],
           "title": f"{args.model} {args.schedule} on {case.mesh}: {len(done)} random plans (simulated devices)",
           "plans": [{"plan": r["plan"], "devices": r["devices"]} for r in done]}
    (HERE / f"errors-{args.schedule}.json").write_text(json.dumps(doc) + "\n")
    print(render_table(view_from_dict(doc, "errors")))


if __name__ == "__main__":
    main()
