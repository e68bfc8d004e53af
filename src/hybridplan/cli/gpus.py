"""``hybridplan gpus``: list the GPU catalogue (plan/gpus.py) that ``--gpu`` and a cluster file's ``gpu`` key name."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

from hybridplan.cli.common import add_command
from hybridplan.plan.gpus import CUBLASLT_WORKSPACE_BYTES, GPUS, Gpu, cuda_context_bytes

__all__ = ["register", "handle", "table_rows", "markdown_table", "markdown_terms_table", "markdown_sources_table", "HEADER"]

HEADER = ("gpu", "model", "memory", "fp32", "tf32", "bf16", "fp16", "memory bandwidth", "link (one direction)")
"""The table's columns; the four rates are dense peak TFLOP/s."""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "gpus",
        help="list the GPUs --gpu and a cluster file's gpu key name, with their memory, peak rates and links",
        description="List the GPU catalogue: each GPU's memory as the card states it (an \"80GB\" card: 80 GiB), its "
        "dense peak FP32/TF32/BF16/FP16 TFLOP/s, memory bandwidth and the default link between two GPUs of a node "
        "(one direction), from the vendor's datasheet ('-': not published, or not supported by the architecture). "
        "--gpu NAME (plan, estimate-memory, run, profile) implies --device cuda and takes the memory and link from "
        "here; docs/gpus.md gives every figure's source.",
        reads="nothing.",
        writes="a table to the terminal (or JSON with --json: every field, its source and the CUDA terms of a simulated"
        " device). No files.",
        examples=["hybridplan gpus", "hybridplan gpus --json",
                  "hybridplan plan --model hf:llama2-7b --cluster 2x8 --gpu h100-sxm --global-batch-size 512 "
                  "--num-microbatches 32"],
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=handle)


def _tflops(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1e12:g}"


def table_rows() -> list[tuple[str, ...]]:
    """One row of :data:`HEADER`'s columns per GPU, in catalogue order."""
    rows: list[tuple[str, ...]] = []
    for g in GPUS.values():
        bandwidth = "-" if g.memory_bandwidth is None else f"{g.memory_bandwidth / 1e9:g} GB/s"
        link = g.link if g.link_bandwidth is None else f"{g.link}, {g.link_bandwidth / 1e9:.4g} GB/s"
        rows.append((g.key, g.name, f"{g.memory_stated} ({g.memory_bytes // 2**30} GiB)", _tflops(g.fp32_flops),
                     _tflops(g.tf32_flops), _tflops(g.bf16_flops), _tflops(g.fp16_flops), bandwidth, link))
    return rows


def _markdown(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The catalogue as docs/gpus.md shows it (tests/cli/test_gpus.py keeps the doc equal to it)."""
    return _markdown(HEADER, table_rows())


def markdown_terms_table() -> str:
    """The CUDA terms of a simulated device of each GPU (runtime/gpu_memory.py), as docs/gpus.md shows them."""
    rows = [(g.key, g.architecture, ".".join(map(str, g.compute_capability)), f"{g.cublas_workspace_bytes:,}",
             f"{CUBLASLT_WORKSPACE_BYTES:,}",
             f"{cuda_context_bytes(g) / 2**20:.1f} MiB " + ("(measured)" if g.cuda_context_bytes else "(the H100's)"))
            for g in GPUS.values()]
    return _markdown(("gpu", "architecture", "compute capability", "cuBLAS workspace (B)", "cuBLASLt workspace (B)",
                      "CUDA context"), rows)


def markdown_sources_table() -> str:
    """Where each GPU's figures come from, and what its source leaves out, as docs/gpus.md shows it."""
    return _markdown(("gpu", "source", "notes"), [(g.key, g.source, g.notes or "-") for g in GPUS.values()])


def _as_json(g: Gpu) -> dict:
    return {**dataclasses.asdict(g), "cublas_workspace_bytes": g.cublas_workspace_bytes,
            "simulated_cuda_context_bytes": cuda_context_bytes(g)}


def handle(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([_as_json(g) for g in GPUS.values()], indent=1))
        return 0
    rows = [HEADER, *table_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    numeric = {3, 4, 5, 6, 7}
    for r in rows:
        print("  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    print("\nRates: dense peak TFLOP/s (a datasheet's figure \"with sparsity\" halved); '-': not published, or not"
          " supported by the architecture. Sources of every figure: docs/gpus.md, or --json.")
    print("Use: --gpu NAME (implies --device cuda; --device-memory overrides the memory), or gpu = \"NAME\" in a"
          " cluster file's [device] or [[node_overrides]].")
    return 0
