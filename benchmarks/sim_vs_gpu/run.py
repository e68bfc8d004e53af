"""Simulated against real CUDA peak memory, for plans that run on ONE GPU (the lent machines have one).

Run from the repository root on a machine with a CUDA GPU and a CUDA build of torch::

    .venv/bin/python -m benchmarks.sim_vs_gpu.run            # real CUDA runs and simulations
    .venv/bin/python -m benchmarks.sim_vs_gpu.run --sim-only # the simulated column only (any machine)
    CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 .venv/bin/python -m benchmarks.sim_vs_gpu.run --shared

``--shared``: multi-stage plans on the one GPU instead, every rank a process of its own sharing it
(``share_gpu``, runtime/shared_gpu.py): a 4-stage and a data-parallel plan of gpt-tiny, each rank's
``max_memory_allocated`` against its simulated peak (the cuBLAS workspaces, 65 MiB per process that the
simulator does not model, turned off by the two variables: ../shared/notes/gpu-h100-facts.md).

For each case it trains the plan for real (``backend="real"``, ``device_type="cuda"``: the peak is
``torch.cuda.max_memory_allocated`` over the measured iterations) and simulates it (``backend="sim"``,
``device_type="cuda"``: fake CPU tensors counted in CUDA allocator blocks), and prints a markdown table:
both peaks, their relative difference, and the per-device overhead outside the allocator, measured
(``total - free - memory_reserved`` after the run) and estimated (runtime/gpu_memory.py).

Why single-device plans: the real runtime gives each rank its own GPU (NCCL refuses two ranks on one
device), so multi-stage plans need as many GPUs as devices, or ``--shared`` below. A single device still covers what the GPU
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


SHARED_PLANS: dict[str, list[dict[str, Any]]] = {
    # gpt-tiny's 10 layers; global batch 16 in 4 micro-batches, 1F1B (tests/runtime/test_shared_gpu.py's plans)
    "4 stages": [{"layers": [a, b], "parallelism": "none", "degree": 1, "devices": [d]}
                 for d, (a, b) in enumerate([(0, 3), (3, 5), (5, 8), (8, 10)])],
    "data x4": [{"layers": [0, 10], "parallelism": "data", "degree": 4, "devices": [0, 1, 2, 3]}],
}


def shared(iterations: int) -> None:
    """``--shared``: per-rank peaks of multi-stage plans on one GPU against the simulator's."""
    print("| plan | device | simulated peak | real peak (shared GPU) | difference |")
    print("|---|---:|---:|---:|---:|")
    for name, stages in SHARED_PLANS.items():
        plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": stages})
        common = dict(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x4"), iterations=iterations, device_type="cuda")
        sim, real = launch(RunConfig(backend="sim", **common)), launch(RunConfig(share_gpu=True, **common))
        if not (sim.ok and real.ok):
            raise SystemExit(f"{name}: simulated {sim.status} ({sim.reason}), real {real.status} ({real.reason})")
        for s, r in zip(sim.devices, real.devices):
            diff = (s.peak_memory_bytes - r.peak_memory_bytes) / r.peak_memory_bytes
            print(f"| {name} | {r.device} | {s.peak_memory_bytes:,} B | {r.peak_memory_bytes:,} B | {diff:+.2%} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-only", action="store_true", help="only simulate (no GPU needed)")
    parser.add_argument("--shared", action="store_true", help="multi-stage gpt-tiny plans, ranks sharing the one GPU")
    parser.add_argument("--iterations", type=int, default=3, help="iterations per run (default 3: warm-up + 2)")
    args = parser.parse_args()
    if args.shared:
        shared(args.iterations)
        return
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
