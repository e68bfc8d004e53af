"""The stage cut's worst case: evaluations and seconds of the bottleneck search on adversarial inputs.

Run from the repository root (about 10 min on a 2-core CPU, most of it the old search's time boxes)::

    nice -n 5 .venv/bin/python -m benchmarks.search_time.worst_case
    nice -n 5 .venv/bin/python -m benchmarks.search_time.worst_case --quick     # L <= 192

Prints two markdown tables: every case with the old search (``bottleneck_cuts.py`` as of commit ``81d292f``,
read from git: the box search alone, windows by reduceat) and the new one (boxes, then the batched sweep
without sync; sparse-table windows) side by side, each in a child process stopped after ``--limit`` seconds;
then the growth exponents fitted on them (least squares of log count or log seconds on log L, per family and
k, where at least three sizes finished). *evaluations* counts calls of ``_Problem.evaluate`` (one ``S(P, Q)``
with its cut); the new search's *swept* counts the caps of the batched sweep (``_Problem.sums``, rows of one
numpy pass). Nothing is measured on hardware: the inputs are synthetic families (``family``), built to be
hard for a search that prunes (module note of ``hybridplan.search.time.bottleneck_cuts``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from hybridplan.search.time import bottleneck_cuts, cut_problem, sync_costs

OLD_COMMIT = "81d292f"
"""The commit whose ``bottleneck_cuts.py`` is the old search (the base of the branch that bounded it)."""

FAMILIES: dict[str, str] = {
    "equal": "equal layer times, no boundary costs, gas 8: every cut of one bottleneck ties",
    "distinct": "layer times 1 + U(0, 1e-3) (every range sum distinct), boundary costs U(0, 2), gas 2",
    "floors": "as distinct, gas 4, boundary floors U(0, 2 L / k) (near the bottleneck)",
    "hetero": "four device types (stage cost vectors U(0.5, 1.5) each, stage j of type j mod 4), gas 4",
    "large g": "as distinct, gas 1000",
    "tiny g + sync": "as distinct, gas 1 (g = 1e-9), a sync of factor 1 on bytes U(0.5, 1.5) per layer",
    "heavy sync": "as distinct, gas 4, sync factors 2, 4 or 8 per stage on bytes U(0.5, 1.5)",
    "tied": "tied corners (module note): boundaries 1 and 2 pay back the middle stage's g t; noise 1e-6",
    "tied sync": "the same tie on the sync: layer times 1e-3, bytes 1 + U(0, 1e-3), factor 1",
    "tied both": "a pipeline tie on stages 0-2 and a sync tie on stages 2-4 (k >= 5)",
}
SIZES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {  # family: (layers, stages)
    "tied": ((48, 96, 192, 384, 768), (3, 8)),
    "tied sync": ((24, 48, 96, 192), (3, 8)),
    "tied both": ((12, 24, 48), (5, 8)),
}
DEFAULT_SIZES = ((48, 96, 192, 384, 768), (2, 8, 32, 64))

Case = tuple[list[np.ndarray], list[np.ndarray], int, list[np.ndarray] | None, sync_costs.SyncCosts | None]


def family(name: str, num_layers: int, k: int, seed: int = 0) -> Case:
    """Stage costs, boundary costs, gas, floors and sync of one adversarial case (``FAMILIES``)."""
    rng = np.random.default_rng(seed)
    n = num_layers
    jitter = 1 + rng.uniform(0, 1e-3, n)
    cuts = [rng.uniform(0, 2, n) for _ in range(k - 1)]
    sync = sync_costs.SyncCosts
    if name == "equal":
        return [np.ones(n)] * k, [np.zeros(n)] * (k - 1), 8, None, None
    if name == "distinct":
        return [jitter] * k, cuts, 2, None, None
    if name == "floors":
        return [jitter] * k, cuts, 4, [rng.uniform(0, 2 * n / k, n) for _ in range(k - 1)], None
    if name == "hetero":
        kinds = [rng.uniform(0.5, 1.5, n) for _ in range(4)]
        return [kinds[j % 4] for j in range(k)], cuts, 4, None, None
    if name == "large g":
        return [jitter] * k, cuts, 1000, None, None
    if name == "tiny g + sync":
        return [jitter] * k, cuts, 1, None, sync(sync_costs.range_sums(rng.uniform(0.5, 1.5, n)), (1.0,) * k)
    if name == "heavy sync":
        factors = tuple(float(f) for f in rng.choice([2.0, 4.0, 8.0], k))
        return [jitter] * k, cuts, 4, None, sync(sync_costs.range_sums(rng.uniform(0.5, 1.5, n)), factors)
    noise = 1e-6
    gas, g = 3, 2.0
    if name == "tied":
        p = np.concatenate(([0.0], np.cumsum(jitter)))
        tie = [g * p[1:] + rng.uniform(0, noise, n), g * (p[-1] - p[1:]) + rng.uniform(0, noise, n)]
        return [jitter] * k, tie + [np.zeros(n)] * (k - 3), gas, None, None
    w = jitter.copy()
    cum = np.concatenate(([0.0], np.cumsum(w)))
    tie_q = [cum[1:] + rng.uniform(0, noise, n), (cum[-1] - cum[1:]) + rng.uniform(0, noise, n)]
    if name == "tied sync":
        t = 1e-3 + rng.uniform(0, 1e-6, n)
        return [t] * k, tie_q + [np.zeros(n)] * (k - 3), gas, None, sync(sync_costs.range_sums(w), (1.0,) * k)
    if name == "tied both":
        t = 1 + rng.uniform(0, 1e-3, n)
        p = np.concatenate(([0.0], np.cumsum(t)))
        tie_p = [g * p[1:] + rng.uniform(0, noise, n), g * (p[-1] - p[1:]) + rng.uniform(0, noise, n)]
        factors = tuple(1.0 if j == 3 else 1e-3 for j in range(k))
        return ([t] * k, tie_p + tie_q + [np.zeros(n)] * (k - 5), gas, None,
                sync(sync_costs.range_sums(w), factors))
    raise ValueError(f"unknown family {name!r}: one of {', '.join(FAMILIES)}")


def old_module() -> ModuleType:
    """``bottleneck_cuts.py`` as of ``OLD_COMMIT``, read from git and imported under its own name."""
    root = Path(__file__).resolve().parents[2]
    source = subprocess.run(["git", "show", f"{OLD_COMMIT}:src/hybridplan/search/time/bottleneck_cuts.py"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "old_bottleneck_cuts.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("old_bottleneck_cuts", path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load the old stage cut from {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["old_bottleneck_cuts"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def run_case(which: str, name: str, num_layers: int, k: int) -> dict[str, Any]:
    """One search (``which``: old or new) on one case: seconds, evaluations, swept caps, objective."""
    module = old_module() if which == "old" else bottleneck_cuts
    counts = {"evaluations": 0, "swept": 0}
    problem = module._Problem if which == "old" else cut_problem._Problem  # the old file held it too
    evaluate = problem.evaluate

    def counted(self: Any, cap_p: float, cap_q: float) -> Any:
        counts["evaluations"] += 1
        return evaluate(self, cap_p, cap_q)

    problem.evaluate = counted
    if hasattr(problem, "sums"):
        sums = problem.sums

        def counted_sums(self: Any, caps: np.ndarray, cap_q: float) -> Any:
            counts["swept"] += len(caps)
            return sums(self, caps, cap_q)

        problem.sums = counted_sums
    case = family(name, num_layers, k)
    started = time.perf_counter()
    found = module.bottleneck_assignment(*case)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "objective": found.objective, **counts}


def in_child(which: str, name: str, num_layers: int, k: int, limit: float) -> dict[str, Any] | None:
    """``run_case`` in a child process stopped after ``limit`` seconds (None then)."""
    command = [sys.executable, "-m", "benchmarks.search_time.worst_case", "--case", json.dumps([which, name, num_layers, k])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return None
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def fit(points: list[tuple[int, float]]) -> str:
    """The slope of log value on log L (least squares), or "-" with fewer than three sizes."""
    points = [(x, y) for x, y in points if y > 0]
    if len(points) < 3:
        return "-"
    xs, ys = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return f"{np.polyfit(xs, ys, 1)[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="layers up to 192 only")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds before a run is stopped")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, from: " + ", ".join(FAMILIES))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child process: one run, JSON on stdout
    args = parser.parse_args()
    if args.case:
        which, name, num_layers, k = json.loads(args.case)
        print(json.dumps(run_case(which, name, num_layers, k)))
        return
    print("| family | L | k | old: evaluations | old s | new: evaluations | new: swept | new s | speed-up | same objective |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    results: dict[tuple[str, int, str], list[tuple[int, dict[str, Any]]]] = {}
    for name in args.families.split(","):
        layer_sizes, stage_counts = SIZES.get(name, DEFAULT_SIZES)
        for k in stage_counts:
            stopped = {"old": False, "new": False}
            for num_layers in layer_sizes:
                if k > num_layers or (args.quick and num_layers > 192):
                    continue
                runs: dict[str, dict[str, Any] | None] = {}
                for which in ("old", "new"):
                    # a search stopped at some L is not run at larger L (it would be stopped again)
                    run = None if stopped[which] else in_child(which, name, num_layers, k, args.limit)
                    runs[which], stopped[which] = run, run is None
                    if run is not None:
                        results.setdefault((name, k, which), []).append((num_layers, run))
                old, new = runs["old"], runs["new"]

                def cell(run: dict[str, Any] | None, key: str, fmt: Callable[[Any], str]) -> str:
                    return fmt(run[key]) if run is not None else f"> {args.limit:.0f} s" if key == "seconds" else "-"

                speed = f"{old['seconds'] / new['seconds']:.1f}x" if old and new else "-"
                same = ("yes" if math.isclose(old["objective"], new["objective"], rel_tol=1e-9, abs_tol=1e-12)
                        else f"NO ({old['objective']!r} vs {new['objective']!r})") if old and new else "-"
                print(f"| {name} | {num_layers} | {k} | {cell(old, 'evaluations', str)} | "
                      f"{cell(old, 'seconds', lambda s: f'{s:.3f}')} | {cell(new, 'evaluations', str)} | "
                      f"{cell(new, 'swept', str)} | {cell(new, 'seconds', lambda s: f'{s:.3f}')} | {speed} | {same} |",
                      flush=True)
    print("\nGrowth exponents (slope of log on log L; '-': fewer than three sizes finished):\n")
    print("| family | k | old: evaluations | old: seconds | new: evaluations + swept | new: seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.families.split(","):
        for k in SIZES.get(name, DEFAULT_SIZES)[1]:
            old_runs, new_runs = results.get((name, k, "old"), []), results.get((name, k, "new"), [])
            print(f"| {name} | {k} | {fit([(n, r['evaluations']) for n, r in old_runs])} | "
                  f"{fit([(n, r['seconds']) for n, r in old_runs])} | "
                  f"{fit([(n, r['evaluations'] + r['swept']) for n, r in new_runs])} | "
                  f"{fit([(n, r['seconds']) for n, r in new_runs])} |")


if __name__ == "__main__":
    main()
