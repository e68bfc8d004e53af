"""What the user's engine holds: hybridplan's estimate of a plan run by torchtitan against torchtitan's published
peak memory of the same runs.

Run from the repository root (a minute per run on a 2-core CPU, no GPU)::

    .venv/bin/python -m benchmarks.engine_memory.run            # or: --shared /path/to/shared --out results.json

The published runs: torchtitan's "Llama 3.1 ... H100" benchmark of December 2024 (github.com/pytorch/torchtitan,
``benchmarks/llama3_h100_202412_torchtitan.md``; torchtitan 9dec370, 8 H100 SXM of 96 GB HBM2e per host), read from
``../shared/data/torchtitan/llama3_h100_202412_measured.csv`` (its tables transcribed; never copied into the
project). Its "Memory(GiB)" is torchtitan's logged peak of the caching allocator's *reserved* bytes, the largest of
any GPU. A run is predicted where every setting it used is one hybridplan runs: FSDP (``data_parallel_shard_degree``,
ZeRO-3 here) without tensor, pipeline or context parallelism, eager (no ``torch.compile``), bf16 (no Float8), full or
per-operation selective activation checkpointing. The others are listed with what is not modelled.

Each predicted run is one plan: the model's 34 layers (embedding, 32 blocks, head) as one stage, data x the number
of GPUs, ZeRO-3, every block recomputed as the run did; one micro-batch of the run's local batch per GPU
(``global_batch_size`` = local batch x GPUs); Llama 3.1 8B's sizes (``hf:llama3-8b``: Llama 3 8B's configuration, the
same sizes; its RoPE scaling changes no tensor) at the run's sequence length. Each is estimated twice with
``hybridplan estimate-memory --plan ... --gpu h100-sxm --device-memory 96GiB --precision bf16 --json``: as torchtitan
holds it (``--engine torchtitan``: fp32 gradient reduce-scatter, fused AdamW, docs/engines.md) and as hybridplan's
own runtime does; a selectively recomputed run is also estimated with full recompute, the nearest plan before the
selective policy ran. The figure compared is the simulated allocator's reserved peak, the largest of any device.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 2**30
CAPACITY = "96GiB"
"""The published runs' GPUs: H100 SXM with 96 GB of HBM2e ("80GB" cards hold 80 GiB: a card's GB are GiB)."""


def _not_modelled(row: dict[str, str]) -> list[str]:
    """What a published run used that hybridplan does not run (empty: the run is predicted)."""
    out = []
    for key, what in (("tp", "tensor parallelism (with loss parallel)"), ("pp", "torchtitan's pipeline schedules"),
                      ("cp", "context parallelism")):
        if int(row[key]) > 1:
            out.append(what)
    if row["compile"] == "yes":
        out.append("torch.compile")
    if row["float8"] == "yes":
        out.append("Float8 linear layers")
    return out


def _plan(row: dict[str, str], recompute: str | None = None) -> dict[str, Any]:
    gpus, local = int(row["num_gpus"]), int(row["local_batch"])
    recompute = recompute or {"selective": "selective", "full": "full"}[row["activation_checkpointing"]]
    return {"schedule": "1f1b", "global_batch_size": local * gpus, "num_microbatches": 1,
            "stages": [{"layers": [0, 34], "parallelism": "data", "degree": gpus, "devices": list(range(gpus)),
                        "zero": 3, "recompute": recompute}]}


def _estimate(model: str, plan: Path, gpus: int, engine: str) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridplan", "estimate-memory", "--model", model, "--cluster",
                           f"{gpus // 8}x8", "--gpu", "h100-sxm", "--device-memory", CAPACITY, "--plan", str(plan),
                           "--precision", "bf16", "--engine", engine, "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["estimates"][0], time.perf_counter() - t0


def run(shared: Path) -> list[dict[str, Any]]:
    rows = list(csv.DictReader((shared / "data" / "torchtitan" / "llama3_h100_202412_measured.csv").open()))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(rows):
            name = (f"table {row['table']}: {row['model']} on {row['num_gpus']} GPUs, FSDP {row['fsdp']} TP {row['tp']}"
                    f" PP {row['pp']} CP {row['cp']}, local batch {row['local_batch']}, seq {row['seq_len']},"
                    f" {row['activation_checkpointing']} AC, compile {row['compile']}, float8 {row['float8']}")
            measured = float(row["peak_memory_GiB_max_over_gpus"])
            missing = _not_modelled(row)
            if missing or row["model"] != "llama3.1-8B":
                results.append({"run": name, "measured_GiB": measured, "not_modelled": missing or [row["model"]]})
                continue
            model = f"hf:llama3-8b,seq={row['seq_len']}"
            entry: dict[str, Any] = {"run": name, "measured_GiB": measured, "model": model, "plan": _plan(row)}
            variants = [("torchtitan", None), ("hybridplan", None)]
            if row["activation_checkpointing"] == "selective":  # what could be asked before the selective policy ran
                variants.append(("torchtitan", "full"))
            for engine, recompute in variants:
                plan = Path(tmp) / f"plan{i}-{recompute}.json"
                plan.write_text(json.dumps(_plan(row, recompute)))
                estimate, seconds = _estimate(model, plan, int(row["num_gpus"]), engine)
                reserved = max(d["reserved_peak_bytes"] for d in estimate["devices"])
                need = max(d["reserved_peak_bytes"] + d["overhead_bytes"] for d in estimate["devices"])
                entry[engine if recompute is None else f"{engine}, recompute {recompute}"] = {"reserved_GiB": round(reserved / GIB, 2), "need_GiB": round(need / GIB, 2),
                                 "error": round(reserved / GIB / measured - 1, 4), "fits_96GiB": need <= 96 * GIB,
                                 "seconds": round(seconds, 1)}
            results.append(entry)
            print(f"{name}: measured {measured} GiB; torchtitan profile {entry['torchtitan']['reserved_GiB']} GiB"
                  f" ({entry['torchtitan']['error']:+.1%}); hybridplan's runtime {entry['hybridplan']['reserved_GiB']}"
                  f" GiB ({entry['hybridplan']['error']:+.1%})" + "".join(
                      f"; {k}: {v['reserved_GiB']} GiB ({v['error']:+.1%})" for k, v in entry.items()
                      if k.startswith("torchtitan, recompute")), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    source = args.shared / "data" / "torchtitan"
    if not source.is_dir():
        raise SystemExit(f"error: {source} not found\n  fix: pass --shared /path/to/shared")
    print(f"Machine: {platform.processor() or platform.machine()}, {platform.python_implementation()}"
          f" {platform.python_version()}\n")
    results = run(args.shared)
    for r in results:
        if "not_modelled" in r:
            print(f"{r['run']}: measured {r['measured_GiB']} GiB; not predicted: {', '.join(r['not_modelled'])}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
