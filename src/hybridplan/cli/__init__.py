"""The ``hybridplan`` command: thin wrappers that parse, call the library, and print.

Exit codes: 0 success; 1 a run that ended with status "oom" or "failed"; 2 bad input (a
:class:`~hybridplan.errors.HybridPlanError`, shown in one or two lines, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hybridplan.errors import HybridPlanError

__all__ = ["main", "build_parser"]

_COMMANDS = ("models", "run", "profile", "predict", "estimate", "plan", "validate", "demo", "report")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="hybridplan",
        description="Partition a model into pipeline stages with data/tensor parallelism, by measured memory.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        importlib.import_module(f"hybridplan.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except HybridPlanError as e:
        print(f"hybridplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which closed it: not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
