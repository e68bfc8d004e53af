"""The largest trainable model at a fixed device memory: ours against the time-balanced partitioner (seed 004, 4.3).

mCAP grew AmoebaNet-D's filter count by binary search on 4 GPUs of 24 GB, pipeline-only with torchgpipe:
its partitioning trained a model 1.55x larger (3.61B against 2.32B parameters) than torchgpipe's
``balance_by_time``. Here: Wide-ResNet (ResNet-50 layout, width factor 2, 224x224 images; benchmarks/
largest_model/scalable.py) with ``channels`` as the width, on 4 simulated devices of 24 GiB (GPU allocator
terms), pipeline-only, GPipe, fp32 with AdamW, batch 32 in 8 micro-batches. For each partitioner a binary
search over ``channels`` (multiples of 32) finds the widest model whose plan runs within 24 GiB on every
device (each probe is a simulated run of that plan):

- ours: profile the model (pipeline scenario, simulated devices), ``plan --pipeline-only`` on the profile;
- time-balanced: torchgpipe ``balance_by_time`` of per-layer forward FLOPs (the stand-in for measured times:
  hybridplan/profiling/layer_costs.py [Note: FLOPs for time]).

Run from the repository root (resumable; about 25 minutes on 2 cores)::

    .venv/bin/python -m benchmarks.largest_model.run
    .venv/bin/hybridplan report benchmarks/largest_model/scaling.json --png benchmarks/largest_model/scaling.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.layer_costs import baseline_layer_costs, measure_layer_costs
from hybridplan.profiling.partitions import Scenario
from hybridplan.report.data import view_from_dict
from hybridplan.report.tables import render_table
from hybridplan.search import PlanSpace, solve_exact
from hybridplan.search.baselines import baseline_plan
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.runs import ResultStore, ensure_profile, measure_plan

from benchmarks.largest_model import scalable
from benchmarks.largest_model.search import widest
from benchmarks.paper_profiles import WORK

HERE = Path(__file__).resolve().parent

MESH, CAPACITY, BATCH, MICRO, SCHEDULE, PRECISION = "1x4", "24GiB", 32, 8, "gpipe", "fp32"
STEP = 32
"""Channel granularity: GroupNorm's 32 groups must divide every channel count."""
OPTIONS = {"backend": "sim", "device_type": "cuda", "precision": PRECISION, "loss_scale": None, "activation_checkpointing": False}


def model_name(channels: int) -> str:
    """The user-model name of width ``channels`` (``module:function``, importable from the repository root)."""
    return f"{scalable.__name__}:wresnet_c{channels}"


def plan_for(partitioner: str, channels: int) -> tuple[Plan, Path | None]:
    """The partitioner's plan for the model of width ``channels``, and the profile it came from (ours only:
    the time-balanced plan needs no memory profile)."""
    name = model_name(channels)
    cluster = Cluster.parse(MESH)
    if partitioner == "ours":
        db = WORK / "largest" / f"wresnet_c{channels}.sqlite"
        say = lambda msg: print(f"    [{name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
        ensure_profile(db, model=name, cluster=cluster, global_batch_size=BATCH, num_microbatches=MICRO, schedule=SCHEDULE,
                       run_options=OPTIONS, scenarios=(Scenario("none", 1),), progress=say)
        predictor = MemoryPredictor.from_db(db, schedule=SCHEDULE)
        space = PlanSpace.for_cluster(cluster, predictor.num_layers, pipeline_only=True)
        return solve_exact(predictor, space).to_plan(schedule=SCHEDULE, global_batch_size=BATCH, num_microbatches=MICRO), db
    model = get_model(name)
    costs = baseline_layer_costs(measure_layer_costs(model, precision=PRECISION), "torchgpipe-time", microbatch_size=BATCH // MICRO)
    return baseline_plan("torchgpipe-time", num_layers=model.num_layers, cluster=cluster, schedule=SCHEDULE,
                         global_batch_size=BATCH, num_microbatches=MICRO, layer_costs=costs), None


def probe(store: ResultStore, partitioner: str, channels: int) -> bool:
    """Whether the partitioner's plan for width ``channels`` runs within the capacity (measured, simulated)."""
    key = f"{partitioner}/{channels}"
    if key not in store:
        started = time.perf_counter()
        plan, db = plan_for(partitioner, channels)
        m = measure_plan(db, plan, cluster=Cluster.parse(MESH), backend="sim", model=model_name(channels), run_options=OPTIONS)
        peak = m.peak("measured") if m.status == "ok" else None
        store.put(key, {"channels": channels, "parameters": get_model(model_name(channels)).parameter_count(),
                        "plan": plan.to_dict(), "status": m.status, "peak_memory_bytes": peak,
                        "predicted_peak_bytes": m.peak("predicted"),
                        "fits": peak is not None and peak <= parse_bytes(CAPACITY)})
        print(f"  {key}: peak {format_bytes(peak)} predicted {format_bytes(m.peak('predicted'))}"
              f" ({time.perf_counter() - started:.0f} s)", flush=True)
    return bool(store[key]["fits"])


def largest(store: ResultStore, partitioner: str, low: int, high: int) -> int:
    """The widest ``channels`` (multiple of STEP) in ``[low, high]`` that fits, ``low`` known to fit."""
    return widest(lambda channels: probe(store, partitioner, channels), low, high, STEP)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--low", type=int, default=64, help="smallest channels probed (must fit)")
    ap.add_argument("--high", type=int, default=1024, help="largest channels probed")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    args = ap.parse_args()
    store = ResultStore(args.results)
    for partitioner in ("ours", "torchgpipe-time"):
        found = largest(store, partitioner, args.low, args.high)
        print(f"{partitioner}: widest model that fits {CAPACITY}: channels {found}", flush=True)
    series: list[dict[str, Any]] = []
    for partitioner in ("ours", "torchgpipe-time"):
        points = [{"width": r["channels"], "parameters": r["parameters"], "peak_memory_bytes": r["peak_memory_bytes"],
                   "fits": r["fits"]} for k, r in store.records.items() if k.startswith(partitioner + "/")]
        series.append({"name": partitioner, "points": sorted(points, key=lambda p: p["width"])})
    doc = {"format": "hybridplan.scaling", "width_name": "channels", "capacity_bytes": parse_bytes(CAPACITY),
           "title": f"Wide-ResNet (ResNet-50 layout) on {MESH} simulated devices, pipeline-only {SCHEDULE}, {PRECISION}",
           "series": series}
    (HERE / "scaling.json").write_text(json.dumps(doc, indent=0) + "\n")
    print(render_table(view_from_dict(doc, "scaling")))


if __name__ == "__main__":
    main()
