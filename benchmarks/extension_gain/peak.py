"""The lowest peak per space: the exact solver's plan (the uniform 3D plans': the lowest of them), each run on
simulated devices."""

from __future__ import annotations

import time
from collections.abc import Callable

from hybridplan.errors import HybridPlanError
from hybridplan.plan import Plan
from hybridplan.units import format_bytes
from hybridplan.workflows.plan_memory import plan_memory
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.megatron import megatron
from benchmarks.extension_gain.plans import label, needed, simulate
from benchmarks.extension_gain.settings import Setting, spaces, uniform_baselines

def lowest_peak(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """Per space, the plan of the lowest predicted peak, and its run on simulated devices."""
    name = s.case.model
    unlimited = s.case.cluster(memory=None)
    for space, options in spaces(s).items():
        key = f"{name}/peak/{space}"
        if key not in store:
            started = time.perf_counter()
            try:
                found = plan_memory(s.db, unlimited, **options)
            except HybridPlanError as e:
                store.put(key, {"error": str(e)})
                continue
            outside = s.unsearched_zero(found.plan)
            if outside is not None:
                store.put(key, {"error": outside})
                continue
            store.put(key, {"plan": found.plan.to_dict(), "label": label(found.plan),
                            "predicted_peak_bytes": found.prediction.peak_memory_bytes,
                            "needed_bytes": needed(found.prediction),
                            "search_seconds": time.perf_counter() - started})
        r = store[key]
        say(f"{name} {space}: {r.get('label', r.get('error'))}: predicted {format_bytes(r.get('predicted_peak_bytes'))}")
        if validate and "plan" in r and "simulated" not in r:
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), s.case.cluster(), options.get("recompute_db"))
            store.put(key, r)
            say(f"  simulated: {r['simulated']['status']}, measured {format_bytes(r['simulated']['measured_peak_bytes'])}")



def megatron_lowest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The lowest uniform 3D plan, without ZeRO and with ZeRO-1 where the setting searches it, run on simulated
    devices."""
    for space, zero in uniform_baselines(s).items():
        key = f"{s.case.model}/peak/{space}"
        if key not in store:
            started = time.perf_counter()
            r = megatron(s, s.case.cluster(), say, zero=zero)
            r["search_seconds"] = time.perf_counter() - started
            store.put(key, r)
        r = store[key]
        best = next((row for row in r["rows"] if row["shape"] == r["best"]), None)
        if validate and best is not None and "simulated" not in best:
            best["simulated"] = simulate(s, Plan.from_dict(best["plan"]), s.case.cluster())
            store.put(key, r)
        if best is not None:
            say(f"{s.case.model} {space}: {best['label']}: predicted {format_bytes(best.get('predicted_peak_bytes'))},"
                f" measured {format_bytes(best.get('simulated', {}).get('measured_peak_bytes'))}")
