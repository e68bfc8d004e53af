"""How long simulating a device takes, and how much host memory it needs (runtime/sim.py).

Run from the repository root (about 3 minutes on a 2-core CPU)::

    .venv/bin/python -m benchmarks.sim_speed.run            # every case
    .venv/bin/python -m benchmarks.sim_speed.run --case gpt3-1.3b-stage0-fp32
    .venv/bin/python -m benchmarks.sim_speed.run --zero-shares   # a ZeRO stage: every device against one per share

Each case runs in a fresh Python process (so its peak RSS is its own): ``simulate_stage`` for one device,
or ``launch(backend="sim")`` for a whole plan. Printed as a markdown table: *setup s* is the time from
process start to the simulation call (imports), *sim s* the call itself (including the fake process
group, stage building and ``--iterations`` iterations), *peak RSS* the process's high-water mark
(``ru_maxrss``), *device peak* the simulated device's (largest device's) peak tensor memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
"""The repository root, from which the cases run as ``python -m benchmarks.sim_speed.run --case ...``."""

GPT13_PIPELINE = [(0, 7), (7, 13), (13, 19), (19, 26)]  # embedding + 6 blocks | 6 | 6 | 6 blocks + head

CASES: dict[str, dict[str, Any]] = {
    # The target: one device of a 1.3B stage in under 20 s. Layers [0, 7) of gpt3-1.3b (the
    # embedding and 6 of 24 blocks: 409M parameters), stage 0 of a 4-stage 1F1B pipeline, 8 micro-batches
    # of 4 sequences (1024 tokens): the configuration of ../shared/notes/pytorch-cpu-facts.md.
    "gpt3-1.3b-stage0-fp32": dict(model="gpt3-1.3b", kinds=("none", 1), batch=32, micro=8, precision="fp32", device="cpu"),
    "gpt3-1.3b-stage0-bf16-cuda": dict(model="gpt3-1.3b", kinds=("none", 1), batch=32, micro=8, precision="bf16", device="cuda"),
    "gpt3-1.3b-stage0-tensor4-bf16-cuda": dict(model="gpt3-1.3b", kinds=("tensor", 4), batch=32, micro=8, precision="bf16", device="cuda"),
    "gpt3-1.3b-stage0-checkpointing": dict(model="gpt3-1.3b", kinds=("none", 1), batch=32, micro=8, precision="fp32", device="cpu", ckpt=True),
    # A whole plan: gpt3-2.6b, 4 stages x data 4 on a 4x4 mesh of 40 GiB devices, 16 micro-batches of 8.
    "gpt3-2.6b-4x4-data4-plan": dict(model="gpt3-2.6b", plan="4x4", kind="data", batch=128, micro=16, precision="bf16", device="cuda"),
    "gpt3-2.6b-4x4-tensor4-plan": dict(model="gpt3-2.6b", plan="4x4", kind="tensor", batch=128, micro=16, precision="bf16", device="cuda"),
}


def _stage_plan(case: dict[str, Any]) -> Any:
    from hybridplan.plan import Plan

    kind, degree = case["kinds"]
    stages, device = [], 0
    for i, (a, b) in enumerate(GPT13_PIPELINE):
        n = degree if i == 0 else 1
        stages.append({"layers": [a, b], "parallelism": kind if i == 0 else "none", "degree": n,
                       "devices": list(range(device, device + n))})  # fmt: skip
        device += n
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": case["batch"], "num_microbatches": case["micro"], "stages": stages})


def _mesh_plan(case: dict[str, Any]) -> Any:
    from hybridplan.models.zoo import get_model
    from hybridplan.plan import Plan

    n = get_model(case["model"]).num_layers
    cuts = [round(n * i / 4) for i in range(5)]
    stages = [{"layers": [cuts[i], cuts[i + 1]], "parallelism": case["kind"], "degree": 4,
               "devices": list(range(4 * i, 4 * i + 4))} for i in range(4)]  # fmt: skip
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": case["batch"], "num_microbatches": case["micro"], "stages": stages})


def run_case(name: str, iterations: int) -> dict[str, Any]:
    """Run one case in this process and return its measurements."""
    import resource

    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch
    from hybridplan.runtime.sim import simulate_stage

    case = CASES[name]
    whole = "plan" in case
    plan = _mesh_plan(case) if whole else _stage_plan(case)
    cluster = Cluster.parse("4x4", device_memory="40GiB") if whole else Cluster.parse(f"1x{plan.num_devices}")
    cfg = RunConfig(model=case["model"], plan=plan, cluster=cluster, iterations=iterations, backend="sim",
                    precision=case["precision"], device_type=case["device"],
                    activation_checkpointing=case.get("ckpt", False))  # fmt: skip
    setup = time.perf_counter() - START
    t0 = time.perf_counter()
    if whole:
        result = launch(cfg)
        if not result.ok:
            raise SystemExit(f"{name}: the simulated plan did not run: {result.reason}")
        peak = result.peak_memory_bytes
    else:
        peak = simulate_stage(cfg, 0, iterations=iterations).iteration_peaks[-1]
    sim = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"case": name, "setup_s": setup, "sim_s": sim, "rss": rss, "peak": peak}


def zero_shares() -> None:
    """A whole plan with a ZeRO-2/3 stage of 8 devices, simulated device by device (``same_as`` naming each device
    itself) and as ``simulate`` does by default (one device per distinct share: runtime/zero_shares.py); prints
    both times and whether every device's report is equal."""
    from dataclasses import replace

    from hybridplan.models.zoo import get_model
    from hybridplan.plan import Plan
    from hybridplan.plan.cluster import Cluster
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate

    n = get_model("gpt3-1.3b").num_layers
    print("| plan (gpt3-1.3b, bf16, cuda, B=16 in 2) | every device s | one per share s | reports equal |")
    print("|---|---:|---:|---|")
    for zero in (3, 2):
        plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 2, "stages": [
            {"layers": [0, 5], "parallelism": "data", "degree": 8, "devices": list(range(8)), "zero": zero},
            {"layers": [5, n], "parallelism": "none", "degree": 1, "devices": [8]}]})  # fmt: skip
        cfg = RunConfig(model="gpt3-1.3b", plan=plan, cluster=Cluster.parse("1x9", device_memory="80GiB"), iterations=2,
                        backend="sim", device_type="cuda", precision="bf16")  # fmt: skip
        t0 = time.perf_counter()
        every = simulate(cfg, same_as={d: d for d in range(plan.num_devices)})
        t1 = time.perf_counter()
        fewer = simulate(cfg)
        t2 = time.perf_counter()
        equal = ([replace(d, iteration_seconds=[]) for d in every.devices]
                 == [replace(d, iteration_seconds=[]) for d in fewer.devices])  # fmt: skip
        print(f"| [0, 5) data x8 ZeRO-{zero}, [5, {n}) one device | {t1 - t0:.1f} | {t2 - t1:.1f} | {equal} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), help="run one case in this process and print it as JSON")
    parser.add_argument("--iterations", type=int, default=2, help="simulated iterations (default 2: warm-up + measured)")
    parser.add_argument("--zero-shares", action="store_true", help="a ZeRO stage: every device against one per share")
    args = parser.parse_args()
    if args.zero_shares:
        zero_shares()
        return
    if args.case:
        print(json.dumps(run_case(args.case, args.iterations)))
        return
    print("| case | setup s | sim s | total s | peak RSS | device peak |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in CASES:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.sim_speed.run", "--case", name, "--iterations", str(args.iterations)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {name} | {r['setup_s']:.1f} | {r['sim_s']:.1f} | {r['setup_s'] + r['sim_s']:.1f} |"
              f" {r['rss'] / 2**20:.0f} MiB | {r['peak'] / 2**30:.2f} GiB |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
