"""Instant planning: ``hybridplan plan`` without ``--db``, cold (empty cache) and warm, and the composed per-device
peaks of the chosen plan and of random plans against simulated devices of the same plans
(benchmarks/instant_planning/README.md).

    .venv/bin/python -m benchmarks.instant_planning.run --case llama2-7b-2x8 [--random 20] [--out FILE]
    .venv/bin/python -m benchmarks.instant_planning.run --microbatches llama2-7b-2x8 [--out FILE]

Each timing runs the command line in a fresh process (``python -m hybridplan plan ...``), so imports count. The
accuracy check simulates every device of the written plan (workflows/estimate_memory.py ``estimate_plans``: each
distinct stage once, a ZeRO stage's distinct shares once) and compares the tensor peak with the composed one; then
``--random N`` plans drawn uniformly from the same extended space (workflows/sampling.py). Every finished row is
written to ``--out`` at once, and a rerun with the same ``--out`` skips the rows it holds.

``--microbatches`` times the simulation of one pipeline plan with 8 micro-batches of one sample and with 512
(runtime/repeats.py [Note: skipping repeated blocks]), and the composed prediction of both.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = {  # model, cluster, global batch, micro-batches
    "llama2-7b-2x8": ("hf:llama2-7b", "2x8", 64, 8),
    "llama3-8b-4x8": ("hf:llama3-8b", "4x8", 128, 16),
    "mixtral-8x7b-8x8": ("hf:mixtral-8x7b", "8x8", 256, 32),
    "llama3-70b-32x8": ("hf:llama3-70b", "32x8", 1024, 64),
    "llama-tiny-1x4": ("hf:llama-tiny", "1x4", 8, 2),
    "mixtral-tiny-2x4": ("hf:mixtral-tiny", "2x4", 32, 4),
    "mixtral-8x7b-6l-1x8": ("mixtral-8x7b/6", "1x8", 256, 32),
}
"""``NAME/N`` (a shipped configuration with only its first ``N`` decoder layers): the layers at full size, the
model short enough that each random plan simulates in seconds (:func:`_model`)."""
GPU = "h100-sxm"


def _model(name: str) -> str:
    """The ``--model`` of case ``name``: ``hf:NAME``, or for ``NAME/N`` a config.json of NAME with N decoder layers,
    written to one fixed folder (its path names the model in the profile cache, so a rerun finds it)."""
    model = CASES[name][0]
    if model.startswith("hf:"):
        return model
    from hybridplan.models.hf_config import HF_CONFIGS

    base, layers = model.split("/")
    folder = Path(tempfile.gettempdir()) / "hybridplan-benchmark-configs" / f"{base}-{layers}-layers"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**HF_CONFIGS[base], "num_hidden_layers": int(layers)}))
    return f"hf:{folder}"


def _plan_command(model: str, cluster: str, batch: int, micro: int, cache: Path, out: Path) -> float:
    cmd = [sys.executable, "-m", "hybridplan", "plan", "--model", model, "--cluster", cluster, "--gpu", GPU,
           "--precision", "bf16", "--global-batch-size", str(batch), "--num-microbatches", str(micro),
           "--cache-dir", str(cache), "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def _compare(model: str, cluster: Any, plan: Any, predictor: Any) -> dict[str, Any]:
    """Every device of ``plan``: composed peak against the simulated one."""
    from hybridplan.workflows.estimate_memory import estimate_plans

    t0 = time.perf_counter()
    [estimate] = estimate_plans(model, cluster, [plan], run_options={"device_type": "cuda", "precision": "bf16"})
    predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
    devices = [{"device": d.device, "predicted": predicted[d.device], "simulated": d.peak_memory_bytes,
                "error_pct": round(100 * (predicted[d.device] - d.peak_memory_bytes) / d.peak_memory_bytes, 3)}
               for d in estimate.devices]
    return {"plan": plan.to_dict(), "describe": plan.describe(), "devices": devices,
            "worst_error_pct": max((abs(d["error_pct"]) for d in devices), default=0.0),
            "sim_seconds": round(time.perf_counter() - t0, 1)}


def _predicted_again(row: dict[str, Any], plan: Any, predictor: Any) -> dict[str, Any]:
    """``row`` (a :func:`_compare` result) with its devices predicted by ``predictor``, their simulated peaks kept."""
    predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
    devices = [{**d, "predicted": predicted[d["device"]],
                "error_pct": round(100 * (predicted[d["device"]] - d["simulated"]) / d["simulated"], 3)}
               for d in row["devices"]]
    return {**row, "devices": devices, "worst_error_pct": max((abs(d["error_pct"]) for d in devices), default=0.0)}


def _save(out: Path | None, result: dict[str, Any]) -> None:
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(out)


def run_case(name: str, random_plans: int, out: Path | None, cache_root: Path | None) -> dict[str, Any]:
    from hybridplan.plan import Cluster, Plan
    from hybridplan.search.memory.space import PlanSpace
    from hybridplan.workflows.runs import plan_from_choices
    from hybridplan.workflows.sampling import StageFilter, sample_plans

    _, shape, batch, micro = CASES[name]
    model = _model(name)
    result: dict[str, Any] = json.loads(out.read_text()) if out is not None and out.exists() else {}
    result.update(case=name, model=model, cluster=shape, gpu=GPU, global_batch_size=batch, num_microbatches=micro)
    with tempfile.TemporaryDirectory() as tmp:
        cache = cache_root or Path(tmp) / "cache"
        best = Path(tmp) / "best.json"
        if not any((cache / "profiles").glob("*.sqlite")):  # cold only from an empty cache
            result["cold_s"] = round(_plan_command(model, shape, batch, micro, cache, best), 1)
            print(f"{name}: cold {result['cold_s']} s", flush=True)
        result["warm_s"] = round(_plan_command(model, shape, batch, micro, cache, best), 1)
        print(f"{name}: warm {result['warm_s']} s", flush=True)
        _save(out, result)
        cluster = Cluster.parse(shape, device_type="cuda", gpu=GPU)
        predictor = _simulated_predictor(name, cluster, cache)  # this question's profiles (a kept cache may hold others)
        plan = Plan.load(best)
        if result.get("chosen", {}).get("plan") != plan.to_dict():
            result["chosen"] = _compare(model, cluster, plan, predictor)
            print(f"{name}: chosen {plan.describe()}: worst {result['chosen']['worst_error_pct']}%", flush=True)
        else:  # the same plan: its simulated peaks stand, predicted again by this checkout
            result["chosen"] = _predicted_again(result["chosen"], plan, predictor)
        _save(out, result)
        rows = result.setdefault("random", {})
        if random_plans:  # the space (and its sampler's counts) only when plans are asked for
            space = PlanSpace.for_cluster(cluster, predictor.num_layers, composite=True, zero=True, recompute=True,
                                          cross_node=True)

            def admits(choice: Any) -> bool:
                cfg = space.configs[choice.config]
                return bool(predictor.allowed(choice.start, choice.stop, cfg.kind, cfg.degree, **cfg.model_kwargs))

            for i, choices in enumerate(sample_plans(space, random_plans, seed=0, keep=StageFilter(admits))):
                if str(i) in rows:
                    continue
                drawn = plan_from_choices(space, choices, schedule="1f1b", global_batch_size=batch,
                                          num_microbatches=micro)
                rows[str(i)] = _compare(model, cluster, drawn, predictor)
                print(f"{name}: random {i}: {drawn.describe().splitlines()[1:]} worst"
                      f" {rows[str(i)]['worst_error_pct']}% ({rows[str(i)]['sim_seconds']} s)", flush=True)
                _save(out, result)
    errors = [abs(d["error_pct"]) for r in [result["chosen"], *rows.values()] for d in r["devices"]]
    result["summary"] = {"plans": 1 + len(rows), "devices": len(errors), "worst_pct": max(errors),
                         "within_0.5_pct": sum(e <= 0.5 for e in errors)}
    _save(out, result)
    return result


def run_microbatches(name: str, out: Path | None) -> dict[str, Any]:
    """One 4-stage pipeline plan (tensor x4 stages) with 8 and with 512 micro-batches of one sample: simulated and
    composed times."""
    from hybridplan.plan import Cluster, Plan
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate

    _, shape, _, _ = CASES[name]
    model = _model(name)
    cluster = Cluster.parse(shape, device_type="cuda", gpu=GPU)
    from hybridplan.models.zoo import resolve_model

    L = resolve_model(model).num_layers
    cuts = [0, *(round(L * i / 4) for i in range(1, 4)), L]
    rows = []
    for m in (8, 512):
        plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": m, "num_microbatches": m, "stages": [
            {"layers": [cuts[s], cuts[s + 1]], "parallelism": "tensor", "degree": 4,
             "devices": list(range(4 * s, 4 * s + 4))} for s in range(4)]})
        t0 = time.perf_counter()
        result = simulate(RunConfig(model=model, plan=plan, cluster=cluster, backend="sim", device_type="cuda",
                                    precision="bf16", iterations=2))
        rows.append({"microbatches": m, "sim_seconds": round(time.perf_counter() - t0, 1), "status": result.status,
                     "peaks": [d.peak_memory_bytes for d in result.devices[::4]]})
        print(rows[-1], flush=True)
    outcome = {"case": name, "plan": "4 stages of tensor x4, micro-batches of one sample", "rows": rows,
               "ratio": round(rows[1]["sim_seconds"] / rows[0]["sim_seconds"], 2)}
    _save(out, outcome)
    return outcome


def _simulated_predictor(name: str, cluster: Any, cache_root: Path | None) -> Any:
    """The predictor of ``name``'s simulated profiles (built, or read from ``cache_root``'s cache)."""
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.workflows.simulated_profile import simulated_profiles

    _, _, batch, micro = CASES[name]
    model = _model(name)
    with tempfile.TemporaryDirectory() as scratch:
        with simulated_profiles(model, cluster, global_batch_size=batch, num_microbatches=micro, precision="bf16",
                                device_type="cuda", cache_dir=cache_root or Path(scratch)) as profiles:
            return MemoryPredictor.from_db(profiles.db, recompute_db=profiles.recompute_db)


def compare_stored(name: str, stored: Path, cache_root: Path | None) -> dict[str, Any]:
    """The stored plans of ``stored`` (a ``--case`` result) predicted again by this checkout, each device against
    the simulated peak stored with it (the simulation does not change with the predictor), by stage kind."""
    from hybridplan.plan import Cluster, Plan

    _, shape, _, _ = CASES[name]
    result = json.loads(stored.read_text())
    cluster = Cluster.parse(shape, device_type="cuda", gpu=GPU)
    predictor = _simulated_predictor(name, cluster, cache_root)
    groups: dict[str, list[float]] = {}
    for row in [result["chosen"], *result.get("random", {}).values()]:
        plan = Plan.from_dict(row["plan"])
        predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
        for device in row["devices"]:
            stage = next(s for s in plan.stages if device["device"] in s.devices)
            kind = stage.kind + (f" ZeRO-{stage.zero}" if stage.zero else "") + (
                " + recompute" if stage.recompute not in (None, "none") else "")
            groups.setdefault(kind, []).append(100 * (predicted[device["device"]] - device["simulated"]) / device["simulated"])
    every = [e for errors in groups.values() for e in errors]
    table = {kind: {"devices": len(e), "within_0.5%": sum(abs(x) <= 0.5 for x in e), "min_pct": round(min(e), 2),
                    "max_pct": round(max(e), 2)} for kind, e in sorted(groups.items())}
    return {"kinds": table, "devices": len(every), "within_0.5%": sum(abs(x) <= 0.5 for x in every),
            "below_-0.5%": sum(x < -0.5 for x in every), "min_pct": round(min(every), 2), "max_pct": round(max(every), 2)}


def fit_calls(name: str, stored: Path, cache_root: Path | None) -> dict[str, Any]:
    """Whether each stored plan of ``stored`` (a ``--case`` result) fits the GPU, as predicted (every device's
    predicted need, the reserved peak and what lies outside the allocator: what the search checks,
    search/time/feasibility.py) and as simulated (the same from the simulated devices, simulated without a capacity
    so that every device is measured); written into ``stored`` plan by plan (a rerun resumes), with a summary: an "it
    fits" that the simulation refutes is the error the issue's target forbids."""
    from hybridplan.plan import Cluster, Plan
    from hybridplan.workflows.estimate_memory import estimate_plans

    _, shape, _, _ = CASES[name]
    model = _model(name)
    result = json.loads(stored.read_text())
    cluster = Cluster.parse(shape, device_type="cuda", gpu=GPU)
    predictor = _simulated_predictor(name, cluster, cache_root)
    rows = {"chosen": result["chosen"], **result.get("random", {})}
    for key, row in rows.items():
        if "fits_simulated" in row:
            continue
        plan = Plan.from_dict(row["plan"])
        needed = {d.device: d.needed_bytes for d in predictor.predict(plan).devices}
        [estimate] = estimate_plans(model, cluster, [plan], run_options={"device_type": "cuda", "precision": "bf16"})
        simulated = {d.device: d.total_bytes for d in estimate.devices}
        capacity = {d: cluster.memory_of(d) for d in needed}
        row["fits_predicted"] = all(needed[d] <= (capacity[d] or math.inf) for d in needed)
        row["fits_simulated"] = estimate.fits(cluster)
        row["needed"] = [{"device": d, "predicted": needed[d], "simulated": simulated[d]} for d in sorted(needed)]
        print(f"{name}: {key}: fits predicted {row['fits_predicted']}, simulated {row['fits_simulated']}; largest need"
              f" {max(needed.values()) / 2**30:.2f} GiB predicted, {max(simulated.values()) / 2**30:.2f} GiB simulated",
              flush=True)
        _save(stored, result)
    calls = [(r["fits_predicted"], r["fits_simulated"]) for r in rows.values() if "fits_simulated" in r]
    errors = [100 * (d["predicted"] - d["simulated"]) / d["simulated"] for r in rows.values() for d in r.get("needed", [])]
    result.setdefault("summary", {})["fit_calls"] = {
        "plans": len(calls), "fit": sum(s for _, s in calls), "agree": sum(p == s for p, s in calls),
        "fits_refuted": sum(p and not s for p, s in calls), "does_not_fit_refuted": sum(s and not p for p, s in calls),
        "needed_error_pct": [round(min(errors), 2), round(max(errors), 2)] if errors else None}
    _save(stored, result)
    return dict(result["summary"]["fit_calls"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=tuple(CASES))
    parser.add_argument("--microbatches", choices=tuple(CASES), help="the 8 vs 512 micro-batch check instead")
    parser.add_argument("--random", type=int, default=0, help="random plans to compare as well")
    parser.add_argument("--cache", type=Path, help="a cache folder to keep (a rerun then times warm only)")
    parser.add_argument("--out", type=Path, help="the results JSON (written as rows finish; a rerun resumes)")
    parser.add_argument("--compare-stored", type=Path, metavar="RESULTS",
                        help="predict --case's stored plans again and compare with their stored simulated peaks")
    parser.add_argument("--fit-calls", type=Path, metavar="RESULTS",
                        help="simulate --case's stored plans again and record whether each fits, predicted and simulated")
    args = parser.parse_args()
    if args.fit_calls and args.case:
        print(json.dumps(fit_calls(args.case, args.fit_calls, args.cache), indent=1))
    elif args.compare_stored and args.case:
        print(json.dumps(compare_stored(args.case, args.compare_stored, args.cache), indent=1))
    elif args.microbatches:
        print(json.dumps(run_microbatches(args.microbatches, args.out), indent=1))
    elif args.case:
        print(json.dumps(run_case(args.case, args.random, args.out, args.cache)["summary"], indent=1))
    else:
        parser.error("give --case or --microbatches")


if __name__ == "__main__":
    main()
