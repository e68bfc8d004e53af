"""Predicted against simulated reserved peak of the CUDA caching allocator, over random plans (1x4, gpt-tiny,
wresnet-tiny and gpt3-125m, both schedules).

[Note: predicting the reserved peak] (predict/reserved.py) predicts each device's reserved peak from the excess a
CUDA profile measured above the tensor peak. This benchmark measures it against the allocator's replay:

- each model is profiled once on 1x4 simulated CUDA devices (``--backend sim --device cuda``; every run records
  its tensor and reserved peaks): gpt-tiny and wresnet-tiny with pipeline, data and tensor x2 and x4 at global
  batches 16 and 32 (target 64 in 4 micro-batches); gpt3-125m, where fragmentation is hundreds of MiB, with the
  pipeline scenario only at global batches 4 and 8 (target 16 in 4 micro-batches), to keep its simulations short;
- plans are drawn uniformly (hybridplan/workflows/sampling.py) from CAPTURE's 1x4 space (gpt3-125m: its
  pipeline-only plans) among those the profile predicts;
- every plan runs whole on simulated CUDA devices (``hybridplan validate --backend sim --device cuda``), whose
  allocator replay gives the reserved peak per device; the predictor gives its prediction, and, for comparison,
  the least the allocator can reserve for the predicted tensor peak (rounded up to 2 MiB, no excess).

Run from the repository root (resumable: rerun to continue)::

    .venv/bin/python -m benchmarks.reserved_prediction.run --plans 8
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from hybridplan.plan import Cluster
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.reserved import reserved_peak_from
from hybridplan.profiling.partitions import Scenario
from hybridplan.search import PlanSpace
from hybridplan.workflows.runs import ResultStore, ensure_profile, plan_from_choices
from hybridplan.workflows.sampling import sample_plans
from hybridplan.workflows.validate import validate_plan

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "1x4"
SETTINGS = {"gpt-tiny": (64, 4, None), "wresnet-tiny": (64, 4, None),
            "gpt3-125m": (16, 4, (Scenario("none", 1),))}
"""Per model: global batch, micro-batches and profiled scenarios (None: all that apply); profiled at B/2 and B/4."""
MODELS = tuple(SETTINGS)
SCHEDULES = ("gpipe", "1f1b")
OPTIONS = {"backend": "sim", "device_type": "cuda"}
MIB = 2**20


def profile(model: str) -> Path:
    say = lambda msg: print(f"  [{model}] {msg}", flush=True)  # noqa: E731
    batch, micro, scenarios = SETTINGS[model]
    return ensure_profile(WORK / f"{model}-{MESH}-cuda.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=batch, num_microbatches=micro, run_options=OPTIONS, progress=say,
                          **({} if scenarios is None else {"scenarios": scenarios}))


def measure(model: str, schedule: str, count: int, seed: int, store: ResultStore) -> list[dict]:
    db = profile(model)
    predictor = MemoryPredictor.from_db(db, schedule=schedule)
    cluster = Cluster.parse(MESH)
    batch, micro, scenarios = SETTINGS[model]
    space = PlanSpace.for_cluster(cluster, predictor.num_layers, pipeline_only=scenarios == (Scenario("none", 1),))

    def predictable(c: object, after: int) -> bool:
        cfg = space.configs[c.config]  # type: ignore[attr-defined]
        return predictor.allowed(c.start, c.stop, cfg.kind, cfg.degree, **cfg.model_kwargs)  # type: ignore[attr-defined]

    done = []
    for i, choices in enumerate(sample_plans(space, count, seed=seed, keep=predictable)):
        key = f"{model}/{schedule}/{i}"
        plan = plan_from_choices(space, choices, schedule=schedule, global_batch_size=batch, num_microbatches=micro)
        if key not in store or store[key]["plan"] != plan.to_dict():  # the simulation is kept, the prediction redone
            report = validate_plan(db, plan, cluster=cluster, model=model, run_options=OPTIONS)
            if not report.run.ok:
                raise SystemExit(f"{key}: {report.run.reason}")
            store.put(key, {"plan": plan.to_dict(), "simulated": {
                str(d.device): [d.peak_memory_bytes, d.reserved_peak_bytes] for d in report.run.devices}})
        simulated = store[key]["simulated"]
        devices = [{"device": p.device, "stage": p.stage, "tensor_predicted": p.peak_memory_bytes,
                    "tensor_simulated": simulated[str(p.device)][0], "reserved_simulated": simulated[str(p.device)][1],
                    "reserved_predicted": p.reserved_peak_bytes, "reserved_floor": reserved_peak_from(p.peak_memory_bytes, 0)}
                   for p in predictor.predict(plan).devices]
        worst = max(abs(d["reserved_predicted"] - d["reserved_simulated"]) for d in devices)
        print(f"{key}: {plan.num_stages} stages, largest reserved error {worst / MIB:.1f} MiB", flush=True)
        done.append({"plan": plan.to_dict(), "devices": devices})
    return done


def summarise(rows: list[dict], label: str) -> str:
    """One table row: device count, exact, within 1% / 2 MiB / 5%, mean and largest error, for both predictions."""
    def cells(key: str) -> list[str]:
        errors = [(d[key] - d["reserved_simulated"]) / d["reserved_simulated"] for d in rows]
        absolute = [abs(d[key] - d["reserved_simulated"]) for d in rows]
        return [f"{sum(a == 0 for a in absolute)}", f"{sum(a <= 2 * MIB for a in absolute)}",
                f"{sum(abs(e) <= 0.01 for e in errors)}", f"{sum(abs(e) <= 0.05 for e in errors)}",
                f"{100 * statistics.fmean(abs(e) for e in errors):.2f}%",
                f"{100 * min(errors):+.2f}% / {100 * max(errors):+.2f}%",
                f"{min(d[key] - d['reserved_simulated'] for d in rows) / MIB:+.0f} / "
                f"{max(d[key] - d['reserved_simulated'] for d in rows) / MIB:+.0f}"]
    return "| " + " | ".join([label, str(len(rows)), *cells("reserved_predicted"), *cells("reserved_floor")]) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", type=int, default=8, help="plans per model and schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    args = ap.parse_args()
    store = ResultStore(HERE / "results.json")
    header = ("| rows | devices | exact | within 2 MiB | within 1% | within 5% | mean abs. error | min / max error |"
              " min / max MiB | floor: exact | within 2 MiB | within 1% | within 5% | mean abs. error | min / max error |"
              " min / max MiB |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    every: list[dict] = []
    for model in args.models.split(","):
        for schedule in SCHEDULES:
            rows = [d for r in measure(model, schedule, args.plans, args.seed, store) for d in r["devices"]]
            every += rows
            lines.append(summarise(rows, f"{model} {schedule}"))
    lines.append(summarise(every, "all"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
