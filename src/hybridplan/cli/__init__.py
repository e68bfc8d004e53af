"""The ``hybridplan`` command: thin wrappers that parse, call the library, and print.

Exit codes: 0 success; 1 a run that ended with status "oom" or "failed"; 2 bad input (a
:class:`~hybridplan.errors.HybridPlanError` or a malformed argument, shown in one or two lines, never a
traceback); 130 interrupted (Ctrl-C).

Building the parser imports no torch, and every command checks its arguments and files before it
imports torch (tests/cli/test_fast_errors.py), so ``--help`` and a bad argument are answered at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from hybridplan.errors import HybridPlanError

__all__ = ["main", "build_parser"]

_COMMANDS = ("models", "gpus", "run", "profile", "predict", "estimate", "estimate-memory", "plan", "validate", "export",
             "demo", "report", "show", "cache")


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in the CLI's own two-line form (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}\n  fix: see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    import importlib

    parser = _Parser(
        prog="hybridplan",
        description="Partition a model into pipeline stages with data/tensor parallelism, by measured memory.",
        epilog="Run 'hybridplan COMMAND --help' for a command's options and an example.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name in _COMMANDS:
        importlib.import_module(f"hybridplan.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a malformed argument (2): a return code, as for every other outcome
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        from hybridplan.cli.common import resolve_device

        resolve_device(args)  # --device from --gpu, before a command reads it
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
