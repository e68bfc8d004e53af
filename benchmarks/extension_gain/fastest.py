"""The fastest plan that fits per space."""

from __future__ import annotations

import time
from collections.abc import Callable

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.layer_costs import flop_time_profile, measure_layer_costs
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import parse_bytes
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.plans import label, needed, simulate
from benchmarks.extension_gain.settings import Setting, uniform_baselines
from benchmarks.paper_profiles import CAPACITY

def fastest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The fastest plan that fits 40 GiB: AMP's search (CAPTURE's stages inside a node; extended: data x tensor
    stages, replicas across nodes) and the fastest uniform 3D plan that fits (without ZeRO, and with ZeRO-1 where
    the setting searches it: from the lowest-peak column's rows), all timed by the AMP cost
    model from per-layer FLOPs (no GPU to measure layer times)."""
    c = s.case
    model = get_model(c.model)
    cluster = c.cluster()
    capacity = parse_bytes(CAPACITY)
    profile = flop_time_profile(model, measure_layer_costs(model, precision=c.precision), precision=c.precision)
    predictor = MemoryPredictor.from_db(s.db, schedule=c.schedule)
    for space, composite in (("capture", False), ("extended (AMP dp x tp)", True)):
        key = f"{c.model}/fastest/{space}"
        if key not in store:
            started = time.perf_counter()
            try:
                found = search_throughput(profile, cluster, c.global_batch_size, schedule=c.schedule,
                                          node_local_stages=True, composite=composite,
                                          memory_ok=fits_at_target(predictor, model, cluster, capacity))
                best = found.best
                prediction = predictor.predict(best.plan)
                store.put(key, {"plan": best.plan.to_dict(), "label": label(best.plan), "seconds_per_iteration":
                                best.iteration_s, "predicted_peak_bytes": prediction.peak_memory_bytes,
                                "needed_bytes": needed(prediction), "evaluated": found.evaluated,
                                "search_seconds": time.perf_counter() - started})
            except HybridPlanError as e:
                store.put(key, {"error": e.message})
        r = store[key]
        if validate and "plan" in r and "simulated" not in r:
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
            store.put(key, r)
        say(f"{c.model} fastest {space}: {r.get('label', r.get('error'))} {r.get('seconds_per_iteration')}")
    for space in uniform_baselines(s):
        key = f"{c.model}/fastest/{space}"
        if key not in store:
            rows = store[f"{c.model}/peak/{space}"]["rows"]
            timed = []
            for row in rows:
                ok = (row.get("needed_bytes", capacity + 1) <= capacity
                      or row.get("simulated", {}).get("status") == "ok")
                if "plan" in row and ok:
                    plan = Plan.from_dict(row["plan"])
                    timed.append((predict_iteration_time(plan, profile, cluster).total_s, row["shape"], row["label"],
                                  row.get("predicted_peak_bytes"), row.get("simulated", {}).get("measured_peak_bytes")))
            unknown = [row["shape"] for row in rows if "bound_bytes" in row and "simulated" not in row]
            best_t = min(timed, default=None)
            store.put(key, {"seconds_per_iteration": None if best_t is None else best_t[0],
                            "shape": None if best_t is None else best_t[1], "label": None if best_t is None else best_t[2],
                            "predicted_peak_bytes": None if best_t is None else best_t[3],
                            "simulated": {} if best_t is None or best_t[4] is None else {"measured_peak_bytes": best_t[4]},
                            "fitting": len(timed), "not_known_to_fit": unknown})
        say(f"{c.model} fastest {space}: {store[key]}")


