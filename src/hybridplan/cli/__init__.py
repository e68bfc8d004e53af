"""The ``hybridplan`` command: thin wrappers that parse, call the library, and print.

Exit codes: 0 success; 1 a run that ended with status "oom" or "failed", or an unexpected error (a bug: one
line naming the command and the error, the traceback only with ``hybridplan --debug`` or ``HYBRIDPLAN_DEBUG=1``);
2 bad input (a :class:`~hybridplan.errors.HybridPlanError` or a malformed argument, shown in one or two lines,
never a traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM: the command ends its processes as for
Ctrl-C, and says so).

Building the parser imports no torch, and every command checks its arguments and files before it
imports torch (tests/cli/test_fast_errors.py), so ``--help`` and a bad argument are answered at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

from hybridplan.errors import HybridPlanError

__all__ = ["main", "build_parser", "DEBUG_ENV"]

_COMMANDS = ("models", "gpus", "run", "profile", "predict", "estimate", "estimate-memory", "plan", "validate", "export",
             "demo", "report", "show", "cache")

DEBUG_ENV = "HYBRIDPLAN_DEBUG"
"""Set to anything but "" or "0": an unexpected error prints its traceback, as ``hybridplan --debug`` does."""

_REPORT = "the hybridplan issue tracker"
"""Where a bug goes; the line of an unexpected error names it."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in the CLI's own two-line form (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}\n  fix: see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: a command unwinds as for Ctrl-C (its ``finally`` blocks end the ranks it
    started and close its database), which a silent death by the signal would skip."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    import importlib

    parser = _Parser(
        prog="hybridplan",
        description="Partition a model into pipeline stages with data/tensor parallelism, by measured memory.",
        epilog="Run 'hybridplan COMMAND --help' for a command's options and an example.",
    )
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of an unexpected error (a bug), as {DEBUG_ENV}=1 does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name in _COMMANDS:
        importlib.import_module(f"hybridplan.cli.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0") or "--debug" in words[:1]
    parser = build_parser()
    try:
        args = parser.parse_args(words)
    except SystemExit as e:  # --help (0) or a malformed argument (2): a return code, as for every other outcome
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _LIMITS as e:  # e.g. --model hf:FILE reads the file while parsing
        return _beyond_limits("hybridplan", e, debug)
    except Exception as e:  # an argument's own check that failed in a way of its own: a bug
        return _unexpected("hybridplan", e, debug)
    debug = debug or args.debug
    try:
        with _sigterm_unwinds():
            from hybridplan.cli.common import resolve_device

            resolve_device(args)  # --device from --gpu, before a command reads it
            return int(args.handler(args) or 0)
    except HybridPlanError as e:
        print(f"hybridplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except _Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which closed it: not an error of ours
        sys.stderr.close()
        return 0
    except _LIMITS as e:
        return _beyond_limits(f"hybridplan {args.command}", e, debug)
    except Exception as e:
        return _unexpected(f"hybridplan {args.command}", e, debug)


_LIMITS = (RecursionError, OverflowError, MemoryError)
"""Python's own limits, reached by an input too deeply nested or too large that no check caught (a config of
200,000 nested lists, a size of 1e300 TB): the input's fault more often than ours."""


def _beyond_limits(prog: str, error: BaseException, debug: bool) -> int:
    """One of :data:`_LIMITS`: a usage error's form and exit code (2), the traceback only when debugging."""
    if debug:
        traceback.print_exc()
    what = str(error).splitlines()[0] if str(error) else "no message"
    print(f"{prog}: error: an input is too large or too deeply nested to handle ({type(error).__name__}: {what})\n"
          f"  fix: check the numbers and files given; if they are sane, rerun with --debug and report it to {_REPORT}",
          file=sys.stderr)
    return 2


def _unexpected(prog: str, error: Exception, debug: bool) -> int:
    """An error no check foresaw (a bug): one line naming the command and the error, the traceback only when
    debugging. Exit code 1."""
    if debug:
        traceback.print_exc()
    what = " ".join(str(error).split())[:500] or "no message"
    hint = "" if debug else f"; rerun with 'hybridplan --debug ...' or {DEBUG_ENV}=1 for the traceback"
    print(f"{prog}: unexpected error: {type(error).__name__}: {what} (a bug{hint}; please report it to {_REPORT})",
          file=sys.stderr)
    return 1


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the command runs, SIGTERM raises :class:`_Terminated` in the main thread; the handler that was there is
    put back afterwards. Left alone where the handler is not the default (the caller chose one) or off the main
    thread (only it may set handlers)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise _Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
