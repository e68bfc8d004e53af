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
from hybridplan.search.time.feasibility import Feasibility
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import parse_bytes
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.plans import label, needed, simulate
from benchmarks.extension_gain.settings import Setting, uniform_baselines
from benchmarks.paper_profiles import CAPACITY

def options_space(s: Setting) -> str | None:
    """The fastest column's space whose stages also take options: the extended space with, per stage, the
    setting's ZeRO levels and recompute where a recompute profile exists (None: the setting has neither)."""
    parts = [*([s.zero_space[2:]] if s.zero_space else []), *(["recompute"] if s.recompute_db is not None else [])]
    return f"extended + {' + '.join(parts)} per stage" if parts else None


def fastest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The fastest plan that fits 40 GiB: AMP's search (CAPTURE's stages inside a node; extended: data x tensor
    stages, replicas across nodes) and the fastest uniform 3D plan that fits (without ZeRO, and with ZeRO-1 where
    the setting searches it: from the lowest-peak column's rows), all timed by the AMP cost
    model from per-layer FLOPs (no GPU to measure layer times); and the extended space with per-stage options
    (:func:`options_space`: AMP's plans whose stages may also shard or recompute, each stage's options chosen by
    the throughput search from their predicted peaks)."""
    c = s.case
    model = get_model(c.model)
    cluster = c.cluster()
    capacity = parse_bytes(CAPACITY)
    profile = flop_time_profile(model, measure_layer_costs(model, precision=c.precision), precision=c.precision)
    predictor = MemoryPredictor.from_db(s.db, schedule=c.schedule)
    spaces = [("capture", False, False), ("extended (AMP dp x tp)", True, False)]
    if (with_options := options_space(s)) is not None:
        spaces.append((with_options, True, True))
    for space, composite, options in spaces:
        key = f"{c.model}/fastest/{space}"
        if key not in store:
            started = time.perf_counter()
            try:
                # with stage options, each stage of AMP's plans may also shard (the setting's ZeRO levels) and
                # recompute (from the recompute profile), chosen per stage by their predicted peaks
                p = MemoryPredictor.from_db(s.db, schedule=c.schedule, recompute_db=s.recompute_db) if options else predictor
                found = search_throughput(profile, cluster, c.global_batch_size, schedule=c.schedule,
                                          node_local_stages=True, composite=composite,
                                          memory_ok=fits_at_target(p, model, cluster, capacity),
                                          zero_levels=s.zero if options else (),
                                          recompute=options and s.recompute_db is not None,
                                          stage_peaks=Feasibility(c.cluster(), p, model).stage_peaks if options else None)
                best = found.best
                prediction = p.predict(best.plan)
                store.put(key, {"plan": best.plan.to_dict(), "label": label(best.plan), "seconds_per_iteration":
                                best.iteration_s, "predicted_peak_bytes": prediction.peak_memory_bytes,
                                "needed_bytes": needed(prediction), "evaluated": found.evaluated,
                                "search_seconds": time.perf_counter() - started})
            except HybridPlanError as e:
                store.put(key, {"error": e.message})
        r = store[key]
        if validate and "plan" in r and "simulated" not in r:
            # run already where another space chose the same plan
            r["simulated"] = next((o["simulated"] for k, o in store.records.items() if k.startswith(f"{c.model}/fastest/")
                                   and o.get("plan") == r["plan"] and "simulated" in o), None)
            if r["simulated"] is None:
                r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster, s.recompute_db if options else None)
            store.put(key, r)
        say(f"{c.model} fastest {space}: {r.get('label', r.get('error'))} {r.get('seconds_per_iteration')}")
    for space in uniform_baselines(s):
        key = f"{c.model}/fastest/{space}"
        if key not in store and f"{c.model}/peak/{space}" not in store:
            say(f"{c.model} fastest {space}: not yet (its plans are the lowest-peak column's: --columns peak)")
            continue
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


