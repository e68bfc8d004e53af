"""What every column does with a plan: its label, its prediction, its run on simulated devices, and the
``hybridplan`` command line run in this process."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

from hybridplan.errors import HybridPlanError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan

from benchmarks.extension_gain.settings import HERE, Setting

def cli(argv: list[str]) -> tuple[int, str]:
    """Run ``hybridplan`` in this process; (exit code, its stderr)."""
    from hybridplan.cli import main as hybridplan

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = hybridplan(argv)
    return code, err.getvalue()


def label(plan: Plan) -> str:
    """``[0,4) data2xtensor2 zero1 rc | ...``: every dimension of every stage."""
    def one(s: Any) -> str:
        how = {"data+tensor": f"data{s.data_degree}xtensor{s.tensor_degree}"}.get(s.kind, f"{s.kind}{s.degree}")
        return f"[{s.start},{s.stop}) {how}" + (f" zero{s.zero}" if s.zero else "") + (" rc" if s.recompute != "none" else "")
    return " | ".join(one(s) for s in plan.stages)



def predictor_for(s: Setting, plan: Plan, recompute_db: Path | None = None) -> MemoryPredictor:
    """The predictor of ``plan`` (with ``recompute_db``, default the extended space's, if a stage recomputes)."""
    uses_recompute = any(st.recompute != "none" for st in plan.stages)
    return MemoryPredictor.from_db(s.db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                   num_microbatches=plan.num_microbatches,
                                   recompute_db=(recompute_db or s.recompute_db) if uses_recompute else None)


SIMULATED = HERE / "work" / "simulated.json"
"""Every simulated run, kept as it finishes (git-ignored): a search that simulates several plans (the uniform
baseline's extrapolated degrees, minutes each at paper size) resumes after a crash without running them again."""


def simulate(s: Setting, plan: Plan, cluster: Cluster, recompute_db: Path | None = None) -> dict[str, Any]:
    """The plan run on simulated devices of ``cluster``: per device, predicted (where the profile predicts it)
    and measured peaks. Kept in :data:`SIMULATED` under the profile, plan, cluster and recompute profile."""
    if not any(st.recompute != "none" for st in plan.stages):
        recompute_db = None  # not read (predictor_for)
    key = json.dumps({"db": str(s.db), "model": s.case.model, "plan": plan.to_dict(), "cluster": cluster.to_dict(),
                      "recompute_db": None if recompute_db is None else str(recompute_db)}, sort_keys=True)
    if key not in (store := ResultStore(SIMULATED)):
        result = _simulate(s, plan, cluster, recompute_db)
        (store := ResultStore(SIMULATED)).put(key, result)  # read again: another run may have added its own since
    return dict(store[key])


def _simulate(s: Setting, plan: Plan, cluster: Cluster, recompute_db: Path | None) -> dict[str, Any]:
    started = time.perf_counter()
    # the model named by our own setting (a width probe's is code of widths.py, which a profile alone never imports)
    m = measure_plan(s.db, plan, cluster=cluster, backend="sim", model=s.case.model)
    predicted: dict[int, int] = {}
    with contextlib.suppress(HybridPlanError):  # measure_plan predicts without the recompute profile
        predicted = {d.device: d.peak_memory_bytes for d in predictor_for(s, plan, recompute_db).predict(plan).devices}
    devices = [{**d, "predicted": predicted.get(d["device"], d["predicted"])} for d in devices_json(m.devices)]
    pred = [d["predicted"] for d in devices if d["predicted"] is not None]
    return {"status": m.status, "reason": m.reason, "devices": devices, "measured_peak_bytes": m.peak("measured"),
            "predicted_peak_bytes": max(pred) if len(pred) == len(devices) else None,
            "seconds": time.perf_counter() - started}



def needed(prediction: Any) -> int:
    """The device memory a prediction says the plan needs: CUDA's total (tensors and what the allocator leaves
    out), what ``plan`` checks against ``--device-memory``."""
    return max(d.total_bytes if d.total_bytes is not None else d.peak_memory_bytes for d in prediction.devices)


def _optimizer_bytes(predictor: MemoryPredictor, plan: Plan) -> int:
    """The most AdamW state any stage of ``plan`` holds unsharded: more than ZeRO-1 can remove from a device."""
    layout = predictor.zero_layout
    if layout is None:
        return 0
    return max(layout.optimizer_bytes(st.start, st.stop, 0, 1, 0) for st in plan.stages)


def extrapolated(predictor: MemoryPredictor, plan: Plan) -> bool:
    """Whether a stage of ``plan`` has a data or tensor degree above the profiled ones (predicted by the degree fit,
    not from a measurement of that degree)."""
    top = {kind: max(predictor.profiled_degrees(kind), default=1) for kind in ("data", "tensor")}
    return any(st.data_degree > top["data"] or st.tensor_degree > top["tensor"] for st in plan.stages)


def fitted(predictor: MemoryPredictor, plan: Plan) -> bool:
    """Whether a stage of ``plan`` has a tensor degree above the profiled ones: predicted by seed 000's degree fit.
    (A data stage above the profiled data degrees is composed from the widest profiled one, docs/prediction.md
    section 5: the uniform plans' data x8 and x16 stages measured within 1.33% of it in this benchmark's
    lowest-peak column, where :func:`extrapolated` has them run.)"""
    top = max(predictor.profiled_degrees("tensor"), default=1)
    return any(st.tensor_degree > top for st in plan.stages)


def peak_of(row: dict[str, Any]) -> int | None:
    """A row's peak: measured where it was run on simulated devices, else predicted."""
    sim = row.get("simulated")
    if sim:
        return sim["measured_peak_bytes"] if sim["status"] == "ok" else None
    return row.get("predicted_peak_bytes")


