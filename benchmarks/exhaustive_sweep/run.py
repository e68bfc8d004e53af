"""Every plan of a small model on 4 devices, run for real: where does our pick rank? (seed 004, 4.2)

mCAP ran all 3654 pipeline-only partitionings of VGG11 on 4 GPUs: its pick had the 3rd-lowest measured peak,
1.05x the lowest (torchgpipe's balance: 1.10x). Here: Wide-ResNet tiny (7 layers) on one node of 4 devices,
every plan of the CAPTURE space (136: pipeline-only and hybrid stages), each run on the real CPU runtime (4
processes, exact storage counts), GPipe as torchgpipe. Our pick is ``hybridplan plan`` on the model's
profile (and ``--pipeline-only``, mCAP's space); the baselines' picks (pipeline-only) are marked too:
torchgpipe-time with layer times measured on this CPU by ``hybridplan profile --time`` (the device the plans run
on) and with per-layer FLOPs, torchgpipe-size, DeepSpeed's parameters, equal layers. Plans the runtime cannot run (a tensor degree
the model's layers cannot be split to) are listed and left out.

Run from the repository root (resumable; about 5 s per plan on 2 cores)::

    .venv/bin/python -m benchmarks.exhaustive_sweep.run
    .venv/bin/hybridplan report benchmarks/exhaustive_sweep/sweep.json --png benchmarks/exhaustive_sweep/sweep.png
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
from hybridplan.profiling.layer_costs import baseline_layer_costs, measure_layer_costs
from hybridplan.report.data import view_from_dict
from hybridplan.report.pareto import plan_label
from hybridplan.report.tables import render_table
from hybridplan.search import PlanSpace, enumerate_plans, solve_exact
from hybridplan.search.baselines import baseline_plan
from hybridplan.workflows.runs import ResultStore, measure_plan, plan_from_choices

from benchmarks.paper_profiles import CASES, measured_layer_times, profile

HERE = Path(__file__).resolve().parent

BASELINES = ("torchgpipe-time", "torchgpipe-size", "deepspeed-parameters", "equal")


def stages_key(plan: Plan) -> str:
    """A plan's identity in the results: its stages (a baseline's plan also carries its name)."""
    return json.dumps(plan.to_dict()["stages"], sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="wresnet-tiny")
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--results", default=None, help="default: results-<schedule>.json here")
    args = ap.parse_args()
    case = CASES[args.model]
    db = profile(case)
    model = get_model(case.model)
    predictor = MemoryPredictor.from_db(db, schedule=args.schedule)
    cluster = case.cluster(memory=None)
    space = PlanSpace.for_cluster(cluster, model.num_layers)
    batch = dict(schedule=args.schedule, global_batch_size=predictor.global_batch_size, num_microbatches=predictor.num_microbatches)
    plans, unrunnable = [], []
    for choices in enumerate_plans(space):
        plan = plan_from_choices(space, choices, **batch)
        try:
            plan.validate(model=model, cluster=cluster)
            plans.append(plan)
        except HybridPlanError as e:
            unrunnable.append((plan_label(plan), e.message))
    print(f"{len(plans)} runnable plans of {len(plans) + len(unrunnable)}; left out: "
          f"{len(unrunnable)} ({unrunnable[0][1] if unrunnable else '-'})", flush=True)
    picks = {"ours": solve_exact(predictor, space).to_plan(**batch),
             "ours pipeline-only": solve_exact(predictor, PlanSpace.for_cluster(cluster, model.num_layers,
                                                                                pipeline_only=True)).to_plan(**batch)}
    costs = measure_layer_costs(model, precision=case.precision)
    times = measured_layer_times(case)
    if times is not None:
        picks["torchgpipe-time (measured)"] = baseline_plan("torchgpipe-time", num_layers=model.num_layers, cluster=cluster, **batch,
                                                 layer_costs=times)
    for name in BASELINES:
        label = "torchgpipe-time (FLOPs)" if name == "torchgpipe-time" else name
        picks[label] = baseline_plan(name, num_layers=model.num_layers, cluster=cluster, **batch,
                                     layer_costs=baseline_layer_costs(costs, name, microbatch_size=predictor.microbatch_size))
    store = ResultStore(args.results or HERE / f"results-{args.schedule}.json")
    for i, plan in enumerate(plans):
        key = stages_key(plan)
        if key in store:
            continue
        started = time.perf_counter()
        m = measure_plan(db, plan, cluster=cluster, backend=case.backend)
        store.put(key, {"label": plan_label(plan), "status": m.status, "predicted_peak_bytes": m.peak("predicted"),
                        "measured_peak_bytes": m.peak("measured") if m.status == "ok" else None})
        print(f"[{i + 1}/{len(plans)}] {plan_label(plan)}: {m.status} measured {m.peak('measured')} predicted"
              f" {m.peak('predicted')} ({time.perf_counter() - started:.1f} s)", flush=True)
    keys = [stages_key(p) for p in plans]
    doc = {"format": "hybridplan.plan_sweep",
           "title": f"{args.model} on {case.mesh}, {args.schedule}: all {len(plans)} runnable plans, real CPU runtime",
           "plans": [{**store[k], "plan": p.to_dict()} for k, p in zip(keys, plans)],
           "picks": {name: keys.index(stages_key(p)) for name, p in picks.items()}}
    (HERE / f"sweep-{args.schedule}.json").write_text(json.dumps(doc) + "\n")
    print(render_table(view_from_dict(doc, "sweep")))


if __name__ == "__main__":
    main()
