"""Prediction accuracy of the memory predictor over random valid hybrid plans, on the real CPU runtime.

For each model: profile it (resumable database under --work), then for each schedule draw random
plans of the CAPTURE plan space on the mesh that use data or tensor parallelism somewhere, run each
for real, predict it from the profile, and record every device's relative error. Results are written
after every plan (rerunning the command resumes). Both predictors are scored: ours ("quantities") and
seed 000's peak statistics ("capture").

    .venv/bin/python -m benchmarks.capture_accuracy.run            # ~1 h on a 2-core machine
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.search import PlanSpace, StageChoice
from hybridplan.workflows.runs import ensure_profile, plan_from_choices
from hybridplan.workflows.sampling import sample_plans

HERE = Path(__file__).resolve().parent
CASES = {  # model: (global batch, micro-batches): micro-batches of 16, profiled at 8 and 4 (B/2, B/4)
    "gpt-tiny": (64, 4),
    "wresnet-tiny": (64, 4),
    "moe-tiny": (64, 4),
}


def profile(model: str, cluster: Cluster, work: Path) -> Path:
    """The model's profile database under ``work``, profiled now if missing or incomplete (defaults: 1F1B)."""
    batch, micro = CASES[model]
    db = ensure_profile(work / f"{model}-{cluster.shape}.sqlite", model=model, cluster=cluster, global_batch_size=batch,
                        num_microbatches=micro, progress=lambda m: print("   ", m, file=sys.stderr, flush=True))
    print(f"{model}: profiled ({db})", flush=True)
    return db


def random_plans(predictor: MemoryPredictor, space: PlanSpace, count: int, seed: int) -> list[tuple[StageChoice, ...]]:
    """``count`` plans drawn from those whose every stage the profile predicts and which use data or tensor
    parallelism somewhere (the whole list shuffled: the plans ``results.json`` records)."""
    cfg = space.configs
    return sample_plans(space, count, seed=seed, exhaustive=True,
                        keep=lambda c, after: predictor.allowed(c.start, c.stop, cfg[c.config].kind, cfg[c.config].degree),
                        keep_plan=lambda plan: any(cfg[c.config].degree > 1 for c in plan))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--cluster", default="1x4")
    ap.add_argument("--plans", type=int, default=17, help="plans per model and schedule")
    ap.add_argument("--work", default=str(HERE / "work"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.parse(args.cluster)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else []
    done = {(r["model"], json.dumps(r["plan"], sort_keys=True)) for r in results}
    for model in args.models.split(","):
        db = profile(model, cluster, work)
        for schedule in ("gpipe", "1f1b"):
            batch, micro = CASES[model]
            base = MemoryPredictor.from_db(db, schedule=schedule)
            space = PlanSpace.for_cluster(cluster, base.num_layers)
            for choices in random_plans(base, space, args.plans, seed=sum(map(ord, model + schedule))):
                plan = plan_from_choices(space, choices, schedule=schedule, global_batch_size=batch, num_microbatches=micro)
                key = (model, json.dumps(plan.to_dict(), sort_keys=True))
                if key in done:
                    continue
                started = time.perf_counter()
                run = launch(RunConfig(model=model, plan=plan, cluster=cluster, iterations=2))
                if not run.ok:
                    print(f"{model} {schedule}: run failed: {run.reason}", flush=True)
                    continue
                row = {"model": model, "schedule": schedule, "plan": plan.to_dict(), "measured": {}, "predicted": {}}
                row["measured"] = {str(d.device): d.peak_memory_bytes for d in run.devices}
                for method in ("quantities", "capture"):
                    pred = MemoryPredictor.from_db(db, schedule=schedule, method=method).predict(plan)
                    row["predicted"][method] = {str(d.device): d.peak_memory_bytes for d in pred.devices}
                results.append(row)
                done.add(key)
                out.write_text(json.dumps(results, indent=0))
                errs = [(row["predicted"]["quantities"][d] - m) / m for d, m in row["measured"].items()]
                print(f"{model} {schedule} [{len(results)}] {plan_text(plan)}: max error {100 * max(map(abs, errs)):.2f}% "
                      f"({time.perf_counter() - started:.1f} s)", flush=True)
    summarize(results)


def plan_text(plan: Plan) -> str:
    return " | ".join(f"[{s.start},{s.stop}) {s.parallelism}{s.degree}" for s in plan.stages)


def summarize(results: list) -> None:
    print(f"\n{'model':<14} {'schedule':<7} {'method':<11} {'plans':>5} {'devices':>7} {'<=2%':>7} {'<=5%':>7} {'<=11%':>7} {'max':>7} {'plan<=2%':>8}")
    groups: dict = {}
    for r in results:
        for method in ("quantities", "capture"):
            for key in ((r["model"], r["schedule"], method), ("all", "both", method)):
                g = groups.setdefault(key, {"dev": [], "plan": []})
                errs = [r["predicted"][method][d] for d in r["measured"]]  # device keys are str after a JSON round trip
                meas = list(r["measured"].values())
                g["dev"] += [abs(p - m) / m for p, m in zip(errs, meas)]
                g["plan"].append(abs(max(errs) - max(meas)) / max(meas))
    for (model, schedule, method), g in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        d, p = g["dev"], g["plan"]
        share = lambda xs, t: 100 * sum(x <= t for x in xs) / len(xs)  # noqa: E731
        print(f"{model:<14} {schedule:<7} {method:<11} {len(p):>5} {len(d):>7} {share(d, .02):>6.1f}% {share(d, .05):>6.1f}% "
              f"{share(d, .11):>6.1f}% {100 * max(d):>6.2f}% {share(p, .02):>7.1f}%")


if __name__ == "__main__":
    main()
