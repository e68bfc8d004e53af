"""What the memory-optimal plan costs in throughput against the throughput-optimal plan (seed 001 IV-D).

CAPTURE measured, for its hybrid plans against Alpa's, 18.4-43.9% less peak memory and 11.5-42.4% less
throughput with 1F1B (GPipe: e.g. GPT-3 20.3% less memory for 26.2% less throughput). Here, for each paper
model (benchmarks/paper_profiles.py) and schedule, on the 4x4 mesh of 40 GiB:

- memory-optimal: ``hybridplan plan --objective memory`` (exact, on the profile's predictions);
- throughput-optimal: AMP's search over uniform strategies with every stage inside a node (as CAPTURE's plan
  space and Alpa's submeshes), keeping only plans predicted to fit 40 GiB, at the target's micro-batch count
  (Alpa's benchmark fixes it; the FLOP time model, linear in samples, would always pick the smallest
  micro-batches, which real devices run less efficiently).

Both plans' peaks are measured on simulated devices; their iteration times are PREDICTED by the AMP cost
model (hybridplan/predict/time_model.py) from per-layer FLOPs at 52% of an A100's peak (a stand-in for
measured layer times, which need the GPU: hybridplan/profiling/layer_costs.py [Note: FLOPs for time]) and
the default A100 links (NVLink 300 GB/s in a node, 100 Gb/s InfiniBand between nodes). The whole
memory/time front is written per model and schedule (``pareto-*.json``, rendered by ``hybridplan report``).

Run from the repository root (about 10 minutes after the profiles exist)::

    .venv/bin/python -m benchmarks.throughput_loss.run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.layer_costs import flop_time_profile, measure_layer_costs
from hybridplan.report.data import pareto_document
from hybridplan.report.pareto import memory_time_front, plan_label
from hybridplan.report.plots import plot_pareto
from hybridplan.report.tables import md_cell
from hybridplan.search import PlanSpace, solve_exact
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan

from benchmarks.paper_profiles import CAPACITY, CASES, profile

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt3-1.3b,moe-1.3b,wresnet-1b")
    ap.add_argument("--schedules", default="1f1b,gpipe")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    args = ap.parse_args()
    store = ResultStore(args.results)
    capacity = parse_bytes(CAPACITY)
    rows = []
    for name in args.models.split(","):
        case = CASES[name]
        db = profile(case)
        model = get_model(case.model)
        cluster = case.cluster()
        time_profile = flop_time_profile(model, measure_layer_costs(model, precision=case.precision), precision=case.precision)
        for schedule in args.schedules.split(","):
            predictor = MemoryPredictor.from_db(db, schedule=schedule)

            fits = fits_at_target(predictor, model, cluster, capacity)
            space = PlanSpace.for_cluster(cluster, model.num_layers)
            plans = {"memory-optimal": solve_exact(predictor, space).to_plan(
                schedule=schedule, global_batch_size=predictor.global_batch_size, num_microbatches=predictor.num_microbatches)}
            found = search_throughput(time_profile, cluster, predictor.global_batch_size, schedule=schedule,
                                      node_local_stages=True, memory_ok=fits)
            try:
                plans["throughput-optimal"] = found.best.plan
            except HybridPlanError as e:  # MoE 1.3B under GPipe: no uniform strategy is predicted to fit
                print(f"{name}/{schedule}: no throughput-optimal plan: {e.message}; skipped", flush=True)
                rows.append({"model": name, "schedule": schedule, "skipped": f"no uniform strategy fits {CAPACITY}"})
                continue
            row = {"model": name, "schedule": schedule}
            for which, plan in plans.items():
                key = f"{name}/{schedule}/{which}"
                if key not in store or store[key]["plan"] != plan.to_dict():
                    started = time.perf_counter()
                    m = measure_plan(db, plan, cluster=case.cluster(memory=None), backend=case.backend)
                    store.put(key, {"plan": plan.to_dict(), "status": m.status, "devices": devices_json(m.devices),
                                    "measured_peak_bytes": m.peak("measured"), "predicted_peak_bytes": m.peak("predicted")})
                    print(f"{key}: measured {format_bytes(m.peak('measured'))} ({time.perf_counter() - started:.0f} s)", flush=True)
                row[which] = {"label": plan_label(plan), "measured_peak_bytes": store[key]["measured_peak_bytes"],
                              "predicted_peak_bytes": store[key]["predicted_peak_bytes"],
                              "iteration_s": predict_iteration_time(plan, time_profile, cluster).total_s}
            mem, thr = row["memory-optimal"], row["throughput-optimal"]
            row["memory_gain"] = 1 - mem["measured_peak_bytes"] / thr["measured_peak_bytes"]
            row["throughput_loss"] = 1 - thr["iteration_s"] / mem["iteration_s"]
            rows.append(row)
            view, unpriced = memory_time_front(predictor, time_profile, cluster, title=f"{name} {schedule} on 4x4 (predicted)",
                                               marks=plans)
            (HERE / f"pareto-{name}-{schedule}.json").write_text(
                json.dumps(pareto_document(view.points, title=view.title, marks=view.marks)) + "\n")
            if schedule == "1f1b":
                plot_pareto(view, HERE / f"pareto-{name}-{schedule}.png")
    (HERE / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| model | schedule | memory-optimal plan | peak (measured) | s/iter (predicted) | throughput-optimal plan |"
          " peak (measured) | s/iter (predicted) | memory gain | throughput loss |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['model']} | {r['schedule']} | {r['skipped']} | | | | | | | |")
            continue
        m, t = r["memory-optimal"], r["throughput-optimal"]
        print(f"| {r['model']} | {r['schedule']} | {md_cell(m['label'])} | {format_bytes(m['measured_peak_bytes'])} | {m['iteration_s']:.3f} |"
              f" {md_cell(t['label'])} | {format_bytes(t['measured_peak_bytes'])} | {t['iteration_s']:.3f} |"
              f" {100 * r['memory_gain']:.1f}% | {100 * r['throughput_loss']:.1f}% |")


if __name__ == "__main__":
    main()
