"""Peak memory of the memory-optimal plan against the partitioners people use, measured (seed 001 IV-A, seed 004).

For each model (benchmarks/paper_profiles.py), schedule (GPipe, 1F1B) and plan space (hybrid: any stage
data/tensor-parallel; pipeline-only: one stage per device), the plans compared are:

- ours: ``hybridplan plan --objective memory`` (exact solver on the profile's predictions);
- pipeline-only: ``equal`` (Megatron-LM, and Alpa's uniform split of equal layers), ``torchgpipe-time``
  (per-layer FLOPs standing in for measured times, see hybridplan/profiling/layer_costs.py),
  ``torchgpipe-time measured`` for the tiny model on the real runtime (layer times measured on this CPU by
  ``hybridplan profile --time``), ``torchgpipe-size`` (torchgpipe's latent bytes of one sample x micro-batch + 2 x parameter bytes, counted on
  fake tensors), ``deepspeed-parameters``;
- hybrid: ``equal data4`` / ``equal tensor4`` (Alpa's UniformStageOption: 4 stages of equal layers, each on
  one node's 4 devices), ``throughput-optimal`` (AMP's search over uniform strategies with stages inside a
  node and the FLOP time model, keeping only plans predicted to fit 40 GiB: what Alpa's auto-stage returns).
  Its micro-batch count is held at the target's, as Alpa's benchmark fixes it: the FLOP time model is linear
  in the samples, so it would always prefer the smallest micro-batches, which real devices run less
  efficiently.

Every plan is run (simulated devices, unlimited memory so peaks above 40 GiB are measured too) and its
predicted and measured per-device peaks kept in ``results.json`` (resumable); ``comparison.json`` is the
report's input. Run from the repository root::

    .venv/bin/python -m benchmarks.memory_reduction.run                    # all models
    .venv/bin/python -m benchmarks.memory_reduction.run --models wresnet-tiny
    .venv/bin/hybridplan report benchmarks/memory_reduction/comparison.json --png benchmarks/memory_reduction/memory_reduction.png
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.layer_costs import baseline_layer_costs, flop_time_profile, measure_layer_costs
from hybridplan.search import PlanSpace, solve_exact
from hybridplan.search.baselines import baseline_plan
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan

from benchmarks.paper_profiles import CAPACITY, CASES, Case, measured_layer_times, profile

HERE = Path(__file__).resolve().parent

PIPELINE_BASELINES = ("equal", "torchgpipe-time", "torchgpipe-size", "deepspeed-parameters")


def plans_for(case: Case, predictor: MemoryPredictor, space_name: str) -> dict[str, Plan | str]:
    """Ours first, then the baselines (a string where a baseline has no plan, saying why)."""
    model = get_model(case.model)
    cluster = case.cluster()
    capacity = parse_bytes(CAPACITY)
    common = dict(num_layers=model.num_layers, cluster=cluster, schedule=predictor.schedule,
                  global_batch_size=predictor.global_batch_size, num_microbatches=predictor.num_microbatches)
    space = PlanSpace.for_cluster(cluster, model.num_layers, pipeline_only=space_name == "pipeline")
    out: dict[str, Plan | str] = {"ours": solve_exact(predictor, space).to_plan(
        schedule=predictor.schedule, global_batch_size=predictor.global_batch_size, num_microbatches=predictor.num_microbatches)}
    costs = measure_layer_costs(model, precision=case.precision)
    if space_name == "pipeline":
        for name in PIPELINE_BASELINES:
            try:
                out[name] = baseline_plan(name, layer_costs=baseline_layer_costs(costs, name, microbatch_size=predictor.microbatch_size), **common)
            except HybridPlanError as e:
                out[name] = f"no plan: {e.message}"
        times = measured_layer_times(case)  # the real runtime's own device: torchgpipe's measured balance
        if times is not None:
            out["torchgpipe-time measured"] = baseline_plan("torchgpipe-time", layer_costs=times, **common)
        return out
    for kind in ("data", "tensor"):
        try:
            plan = baseline_plan("equal", stage_degrees=cluster.devices_per_node, parallelism=kind, **common)
            plan.validate(model=model, cluster=cluster)
            out[f"equal {kind}{cluster.devices_per_node}"] = plan
        except HybridPlanError as e:
            out[f"equal {kind}{cluster.devices_per_node}"] = f"no plan: {e.message}"

    fits = fits_at_target(predictor, model, cluster, capacity)

    time_profile = flop_time_profile(model, costs, precision=case.precision)
    found = search_throughput(time_profile, cluster, predictor.global_batch_size, schedule=predictor.schedule,
                              node_local_stages=True, memory_ok=fits)
    out["throughput-optimal"] = found.best.plan if found.candidates else "no plan fits (throughput search)"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    args = ap.parse_args()
    store = ResultStore(args.results)
    for name in args.models.split(","):
        case = CASES[name]
        db = profile(case)
        for schedule in args.schedules.split(","):
            predictor = MemoryPredictor.from_db(db, schedule=schedule)
            for space_name in ("hybrid", "pipeline"):
                for plan_name, plan in plans_for(case, predictor, space_name).items():
                    key = f"{name}/{schedule}/{space_name}/{plan_name}"
                    if key in store:
                        continue
                    if isinstance(plan, str):
                        store.put(key, {"status": "no plan", "reason": plan})
                        print(f"{key}: {plan}", flush=True)
                        continue
                    started = time.perf_counter()
                    m = measure_plan(db, plan, cluster=case.cluster(memory=None), backend=case.backend)
                    store.put(key, {"plan": plan.to_dict(), "status": m.status, "reason": m.reason,
                                    "devices": devices_json(m.devices)})
                    print(f"{key}: {m.status}, measured peak {format_bytes(m.peak('measured'))}, predicted"
                          f" {format_bytes(m.peak('predicted'))} ({time.perf_counter() - started:.0f} s)", flush=True)
    write_comparison(store, HERE / "comparison.json")


def write_comparison(store: ResultStore, path: Path) -> None:
    """The report's ``hybridplan.memory_comparison`` document: one group per model, schedule and space."""
    import json

    groups: dict[str, list[dict]] = {}
    for key, record in store.records.items():
        model, schedule, space_name, plan_name = key.split("/")
        if record["status"] != "ok":
            continue
        label = "GPipe" if schedule == "gpipe" else "1F1B"
        groups.setdefault(f"{model} {label} {space_name}", []).append(
            {"name": plan_name, "plan": record["plan"], "devices": record["devices"]})
    def capacity(title: str) -> int | None:
        return parse_bytes(CAPACITY) if CASES[title.split()[0]].backend == "sim" else None

    doc = {"format": "hybridplan.memory_comparison",
           "title": "Peak memory: ours against baselines (paper sizes: 4x4 simulated 40 GiB; tiny: real CPU runtime)",
           "groups": [{"title": t, "capacity_bytes": capacity(t), "plans": sorted(p, key=lambda r: r["name"] != "ours")}
                      for t, p in groups.items()]}
    path.write_text(json.dumps(doc, indent=0) + "\n")


if __name__ == "__main__":
    main()
