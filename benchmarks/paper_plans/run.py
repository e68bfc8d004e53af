"""Paper-size models end to end on simulated devices: profile, plan and validate on a 4x4 mesh of 40 GiB.

The question a user asks before renting GPUs (issue "simulated devices"): does GPT-3 2.6B fit on 16 x 40 GB,
and with which plan? For each paper-size model of CAPTURE's evaluation (seed 001), on simulated devices
(``--backend sim --device cuda --precision bf16``: fake tensors, CUDA allocator terms):

1. **profile**: the CAPTURE campaign (``hybridplan profile``; all scenarios: pipeline, data 2/4, tensor 2/4,
   at B/2 and B/4), on devices of 40 GiB (runs that exceed it are substituted, as on real GPUs);
2. **plan**: ``hybridplan plan --objective memory`` (exact solver) for the target batch;
3. **validate**: run the recommended plan on 16 simulated 40 GiB devices and compare every device's
   measured peak with its prediction.

Batches are Alpa's benchmark suites' (../shared/data/alpa/suites_extracted: GPT 1024 sequences, MoE 1024,
Wide-ResNet 1536 images) at micro-batch counts that keep Alpa's micro-batch sizes within a factor of two.
Profiles made earlier by benchmarks/paper_profiles.py (smaller batches) are reused where they exist, and
their profiling time is read from the database (first to last run) instead of measured here.

Run from the repository root (resumable per model; about 15 minutes per model to profile on 2 cores)::

    .venv/bin/python -m benchmarks.paper_plans.run                   # all models
    .venv/bin/python -m benchmarks.paper_plans.run --models gpt3-2.6b
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path

from hybridplan.models.zoo import get_model
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.report.pareto import plan_label
from hybridplan.report.tables import md_cell
from hybridplan.search import PlanSpace
from hybridplan.search.memory.exact import solve_exact
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan

from benchmarks.paper_profiles import CAPACITY, CASES, Case, profile

HERE = Path(__file__).resolve().parent

MODELS: dict[str, Case] = {
    "gpt3-1.3b": CASES["gpt3-1.3b"],
    "gpt3-2.6b": Case("gpt3-2.6b", "4x4", 1024, 64, "bf16", profile_capacity=CAPACITY),
    "gpt3-6.7b": Case("gpt3-6.7b", "4x4", 1024, 64, "bf16", profile_capacity=CAPACITY),
    "moe-1.3b": CASES["moe-1.3b"],
    "moe-2.4b": Case("moe-2.4b", "4x4", 1024, 32, "bf16", profile_capacity=CAPACITY),
    "wresnet-1b": CASES["wresnet-1b"],
    "wresnet-2b": Case("wresnet-2b", "4x4", 1536, 24, "bf16", profile_capacity=CAPACITY),
}


def profile_seconds(db: Path) -> tuple[int, int, float]:
    """(runs, failed runs, seconds from the first run's start to the last run's end) of a profile."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT status, wall_seconds, finished_at FROM runs ORDER BY finished_at").fetchall()
    first_start = rows[0][2] - (rows[0][1] or 0.0)
    return len(rows), sum(1 for r in rows if r[0] != "ok"), rows[-1][2] - first_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--results", default=str(HERE / "results.json"))
    args = ap.parse_args()
    store = ResultStore(args.results)
    capacity = parse_bytes(CAPACITY)
    for name in args.models.split(","):
        if name in store:
            continue
        case = MODELS[name]
        existed = case.db.exists()
        started = time.perf_counter()
        db = profile(case)
        profiled_here = time.perf_counter() - started
        runs, failed, span = profile_seconds(db)
        started = time.perf_counter()
        predictor = MemoryPredictor.from_db(db, schedule=case.schedule)
        space = PlanSpace.for_cluster(case.cluster(), get_model(case.model).num_layers)
        plan = solve_exact(predictor, space).to_plan(schedule=case.schedule, global_batch_size=case.global_batch_size,
                                                     num_microbatches=case.num_microbatches)
        plan_seconds = time.perf_counter() - started
        started = time.perf_counter()
        m = measure_plan(db, plan, cluster=case.cluster(), backend="sim")
        validate_seconds = time.perf_counter() - started
        record = {
            "model": case.model, "global_batch_size": case.global_batch_size, "num_microbatches": case.num_microbatches,
            "profile_schedule": case.schedule, "profile_reused": existed, "profile_runs": runs, "profile_failed_runs": failed,
            "profile_seconds": profiled_here if not existed else span, "plan_seconds": plan_seconds,
            "validate_seconds": validate_seconds, "plan": plan.to_dict(), "plan_label": plan_label(plan),
            "status": m.status, "reason": m.reason, "devices": devices_json(m.devices),
            "predicted_peak_bytes": m.peak("predicted"), "measured_peak_bytes": m.peak("measured"),
            "fits": m.status == "ok" and (m.peak("measured") or 0) <= capacity,
        }
        store.put(name, record)
        print(f"{name}: {record['plan_label']}: {m.status}, predicted {format_bytes(m.peak('predicted'))},"
              f" measured {format_bytes(m.peak('measured'))}; profile {record['profile_seconds']:.0f} s"
              f" ({runs} runs), plan {plan_seconds:.2f} s, validate {validate_seconds:.0f} s", flush=True)
    print_table(store)


def print_table(store: ResultStore) -> None:
    """The README's table, from the results file."""
    print("| model | batch / micro | profile runs | profile | plan | recommended plan | predicted peak | measured peak"
          " | largest error | fits 40 GiB |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|")
    for name, r in store.records.items():
        errors = [abs(d["predicted"] - d["measured"]) / d["measured"] for d in r["devices"]
                  if d["predicted"] is not None and d["measured"]]
        largest = f"{100 * max(errors):.2f}%" if errors else "n/a"
        reused = " (earlier)" if r["profile_reused"] else ""
        print(f"| {name} | {r['global_batch_size']} / {r['num_microbatches']} | {r['profile_runs']} |"
              f" {r['profile_seconds'] / 60:.1f} min{reused} | {r['plan_seconds']:.2f} s | {md_cell(r['plan_label'])} |"
              f" {format_bytes(r['predicted_peak_bytes'])} | {format_bytes(r['measured_peak_bytes'])} | {largest} |"
              f" {'yes' if r['fits'] else 'no'} |")


if __name__ == "__main__":
    main()
