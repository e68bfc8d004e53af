"""``hybridplan cache``: what the cache of simulated stages and profiles holds, and clearing it
(workflows/simulated_profile.py)."""

from __future__ import annotations

import argparse

from hybridplan.cli.common import add_command
from hybridplan.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "cache",
        help="list or clear the cache of simulated stages and profiles",
        description="'plan' without --db simulates each distinct stage of the model once on fake tensors and keeps the"
        " measurements, and the profiles built from them, in a cache folder, so the same or a related question is"
        " answered from it. 'list' says where it is and what it holds; 'clear' removes it (the next question"
        " simulates again).",
        reads="the cache folder (--cache-dir, else $HYBRIDPLAN_CACHE_DIR, else the user's cache folder).",
        writes="nothing ('list'); 'clear' removes the cached stages, profiles and searches' stage matrices.",
        examples=["hybridplan cache list", "hybridplan cache clear"],
    )
    p.add_argument("action", choices=("list", "clear"), help="list: what it holds; clear: remove it")
    p.add_argument("--cache-dir", metavar="DIR", help="the cache folder (default: $HYBRIDPLAN_CACHE_DIR, else the"
                   " user's cache folder)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from hybridplan.workflows.simulated_profile import cache_entries, clear_cache, default_cache_dir

    root = args.cache_dir or default_cache_dir()
    if args.action == "clear":
        removed = clear_cache(root)
        print(f"cleared {root}: {removed} file(s) removed")
        return 0
    print(f"cache: {root}")
    for kind, files, size in cache_entries(root):
        what = {"stages": "simulated stages and tables", "profiles": "simulated profiles",
                "tables": "stage matrices of searches"}[kind]
        print(f"  {kind:<9} {files:>6} {what}, {format_bytes(size)}")
    return 0
