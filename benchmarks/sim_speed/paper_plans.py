"""Paper-size zoo models simulated on a 4x4 mesh of 40 GiB GPUs: per-stage peaks and simulation time.

Run from the repository root (about 6 minutes on a 2-core CPU)::

    .venv/bin/python -m benchmarks.sim_speed.paper_plans

Each plan cuts the model into 4 stages of (nearly) equal layer counts, one per node, each data- or
tensor-parallel over the node's 4 devices; 1F1B; bf16 mixed precision; CUDA terms
(``device_type="cuda"``). Prints a markdown table: per-stage peak tensor memory (GiB), the largest
device's estimated overhead outside the allocator, whether every device fits its 40 GiB with and without
that overhead, and the wall time of the simulation (``launch(backend="sim")``, 2 iterations).
"""

from __future__ import annotations

import argparse
import time

from hybridplan.plan.cluster import Cluster
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch

CAPACITY = 40 * 2**30
"""The issue's devices: 40 GB A100s, as in the CAPTURE evaluation (taken as 40 GiB)."""

CASES = [  # (model, parallelism, global batch, micro-batches)
    ("gpt3-1.3b", "data", 128, 16),
    ("gpt3-1.3b", "tensor", 128, 16),
    ("gpt3-2.6b", "data", 128, 16),
    ("gpt3-2.6b", "tensor", 128, 16),
    ("gpt3-6.7b", "data", 128, 16),
    ("gpt3-6.7b", "tensor", 128, 16),
    ("moe-1.3b", "data", 128, 16),
    ("moe-2.4b", "tensor", 64, 16),
    ("wresnet-1b", "data", 256, 16),
    ("wresnet-2b", "tensor", 256, 16),
]


def mesh_plan(model: str, kind: str, batch: int, micro: int) -> Plan:
    """4 stages of nearly equal layer counts, stage i on node i's 4 devices."""
    n = get_model(model).num_layers
    cuts = [round(n * i / 4) for i in range(5)]
    stages = [{"layers": [cuts[i], cuts[i + 1]], "parallelism": kind, "degree": 4,
               "devices": list(range(4 * i, 4 * i + 4))} for i in range(4)]  # fmt: skip
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": batch, "num_microbatches": micro, "stages": stages})


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()  # no options: --help only
    print("| model | stages | batch / micro | stage peaks (GiB) | overhead (GiB) | fits 40 GiB | with overhead | sim s |")
    print("|---|---|---|---|---:|---|---|---:|")
    for model, kind, batch, micro in CASES:
        cfg = RunConfig(model=model, plan=mesh_plan(model, kind, batch, micro),
                        cluster=Cluster.parse("4x4", device_memory="40GiB"), iterations=2, backend="sim",
                        precision="bf16", device_type="cuda")  # fmt: skip
        t0 = time.perf_counter()
        result = launch(cfg)
        seconds = time.perf_counter() - t0
        if not result.ok:
            print(f"| {model} | 4 x {kind} 4 | {batch} / {micro} | {result.status}: {result.reason} | | | | {seconds:.0f} |")
            continue
        peaks = [max(d.peak_memory_bytes for d in result.devices if d.stage == s) for s in range(4)]
        overhead = max(d.overhead_bytes for d in result.devices)
        fits = all(d.peak_memory_bytes <= CAPACITY for d in result.devices)
        fits_all = all(d.total_peak_bytes <= CAPACITY for d in result.devices)  # reserved + outside the allocator
        print(f"| {model} | 4 x {kind} 4 | {batch} / {micro} | {' / '.join(f'{p / 2**30:.2f}' for p in peaks)} |"
              f" {overhead / 2**30:.2f} | {'yes' if fits else 'no'} | {'yes' if fits_all else 'no'} | {seconds:.0f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
