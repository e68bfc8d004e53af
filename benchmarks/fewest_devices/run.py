"""The fewest devices that train a model, ours against a throughput-oriented planner (seed 001 IV-E).

CAPTURE trained Wide-ResNet 1B on 6 GPUs where Alpa's plan needed 16 (it ran out of memory on 8), and the
6-GPU run was 36.3% faster than Alpa's on 16. Here, on sub-meshes of the 4x4 mesh of 40 GiB devices:

- ours: ``hybridplan plan --fewest-devices`` (the smallest sub-mesh whose memory-optimal plan is predicted to
  fit; fewer nodes first at equal device counts);
- throughput-oriented: on each sub-mesh, the fastest plan of AMP's search (stages inside a node) WITHOUT a
  memory check, as a throughput planner that does not model memory returns it; it "needs" the smallest mesh
  on which that plan's measured peak fits. Beside it, the same search keeping only plans predicted to fit
  (a planner with a memory model, like Alpa's profiling). Both keep the target's micro-batch count, as Alpa's
  benchmark fixes it (the FLOP time model, linear in samples, would always pick the smallest micro-batches).

Every plan reported is run on simulated devices (measured peaks). Iteration times are predicted by the AMP
cost model from per-layer FLOPs (a stand-in for measured layer times: hybridplan/profiling/layer_costs.py
[Note: FLOPs for time]); throughput = global batch / iteration time.

Run from the repository root (a few minutes once the profile exists)::

    .venv/bin/python -m benchmarks.fewest_devices.run --model wresnet-1b --schedule gpipe
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.layer_costs import flop_time_profile, measure_layer_costs
from hybridplan.report.pareto import plan_label
from hybridplan.report.tables import md_cell
from hybridplan.search import fewest_devices
from hybridplan.search.memory.fewest import mesh_shapes
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore, measure_plan

from benchmarks.paper_profiles import CAPACITY, CASES, profile

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="wresnet-1b")
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--results", default=None, help="default: results-<model>-<schedule>.json here")
    args = ap.parse_args()
    case = CASES[args.model]
    db = profile(case)
    model = get_model(case.model)
    capacity = parse_bytes(CAPACITY)
    full = case.cluster()
    predictor = MemoryPredictor.from_db(db, schedule=args.schedule)
    batch = predictor.global_batch_size
    time_profile = flop_time_profile(model, measure_layer_costs(model, precision=case.precision), precision=case.precision)
    store = ResultStore(args.results or HERE / f"results-{args.model}-{args.schedule}.json")

    def measured(key: str, plan: Plan, shape: str) -> dict:
        if key not in store or store[key]["plan"] != plan.to_dict():
            started = time.perf_counter()
            n, k = (int(x) for x in shape.split("x"))
            m = measure_plan(db, plan, cluster=full.with_shape(n, k).with_memory(None), backend=case.backend)
            store.put(key, {"plan": plan.to_dict(), "status": m.status, "measured_peak_bytes": m.peak("measured"),
                            "predicted_peak_bytes": m.peak("predicted")})
            print(f"  {key}: {m.status} measured {format_bytes(m.peak('measured'))} ({time.perf_counter() - started:.0f} s)", flush=True)
        return store[key]

    def same_count(plan: Plan) -> bool:
        """The target's micro-batch count (Alpa's benchmark fixes it; the FLOP time model, linear in samples,
        would otherwise always pick the smallest micro-batches)."""
        return plan.num_microbatches == predictor.num_microbatches

    rows = []
    found = fewest_devices(predictor, full, model.num_layers, capacity=capacity)
    ours = found.result.to_plan(schedule=args.schedule, global_batch_size=batch, num_microbatches=predictor.num_microbatches)
    shape = found.cluster.shape
    r = measured(f"ours/{shape}", ours, shape)
    rows.append(("ours (memory-optimal, fewest devices)", shape, ours, r,
                 predict_iteration_time(ours, time_profile, found.cluster).total_s))
    unaware_needs = aware_needs = None
    attempts: list[tuple[str, Plan, dict]] = []
    for n, k in mesh_shapes(full.num_nodes, full.devices_per_node):
        cluster, shape = full.with_shape(n, k), f"{n}x{k}"
        try:
            fastest = search_throughput(time_profile, cluster, batch, schedule=args.schedule, node_local_stages=True,
                                        memory_ok=same_count).best
        except HybridPlanError:
            continue
        if unaware_needs is None:
            r = measured(f"throughput/{shape}", fastest.plan, shape)
            attempts.append((shape, fastest.plan, r))
            if r["status"] == "ok" and r["measured_peak_bytes"] <= capacity:
                unaware_needs = shape
                rows.append(("throughput-optimal, memory-unaware", shape, fastest.plan, r, fastest.iteration_s))
        if aware_needs is None:
            aware = search_throughput(time_profile, cluster, batch, schedule=args.schedule, node_local_stages=True,
                                      memory_ok=fits_at_target(predictor, model, cluster, capacity))
            if aware.candidates:
                aware_needs = shape
                r = measured(f"throughput-aware/{shape}", aware.best.plan, shape)
                rows.append(("throughput-optimal, memory-aware", shape, aware.best.plan, r, aware.best.iteration_s))
    full_fastest = search_throughput(time_profile, full, batch, schedule=args.schedule, node_local_stages=True,
                                     memory_ok=fits_at_target(predictor, model, full, capacity)).best
    r = measured("throughput-aware/4x4", full_fastest.plan, "4x4")
    rows.append(("throughput-optimal, memory-aware, all 16", "4x4", full_fastest.plan, r, full_fastest.iteration_s))
    print(f"\n{args.model} {args.schedule}, global batch {batch}, {CAPACITY} devices; tried for ours: "
          + ", ".join(f"{a.num_nodes}x{a.devices_per_node}" for a in found.tried))
    print("\nmemory-unaware throughput planner, fastest plan per mesh until one fits:")
    print("| mesh | plan | peak (measured) | peak (predicted) | fits |\n|---|---|---:|---:|---|")
    for shape, plan, r in attempts:
        fits = r["status"] == "ok" and r["measured_peak_bytes"] <= capacity
        print(f"| {shape} | {md_cell(plan_label(plan))} | {format_bytes(r['measured_peak_bytes'])} | {format_bytes(r['predicted_peak_bytes'])}"
              f" | {'yes' if fits else 'no'} |")
    print("\n| planner | mesh | devices | plan | peak (measured) | peak (predicted) | s/iter (predicted) | samples/s (predicted) |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for name, shape, plan, r, seconds in rows:
        n, k = (int(x) for x in shape.split("x"))
        print(f"| {name} | {shape} | {n * k} | {md_cell(plan_label(plan))} | {format_bytes(r['measured_peak_bytes'])} |"
              f" {format_bytes(r['predicted_peak_bytes'])} | {seconds:.3f} | {batch / seconds:.1f} |")
    (HERE / f"summary-{args.model}-{args.schedule}.json").write_text(json.dumps(
        [{"planner": n, "mesh": s, "plan": p.to_dict(), **r, "iteration_s": t} for n, s, p, r, t in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
