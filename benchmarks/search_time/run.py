"""How long the memory-minimising plan search takes, from a 1x4 to a 32x8 mesh and 8 to 200 layers.

Run from the repository root (the memory tables about 3 minutes on a 2-core CPU; ``--quick`` skips the largest cases)::

    .venv/bin/python -m benchmarks.search_time.run
    .venv/bin/python -m benchmarks.search_time.run --quick

Prints two markdown tables: the exact solver on every case (best of ``--repeat`` runs), and exhaustive
enumeration (CAPTURE's Algorithm 4 with its pruning) and Bayesian optimisation (mCAP-BO, 75 evaluations)
beside it on the cases small enough to enumerate. The memory model is the synthetic
:class:`hybridplan.search.memory.synthetic.AdditiveStageModel` (``transformer``: a heavy embedding, similar
blocks with 5% jitter, a heavy head that cannot be tensor-parallel; *pipeline*: the same model in mCAP's
pipeline-only space; *extended*: the same model in the extended space, data x tensor stages included; *whole*:
the whole extended space, also ZeRO-1/2/3 data stages, recompute per stage and stages across nodes), the
same with *identical* blocks
(many plans tie exactly), or *random ints*: a random table of integers 0..3 per stage, the adversarial
case for the tie-break (the optimum is all zeros, and very many plans reach it).

A third table times ``plan --objective throughput`` (the workflow the command calls,
:func:`hybridplan.workflows.plan_throughput.plan_throughput`, after its imports) on a synthetic GPT-like time
profile, with the stage cuts of :mod:`hybridplan.search.time.bottleneck_cuts` beside AMP's dynamic program (the
reference it replaced, ``cuts="amp"``), each old run in a child process killed after ``--old-timeout``
seconds (reported as "> N s"). ``--throughput-only`` skips the memory tables.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hybridplan.plan import Cluster
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from hybridplan.search import PlanSpace, SearchResult, StageTable, solve_bayesian, solve_exact, solve_exhaustive
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel
from hybridplan.workflows.sources import Sources

EXACT_CASES = [  # (nodes, devices per node, layers, horizon, model); "pipeline" models: mCAP's pipeline-only space
    (1, 4, 32, 8, "additive"),
    (4, 4, 64, 8, "additive"),
    (4, 4, 64, 1, "additive"),
    (4, 4, 64, 8, "identical"),
    (4, 4, 64, 8, "random ints"),
    (4, 8, 128, 8, "additive"),
    (8, 8, 128, 8, "additive"),
    (8, 8, 128, 1, "additive"),
    (16, 8, 200, 8, "additive"),
    (16, 8, 200, 1, "additive"),
    (32, 8, 200, 8, "additive"),
    (32, 8, 200, 1, "additive"),
    (32, 8, 200, 8, "identical"),
    (32, 8, 200, 1, "identical"),
    (32, 8, 200, 8, "random ints"),
    (4, 6, 64, 8, "additive"),  # k = 6 is not a power of two: the packing state tracks the degree-4 stages too
    (1, 8, 200, 8, "pipeline"),
    (4, 8, 200, 8, "pipeline"),
    # the extended space (data x tensor stages too): targets under 1 s at 4x4 / 64 layers, 30 s at 128x8 / 200
    (4, 4, 64, 8, "extended"),
    (4, 4, 64, 1, "extended"),
    (32, 8, 200, 8, "extended"),
    (128, 8, 200, 8, "extended"),
    (128, 8, 200, 1, "extended"),
    # the whole extended space: data x tensor, ZeRO-1/2/3, recompute per stage and stages across nodes
    (4, 4, 64, 8, "whole"),
    (4, 4, 64, 1, "whole"),
    (32, 8, 200, 8, "whole"),
    (128, 8, 200, 8, "whole"),
    (128, 8, 200, 1, "whole"),
    (4, 4, 64, 8, "random whole"),  # the adversarial tie-break case in the whole space
    (32, 8, 200, 8, "random whole"),
]
SMALL_CASES = [(1, 4, 30, 1, "pipeline"),  # mCAP's VGG11 case: 30 layers on 4 GPUs, 3654 partitionings
               (1, 4, 12, 4, "additive"), (2, 4, 10, 4, "additive"), (1, 8, 10, 1, "additive"),
               (2, 2, 14, 2, "identical"), (2, 2, 14, 2, "random ints"),
               (1, 4, 12, 4, "extended"), (2, 4, 10, 4, "extended"), (1, 8, 10, 1, "extended"),
               (1, 4, 8, 4, "whole"), (2, 2, 8, 2, "whole"), (2, 2, 8, 2, "random whole")]


def make_case(nodes: int, k: int, layers: int, horizon: int,
              kind: str) -> tuple[AdditiveStageModel | TableStageModel, PlanSpace]:
    """The memory model and plan space of a case."""
    whole = kind in ("whole", "random whole")
    space = PlanSpace(layers, nodes, k, pipeline_only=kind == "pipeline", composite=kind in ("extended", "whole"),
                      zero=whole, recompute=whole, cross_node=whole)
    if kind == "random whole":
        return TableStageModel.random(layers, k, horizon=horizon, seed=0, levels=4, composite=True, zero=True,
                                      recompute=True, num_nodes=nodes, cross_node=True), space
    return make_model(kind, layers, k, horizon), space


def make_model(kind: str, layers: int, k: int, horizon: int) -> AdditiveStageModel | TableStageModel:
    """"additive" (or "pipeline", "extended", "whole") blocks with 5% jitter, "identical" blocks, or "random ints"."""
    if kind == "random ints":
        return TableStageModel.random(layers, k, horizon=horizon, seed=0, levels=4)
    return AdditiveStageModel.transformer(layers, horizon=horizon, seed=0, jitter=0.0 if kind == "identical" else 0.05)


def log10_plans(space: PlanSpace) -> float:
    """log10 of the number of plans, by the counting recurrence in floating point (exact counts overflow), rescaled
    whenever a row grows past 1e250 (the recurrence is linear: every row scaled alike leaves the answer's log)."""
    pk, L = space.packing, space.num_layers
    cols = [pk.column(c.degree) for c in space.configs]
    ways = np.zeros((L + 1, pk.num_states))
    ways[L, pk.start] = 1.0
    shift = 0.0  # log10 of what every row has been divided by
    for start in range(L - 1, -1, -1):
        below = ways[start + 1:].sum(axis=0)
        for col in cols:
            ok = pk.next[:, col] >= 0
            np.add.at(ways[start], pk.next[ok, col], below[ok])
        if ways[start].max() > 1e250:
            ways /= 1e250
            shift += 250.0
    total = ways[0, pk.accepting].sum()
    return math.log10(total) + shift if total > 0 else float("-inf")


def best_of(repeat: int, run: Callable[[], SearchResult]) -> tuple[SearchResult, float]:
    results = [run() for _ in range(repeat)]
    return min(results, key=lambda r: r.elapsed_s), min(r.elapsed_s for r in results)


def exact_table(cases: list[tuple[int, int, int, int, str]], repeat: int) -> list[str]:
    rows = ["| mesh | layers | horizon H | model | plans (log10) | table s | search s | total s | useful states |"
            " candidates | peak |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    for nodes, k, layers, horizon, kind in cases:
        model, space = make_case(nodes, k, layers, horizon, kind)
        result, total = best_of(repeat, lambda: solve_exact(model, space))
        table = result.stats["table_s"]
        rows.append(f"| {nodes}x{k} | {layers} | {horizon} | {kind} | {log10_plans(space):.1f} | {table:.3f} |"
                    f" {total - table:.3f} | {total:.3f} | {result.visited} | {result.stats['candidates']} |"
                    f" {result.peak:.1f} |")
        print(rows[-1], flush=True)
    return rows


def small_table(cases: list[tuple[int, int, int, int, str]]) -> list[str]:
    rows = ["| mesh | layers | H | model | allowed plans | exhaustive s (no pruning) | exhaustive s | plans scored |"
            " exact s | same plan | bayesian s | bayesian peak | optimum |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    for nodes, k, layers, horizon, kind in cases:
        model, space = make_case(nodes, k, layers, horizon, kind)
        table = StageTable(model, space)
        unpruned = solve_exhaustive(model, space, table=table, prune=False)
        full = solve_exhaustive(model, space, table=table)
        exact = solve_exact(model, space, table=table)
        bo = solve_bayesian(model, space, seed=0)
        same = unpruned.stages == full.stages == exact.stages  # layers, kind, degree, devices and value
        rows.append(f"| {nodes}x{k} | {layers} | {horizon} | {kind} | {unpruned.visited} | {unpruned.elapsed_s:.3f} |"
                    f" {full.elapsed_s:.3f} | {full.visited} | {exact.elapsed_s:.3f} | {'yes' if same else 'NO'} |"
                    f" {bo.elapsed_s:.2f} | {bo.peak:.1f} | {exact.peak:.1f} |")
        print(rows[-1], flush=True)
    return rows


THROUGHPUT_CASES = [  # (nodes, devices per node, layers, global batch): the sizes and targets
    (1, 4, 384, 256),    # the old cut: 48 s in the issue
    (2, 8, 96, 256),     # target under 1 s
    (2, 8, 384, 256),    # the old cut: over 120 s in the issue
    (128, 8, 384, 512),  # target under 10 s
]
TENSOR_DEGREES = (1, 2, 4, 8)


def synthetic_time_profile(num_layers: int, seed: int = 0) -> TimeProfile:
    """A GPT-like chain for timing the planner (synthetic, nothing measured): an embedding (4 ms per sample),
    blocks of 2 ms with 5% jitter (as the memory tables' model), a head of 6 ms tied to the embedding (200 MB
    of parameters, 50 MB per block), 2 MB of activations per sample at every boundary; backward twice forward,
    tensor degree t takes 1.1 / t of the time (the all-reduces included)."""
    rng = np.random.default_rng(seed)
    fwd = np.concatenate(([4e-3], 2e-3 * (1 + 0.05 * rng.standard_normal(num_layers - 2)), [6e-3]))
    ends = (0, num_layers - 1)
    layers = tuple(LayerInfo(name=f"layer{i}", activation_bytes_per_sample=2e6, parameter_bytes=2e8 if i in ends else 5e7,
                             shared_parameters="embedding" if i in ends else None) for i in range(num_layers))
    timings = tuple(TimingTable(device_type="A", tensor_degree=t, micro_batch_size=1,
                                forward_s=tuple(fwd * (1.0 if t == 1 else 1.1 / t)),
                                backward_s=tuple(2 * fwd * (1.0 if t == 1 else 1.1 / t))) for t in TENSOR_DEGREES)
    return TimeProfile(model=f"synthetic-gpt-{num_layers}", layers=layers, timings=timings, tensor_comm_in_times=True,
                       source="benchmarks/search_time synthetic_time_profile")


def plan_for_throughput(nodes: int, k: int, layers: int, gbs: int, cuts: str) -> dict[str, object]:
    """One ``plan --objective throughput`` (the workflow, imports done first): wall seconds and the answer."""
    from hybridplan.workflows import plan_throughput as workflow
    import hybridplan.search.time.feasibility  # noqa: F401  (torch, imported by the workflow: not planning time)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        synthetic_time_profile(layers).save(path)
        cluster = Cluster.uniform(nodes, k, device_type="A")
        started = time.perf_counter()
        result = workflow.plan_throughput(Sources.open(None, time_profile=str(path)), cluster, global_batch_size=gbs,
                                          cuts=cuts)  # type: ignore[arg-type]
        wall = time.perf_counter() - started
    return {"wall_s": wall, "search_s": result.seconds, "evaluated": result.evaluated,
            "best_s": result.best.seconds, "best": result.best.label}


def throughput_table(cases: list[tuple[int, int, int, int]], old_timeout: float) -> list[str]:
    rows = ["| mesh | devices | layers | global batch | strategies | new cut: plan s | old cut (AMP's DP): plan s |"
            " speed-up | best s/iter, new | best s/iter, old | best plan (new) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    print("\n".join(rows), flush=True)
    for nodes, k, layers, gbs in cases:
        new = plan_for_throughput(nodes, k, layers, gbs, "bottleneck")
        command = [sys.executable, "-m", "benchmarks.search_time.run", "--old-case", f"{nodes},{k},{layers},{gbs}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=old_timeout, check=True)
            old = json.loads(done.stdout.strip().splitlines()[-1])
            old_s, speedup, old_best = f"{old['wall_s']:.2f}", f"{old['wall_s'] / new['wall_s']:.0f}x", f"{old['best_s']:.4f}"
        except subprocess.TimeoutExpired:  # subprocess.run kills the child
            old_s, speedup, old_best = f"> {old_timeout:.0f}", f"> {old_timeout / new['wall_s']:.0f}x", "-"
        rows.append(f"| {nodes}x{k} | {nodes * k} | {layers} | {gbs} | {new['evaluated']} | {new['wall_s']:.2f} | {old_s} |"
                    f" {speedup} | {new['best_s']:.4f} | {old_best} | {new['best']} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 16x8, 32x8 and 128x8 cases")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is reported")
    parser.add_argument("--throughput-only", action="store_true", help="only the throughput planning table")
    parser.add_argument("--old-timeout", type=float, default=120.0, help="seconds before an old-cut run is stopped")
    parser.add_argument("--models", help="only the cases of these models, comma-separated (e.g. whole,extended)")
    parser.add_argument("--old-case", help=argparse.SUPPRESS)  # child process: one old-cut run, JSON on stdout
    args = parser.parse_args()
    if args.old_case:
        nodes, k, layers, gbs = (int(x) for x in args.old_case.split(","))
        print(json.dumps(plan_for_throughput(nodes, k, layers, gbs, "amp")))
        return
    models = set(args.models.split(",")) if args.models else None
    cases = [c for c in EXACT_CASES if not (args.quick and c[0] * c[1] > 64) and (models is None or c[4] in models)]
    small = [c for c in SMALL_CASES if models is None or c[4] in models]
    started = time.perf_counter()
    if not args.throughput_only:
        print(f"Exact solver (best of {args.repeat}):\n")
        exact_table(cases, args.repeat)
        print("\nExhaustive, exact and Bayesian on enumerable spaces:\n")
        small_table(small)
    if models is not None:
        return
    print(f"\nplan --objective throughput, new and old stage cuts (old stopped after {args.old_timeout:.0f} s):\n")
    throughput_table([c for c in THROUGHPUT_CASES if not (args.quick and c[0] * c[1] > 64)], args.old_timeout)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
