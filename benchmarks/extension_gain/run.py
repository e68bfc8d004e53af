"""What the extended plan space buys at paper sizes, on simulated devices (issue 11, third target).

For each model, on the 4x4 mesh of 40 GiB devices of CAPTURE's evaluation (``--backend sim --device cuda
--precision bf16``: the real runtime's per-device work on fake tensors, CUDA allocator terms), three plan
spaces are compared:

- **CAPTURE**: stages pipeline-only, data- or tensor-parallel, each inside a node (``plan --space capture``);
- **extended**: also data x tensor stages, stages over whole nodes, where a recompute profile exists activation
  recompute per stage, and ZeRO data stages at the setting's levels (``Setting.zero``: ZeRO-1 in the bf16
  settings) (``plan --space extended --allow-cross-node --recompute-db --zero``); each dimension is added in
  that order, to show what it contributes;
- **Megatron-style 3D**: the best uniform plan (``search/baselines.py`` ``uniform_3d_plan``: equal layer counts
  per stage, tensor inside a node, data across), over every (pp, tp, dp) of the mesh, without ZeRO and with
  ZeRO-1 over each stage's data group where the setting searches ZeRO-1.

Columns, a module each: the lowest peak per space (``peak.py``: each chosen plan also run on simulated devices),
the fewest devices per space (``fewest.py``: ``plan --fewest-devices`` through the command line), the fastest
plan that fits (``fastest.py``: AMP's search with memory predictions; layer times from FLOPs, as no GPU is
lent), and with ``--largest`` the largest trainable model (``largest.py``: a search over the width, a
profile per probe). ``settings.py`` holds the models and their profiles, ``megatron.py`` the uniform baseline,
``plans.py`` what every column does with a plan, ``tables.py`` the README's tables.

Profiles (``work/``, git-ignored; resumable) are made with the ``hybridplan profile`` commands this script
prints (``--profile`` makes them first); a model whose profile is unfinished is skipped with the reason, and a
recompute profile that is unfinished leaves out its rows. Run from the repository root (resumable: each
finished result is written to results.json)::

    .venv/bin/python -m benchmarks.extension_gain.run                     # every model whose profile is done
    .venv/bin/python -m benchmarks.extension_gain.run --models moe-1.3b --profile
    .venv/bin/python -m benchmarks.extension_gain.run --models gpt3-6.7b --columns fastest   # one column
    .venv/bin/python -m benchmarks.extension_gain.run --table             # the README's tables only
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.fastest import fastest
from benchmarks.extension_gain.fewest import fewest
from benchmarks.extension_gain.largest import SPACES as LARGEST_SPACES
from benchmarks.extension_gain.largest import largest
from benchmarks.extension_gain.peak import lowest_peak, megatron_lowest
from benchmarks.extension_gain.settings import DEFAULT_MODELS, HERE, SETTINGS, profile_commands, usable
from benchmarks.extension_gain.tables import print_tables

COLUMNS = ("peak", "fewest", "fastest")
"""The columns ``--columns`` picks: the lowest peak (with the uniform baselines: the fastest column times their
rows), the fewest devices, the fastest plan that fits."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"of {list(SETTINGS)}")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    ap.add_argument("--no-validate", action="store_true", help="skip the simulated runs of the chosen plans"
                    " (the largest model's too: the plan at its widest width)")
    ap.add_argument("--table", action="store_true", help="only print the tables from the results")
    ap.add_argument("--recompute-profiles", help="comma-separated subset of the settings' recompute profiles to use"
                    " (e.g. 'pipeline' while the others are still being profiled)")
    ap.add_argument("--profile", action="store_true", help="make (resume) the profiles first, and those of the"
                    " largest-model probes; without it, a model whose profile is unfinished is skipped")
    ap.add_argument("--columns", default=",".join(COLUMNS), help=f"comma-separated subset of {list(COLUMNS)}, or none (the"
                    " largest model also needs --largest); a column reads only its own results and the lowest peak's")
    ap.add_argument("--largest", action="store_true", help="also the largest trainable model: a search over"
                    " the width, a profile per probed width (largest.py)")
    ap.add_argument("--largest-factor", type=float, default=4.0, help="the widest width the largest-model search"
                    " probes, in multiples of the model's own (default 4; an 'at least' answer asks for more)")
    ap.add_argument("--largest-spaces", default=",".join(LARGEST_SPACES), help="comma-separated subset of"
                    f" {list(LARGEST_SPACES)} (searches of different spaces may run side by side, each with its own"
                    " --results file: a probe's profile is made by one of them while the others wait)")
    ap.add_argument("--merge", help="comma-separated results files of searches run side by side (each with its own"
                    " --results): their largest-model records copied into --results, then the tables")
    args = ap.parse_args()
    if args.merge:
        merged = merge_largest(ResultStore(args.results), [Path(f) for f in args.merge.split(",")])
        print(f"merged {', '.join(merged) or 'nothing'} into {args.results}")
        print_tables(ResultStore(args.results))
        return
    for space in args.largest_spaces.split(","):
        if space not in LARGEST_SPACES:
            ap.error(f"unknown space {space!r} in --largest-spaces; choose from {', '.join(LARGEST_SPACES)}")
    if not args.largest_factor > 1:
        ap.error(f"--largest-factor {args.largest_factor} must be above 1 (the model's own width is the low end)")
    store = ResultStore(args.results)
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    if not args.table:
        from hybridplan.cli import main as hybridplan

        for name in args.models.split(","):
            if name not in SETTINGS:
                ap.error(f"unknown model {name!r}; choose from {', '.join(SETTINGS)}")
        for column in args.columns.split(","):
            if column not in COLUMNS and column != "none":
                ap.error(f"unknown column {column!r}; choose from {', '.join(COLUMNS)} or none")
        for name in args.models.split(","):
            s = SETTINGS[name]
            if args.recompute_profiles is not None:
                s = replace(s, recompute=tuple(r for r in s.recompute if r in args.recompute_profiles.split(",")))
            columns = args.columns.split(",")
            if columns == ["none"]:  # the largest model alone: each probe makes (or checks) the profiles its
                if args.largest:     # space reads, the model's own width included (largest.py)
                    largest(s, store, say, profile=args.profile, high_factor=args.largest_factor,
                            spaces_searched=tuple(args.largest_spaces.split(",")), validate=not args.no_validate)
                continue
            for argv in profile_commands(s):
                say("hybridplan " + " ".join(argv))
                if args.profile and hybridplan(argv) != 0:
                    raise SystemExit(f"profiling {name} failed")
            ready, notes = usable(s)
            for note in notes:
                say(note)
            if ready is None:
                continue
            if "peak" in columns:
                lowest_peak(ready, store, say, not args.no_validate)
                megatron_lowest(ready, store, say, not args.no_validate)
            if "fewest" in columns:
                fewest(ready, store, say, not args.no_validate)
            if "fastest" in columns:
                fastest(ready, store, say, not args.no_validate)
            if args.largest:
                largest(ready, store, say, profile=args.profile, high_factor=args.largest_factor,
                        spaces_searched=tuple(args.largest_spaces.split(",")), validate=not args.no_validate)
    print_tables(store)


def merge_largest(store: ResultStore, files: list[Path]) -> list[str]:
    """Copy the largest-model records (``<model>/largest/<space>``) of ``files`` into ``store``, each file's as it
    stands (a later file wins a key two hold); the keys copied. A file that is missing or not a results file
    stops the merge before anything is written.

    Raises:
        SystemExit: naming the file and why.
    """
    records: dict[str, Any] = {}
    for f in files:
        if not f.is_file():
            raise SystemExit(f"--merge: {f} does not exist (give the --results file a search wrote)")
        try:
            found = ResultStore(f).records
        except (OSError, ValueError) as e:
            raise SystemExit(f"--merge: cannot read {f}: {e}") from None
        if not isinstance(found, dict):
            raise SystemExit(f"--merge: {f} is not a results file (a JSON object of records)")
        records.update({k: v for k, v in found.items() if k.split("/")[1:2] == ["largest"]})
    for key, record in records.items():
        store.put(key, record)
    return list(records)


if __name__ == "__main__":
    main()
