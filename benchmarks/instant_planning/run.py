"""Instant planning: ``hybridplan plan`` without ``--db``, cold (empty cache) and warm, and the chosen plan's
composed per-device peaks against simulated devices of the same plan (benchmarks/instant_planning/README.md).

    .venv/bin/python -m benchmarks.instant_planning.run --case llama2-7b-2x8 [--devices 0,15] [--out FILE]

Each timing runs the command line in a fresh process (``python -m hybridplan plan ...``), so imports count. The
check simulates the chosen devices of the written plan (runtime/sim.py ``simulate_stage``: the runtime's own work on
fake tensors) and compares the tensor peak with the predicted one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "llama2-7b-2x8": ("hf:llama2-7b", "2x8", 64, 8),
    "llama-tiny-1x4": ("hf:llama-tiny", "1x4", 8, 2),
}


def _plan(model: str, cluster: str, batch: int, micro: int, cache: Path, out: Path) -> float:
    cmd = [sys.executable, "-m", "hybridplan", "plan", "--model", model, "--cluster", cluster, "--device", "cuda",
           "--device-memory", "80GiB", "--precision", "bf16", "--global-batch-size", str(batch),
           "--num-microbatches", str(micro), "--cache-dir", str(cache), "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=tuple(CASES), default="llama2-7b-2x8")
    parser.add_argument("--devices", default="0", help="devices of the chosen plan to simulate and compare")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    model, cluster, batch, micro = CASES[args.case]
    from hybridplan.plan import Cluster, Plan
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate_stage

    with tempfile.TemporaryDirectory() as tmp:
        cache, best = Path(tmp) / "cache", Path(tmp) / "best.json"
        cold = _plan(model, cluster, batch, micro, cache, best)
        warm = _plan(model, cluster, batch, micro, cache, best)
        plan = Plan.load(best)
        profiles = sorted((cache / "profiles").glob("*.sqlite"))
        import sqlite3

        def recomputed(p: Path) -> bool:
            identity = json.loads(sqlite3.connect(p).execute("SELECT value FROM meta WHERE key='identity'").fetchone()[0])
            return bool(identity["run_options"].get("activation_checkpointing"))

        db = next(p for p in profiles if not recomputed(p))
        rdb = next(p for p in profiles if recomputed(p))
        predicted = {d.device: d for d in MemoryPredictor.from_db(db, recompute_db=rdb).predict(plan).devices}
        n, k = map(int, cluster.split("x"))
        cfg = RunConfig(model=model, plan=plan, cluster=Cluster.uniform(n, k, device_type="cuda"), backend="sim",
                        device_type="cuda", precision="bf16", iterations=2)
        rows = []
        for device in (int(d) for d in args.devices.split(",")):
            t0 = time.perf_counter()
            report = simulate_stage(cfg, plan.stage_of_device(device), iterations=2, rank=device)
            simulated = max(report.iteration_peaks[1:])
            p = predicted[device].peak_memory_bytes
            rows.append({"device": device, "predicted": p, "simulated": simulated,
                         "error_pct": round(100 * (p - simulated) / simulated, 3),
                         "sim_seconds": round(time.perf_counter() - t0, 1)})
    result = {"case": args.case, "cold_s": round(cold, 1), "warm_s": round(warm, 1), "plan": plan.describe(), "devices": rows}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
