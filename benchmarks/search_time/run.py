"""How long the memory-minimising plan search takes, from a 1x4 to a 32x8 mesh and 8 to 200 layers.

Run from the repository root (about a minute on a 2-core CPU; ``--quick`` skips the largest cases)::

    .venv/bin/python -m benchmarks.search_time.run
    .venv/bin/python -m benchmarks.search_time.run --quick

Prints two markdown tables: the exact solver on every case (best of ``--repeat`` runs), and exhaustive
enumeration (CAPTURE's Algorithm 4 with its pruning) and Bayesian optimisation (mCAP-BO, 75 evaluations)
beside it on the cases small enough to enumerate. The memory model is the synthetic
:class:`hybridplan.search.memory.synthetic.AdditiveStageModel` (``transformer``: a heavy embedding, similar
blocks with 5% jitter, a heavy head that cannot be tensor-parallel; *pipeline*: the same model in mCAP's
pipeline-only space; *extended*: the same model in the extended space, data x tensor stages included), the
same with *identical* blocks
(many plans tie exactly), or *random ints*: a random table of integers 0..3 per stage, the adversarial
case for the tie-break (the optimum is all zeros, and very many plans reach it).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from hybridplan.search import PlanSpace, SearchResult, StageTable, solve_bayesian, solve_exact, solve_exhaustive
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel

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
]
SMALL_CASES = [(1, 4, 30, 1, "pipeline"),  # mCAP's VGG11 case: 30 layers on 4 GPUs, 3654 partitionings
               (1, 4, 12, 4, "additive"), (2, 4, 10, 4, "additive"), (1, 8, 10, 1, "additive"),
               (2, 2, 14, 2, "identical"), (2, 2, 14, 2, "random ints"),
               (1, 4, 12, 4, "extended"), (2, 4, 10, 4, "extended"), (1, 8, 10, 1, "extended")]


def make_case(nodes: int, k: int, layers: int, horizon: int,
              kind: str) -> tuple[AdditiveStageModel | TableStageModel, PlanSpace]:
    """The memory model and plan space of a case."""
    space = PlanSpace(layers, nodes, k, pipeline_only=kind == "pipeline", composite=kind == "extended")
    return make_model(kind, layers, k, horizon), space


def make_model(kind: str, layers: int, k: int, horizon: int) -> AdditiveStageModel | TableStageModel:
    """"additive" (or "pipeline", or "extended") blocks with 5% jitter, "identical" blocks, or "random ints"."""
    if kind == "random ints":
        return TableStageModel.random(layers, k, horizon=horizon, seed=0, levels=4)
    return AdditiveStageModel.transformer(layers, horizon=horizon, seed=0, jitter=0.0 if kind == "identical" else 0.05)


def log10_plans(space: PlanSpace) -> float:
    """log10 of the number of plans, by the counting recurrence in floating point (exact counts overflow)."""
    pk, L = space.packing, space.num_layers
    cols = [pk.column(c.degree) for c in space.configs]
    ways = np.zeros((L + 1, pk.num_states))
    ways[L, pk.start] = 1.0
    for start in range(L - 1, -1, -1):
        below = ways[start + 1:].sum(axis=0)
        for col in cols:
            ok = pk.next[:, col] >= 0
            np.add.at(ways[start], pk.next[ok, col], below[ok])
    total = ways[0, pk.accepting].sum()
    return math.log10(total) if total > 0 else float("-inf")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 16x8, 32x8 and 128x8 cases")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is reported")
    args = parser.parse_args()
    cases = [c for c in EXACT_CASES if not (args.quick and c[0] * c[1] > 64)]
    started = time.perf_counter()
    print(f"Exact solver (best of {args.repeat}):\n")
    exact_table(cases, args.repeat)
    print("\nExhaustive, exact and Bayesian on enumerable spaces:\n")
    small_table(SMALL_CASES)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
