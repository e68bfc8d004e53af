"""The Megatron-style baseline: every uniform 3D plan of a mesh, predicted (run on simulated devices where the
profile cannot predict it), and the best of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.search.baselines import uniform_3d_plan, uniform_3d_shapes

from benchmarks.extension_gain.plans import _optimizer_bytes, extrapolated, fitted, label, needed, peak_of, predictor_for, simulate
from benchmarks.extension_gain.settings import Setting

def megatron(s: Setting, cluster: Cluster, say: Callable[[str], None], *, by: str = "peak",
             zero: int | None = None) -> dict[str, Any]:
    """Every uniform 3D plan on ``cluster`` (with its capacity) with its predicted peak, and the best ``by``
    "peak" (the lowest) or "fit" (the first found that fits: for the fewest devices). ``zero``: the ZeRO level
    over each stage's data group (0 or 1: Megatron's distributed optimizer); default ZeRO-1 where the setting
    searches it (:attr:`Setting.zero`).

    A plan with a degree above the profiled ones is also run on simulated devices, its measured peak standing for
    the prediction: by "peak", any such degree (the lowest-peak column measures its rows); by "fit", only a
    tensor degree, which seed 000's fit predicts, not a data degree, which is composed (:func:`~.plans.fitted`):
    the fewest-devices and largest-model columns ask whether a plan is *predicted* to fit, as for the other
    spaces, and each such run of 16 simulated devices takes 7 to 26 minutes at paper size.

    ZeRO-1 of a data x tensor stage is predicted only from a profile that records the tensor shards (an older one:
    predict/plan_checks.py refuses it), so where it is refused such a plan is run on simulated devices when it could beat the best predicted one (or, ``by="fit"``, when none
    fits): when its peak predicted without ZeRO, less all the optimizer state of its largest stage (more than
    ZeRO-1 can remove), is lower. Its measured peak then stands for its prediction."""
    c, model = s.case, get_model(s.case.model)
    capacity = cluster.memory_of(0)
    rows: list[dict[str, Any]] = []
    for pp, tp, dp in uniform_3d_shapes(cluster, model.num_layers):
        row: dict[str, Any] = {"shape": f"pp{pp} tp{tp} dp{dp}"}
        rows.append(row)
        try:
            plan = uniform_3d_plan(num_layers=model.num_layers, cluster=cluster, pipeline=pp, tensor=tp,
                                   schedule=c.schedule, global_batch_size=c.global_batch_size,
                                   num_microbatches=c.num_microbatches,
                                   zero=(1 if 1 in s.zero else 0) if zero is None else zero)
            plan.validate(model=model, cluster=cluster)
        except HybridPlanError as e:
            row["invalid"] = e.message
            continue
        row["plan"], row["label"] = plan.to_dict(), label(plan)
        predictor = predictor_for(s, plan)
        if fitted(predictor, plan) if by == "fit" else extrapolated(predictor, plan):
            row["extrapolated"] = True
        try:
            prediction = predictor.predict(plan)
            row["predicted_peak_bytes"], row["needed_bytes"] = prediction.peak_memory_bytes, needed(prediction)
        except HybridPlanError as e:  # ZeRO-1 of data x tensor stages
            row["unpredicted"] = e.message
            d = plan.to_dict()
            unsharded = Plan.from_dict({**d, "stages": [{**st, "zero": 0} for st in d["stages"]]})
            try:
                row["bound_bytes"] = predictor.predict(unsharded).peak_memory_bytes - _optimizer_bytes(predictor, plan)
            except HybridPlanError as e2:
                row["invalid"] = e2.message
    for r in rows:  # a degree beyond the profiled ones is extrapolated (MoE 1.3B data x8: 34% under): measure it
        if r.get("extrapolated") and "predicted_peak_bytes" in r:
            say(f"  simulating {r['label']} on {cluster.shape} (a degree beyond the profiled ones)")
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
    predicted = [{**r, "predicted_peak_bytes": peak_of(r)} for r in rows if peak_of(r) is not None]
    if by == "fit":
        fitting = [r for r in predicted if capacity is None or (r["simulated"]["status"] == "ok" if "simulated" in r
                                                                else r["needed_bytes"] <= capacity)]
        best = fitting[0] if fitting else None
        bar = float("inf") if best is None else -1.0  # one that fits is enough
    else:
        best = min(predicted, key=lambda r: r["predicted_peak_bytes"], default=None)
        bar = float("inf") if best is None else best["predicted_peak_bytes"]
    for r in sorted((r for r in rows if "bound_bytes" in r), key=lambda r: r["bound_bytes"]):
        if r["bound_bytes"] >= bar or (capacity is not None and r["bound_bytes"] > capacity):  # the tensors alone
            r["pruned"] = True
            continue
        say(f"  simulating {r['label']} on {cluster.shape} (ZeRO-1 of data x tensor stages is not predicted)")
        r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
        peak = r["simulated"]["measured_peak_bytes"]
        if r["simulated"]["status"] == "ok" and peak is not None and (by == "fit" or peak < bar):
            best, bar = r, (-1.0 if by == "fit" else peak)
            if by == "fit":
                break
    fits = best is not None and ("needed_bytes" in best and (capacity is None or best["needed_bytes"] <= capacity)
                                 or best.get("simulated", {}).get("status") == "ok")
    return {"rows": rows, "best": None if best is None else best["shape"], "fits": fits}


