"""Simulated against real CUDA peak memory, for plans that run on ONE GPU (the lent machines have one).

Run from the repository root on a machine with a CUDA GPU and a CUDA build of torch::

    .venv/bin/python -m benchmarks.sim_vs_gpu.run            # real CUDA runs and simulations
    .venv/bin/python -m benchmarks.sim_vs_gpu.run --sim-only # the simulated column only (any machine)

For each case it trains the plan for real (``backend="real"``, ``device_type="cuda"``: the peak is
``torch.cuda.max_memory_allocated`` over the measured iterations) and simulates it (``backend="sim"``,
``device_type="cuda"``: fake CPU tensors counted in CUDA allocator blocks), and prints a markdown table:
both peaks, their relative difference, and the per-device overhead outside the allocator, measured
(``total - free - memory_reserved`` after the run) and estimated (runtime/gpu_memory.py).

Why single-device plans: the real runtime gives each rank its own GPU (NCCL refuses two ranks on one
device), so multi-stage plans need as many GPUs as devices. A single device still covers what the GPU
terms model: allocation rounding, mixed precision, activation checkpointing, the foreach AdamW of CUDA
runs, and CUDA's own kernels (attention, cuBLAS workspaces) where they differ from the CPU ones.
"""

from __future__ import annotations

import argparse
from typing import Any

from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch

CASES: list[tuple[str, int, int, str, dict[str, Any]]] = [
    # (model, global batch, micro-batches, schedule, options)
    ("gpt3-125m", 16, 4, "1f1b", {"precision": "fp32"}),
    ("gpt3-125m", 16, 4, "1f1b", {"precision": "bf16"}),
    ("gpt3-125m", 16, 4, "gpipe", {"precision": "bf16", "activation_checkpointing": True}),
    ("gpt3-350m", 8, 2, "1f1b", {"precision": "fp16"}),
    ("moe-380m", 8, 2, "1f1b", {"precision": "bf16"}),
    ("wresnet-250m", 32, 4, "gpipe", {"precision": "fp32"}),
    ("wresnet-250m", 32, 4, "gpipe", {"precision": "bf16", "activation_checkpointing": True}),
]


def _plan(model: str, batch: int, micro: int, schedule: str) -> Plan:
    from hybridplan.models.zoo import get_model

    layers = get_model(model).num_layers
    stages = [{"layers": [0, layers], "parallelism": "none", "degree": 1, "devices": [0]}]
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch, "num_microbatches": micro, "stages": stages})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-only", action="store_true", help="only simulate (no GPU needed)")
    parser.add_argument("--iterations", type=int, default=3, help="iterations per run (default 3: warm-up + 2)")
    args = parser.parse_args()
    print("| model | batch / micro | schedule | options | simulated peak | real peak | difference |"
          " overhead estimated | overhead measured |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for model, batch, micro, schedule, options in CASES:
        plan = _plan(model, batch, micro, schedule)
        common = dict(model=model, plan=plan, cluster=Cluster.parse("1x1"), iterations=args.iterations, device_type="cuda", **options)
        sim = launch(RunConfig(backend="sim", **common))
        if not sim.ok:
            raise SystemExit(f"{model} ({schedule}, {options}): simulated run {sim.status}: {sim.reason}")
        s = sim.devices[0]
        real_peak = real_overhead = diff = "-"
        if not args.sim_only:
            real = launch(RunConfig(backend="real", **common))
            if not real.ok:
                raise SystemExit(f"{model} ({schedule}, {options}): real CUDA run {real.status}: {real.reason}")
            r = real.devices[0]
            real_peak = f"{r.peak_memory_bytes / 2**20:.1f} MiB"
            diff = f"{(s.peak_memory_bytes - r.peak_memory_bytes) / r.peak_memory_bytes:+.2%}"
            real_overhead = f"{r.overhead_bytes / 2**20:.0f} MiB" if r.overhead_bytes is not None else "-"
        opts = ", ".join(f"{k}={v}" for k, v in options.items())
        print(f"| {model} | {batch} / {micro} | {schedule} | {opts} | {s.peak_memory_bytes / 2**20:.1f} MiB |"
              f" {real_peak} | {diff} | {s.overhead_bytes / 2**20:.0f} MiB | {real_overhead} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
