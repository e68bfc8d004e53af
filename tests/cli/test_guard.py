"""The guard at the top of the command line (cli/__init__.py ``main``): an error no check foresaw is one line naming
the command, the error and where to report it (exit 1), its traceback only with ``--debug`` or HYBRIDPLAN_DEBUG;
Python's own limits reached by an input are a usage error (exit 2); SIGTERM ends a command as Ctrl-C does, and says
so (exit 143). The ``models`` command stands for any."""

from __future__ import annotations

import os
import signal
import time

import pytest

import hybridplan.cli.models as models_cli
from hybridplan.cli import main


def _raising(error: BaseException):
    def handle(args):
        raise error

    return handle


def test_an_unexpected_error_is_one_line_naming_the_command_the_error_and_where_to_report(monkeypatch, capsys):
    monkeypatch.delenv("HYBRIDPLAN_DEBUG", raising=False)
    monkeypatch.setattr(models_cli, "handle", _raising(ValueError("a shape of (3,\n 4) is wrong")))
    assert main(["models"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    line = lines[0]
    assert line.startswith("hybridplan models: unexpected error: ValueError: a shape of (3, 4) is wrong")
    assert "--debug" in line and "HYBRIDPLAN_DEBUG=1" in line and "issue tracker" in line
    assert captured.out == ""


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(monkeypatch, capsys, how):
    monkeypatch.delenv("HYBRIDPLAN_DEBUG", raising=False)
    if how == "env":
        monkeypatch.setenv("HYBRIDPLAN_DEBUG", "1")
    monkeypatch.setattr(models_cli, "handle", _raising(KeyError("stage")))
    assert main(["--debug", "models"] if how == "flag" else ["models"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'raise error' in err
    assert err.strip().splitlines()[-1].startswith("hybridplan models: unexpected error: KeyError: 'stage'")


def test_debug_zero_is_off(monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDPLAN_DEBUG", "0")
    monkeypatch.setattr(models_cli, "handle", _raising(RuntimeError("x")))
    assert main(["models"]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded while decoding a JSON array"),
                                   OverflowError("int too large to convert to float"), MemoryError()])
def test_an_input_beyond_pythons_limits_is_a_usage_error_without_traceback(monkeypatch, capsys, error):
    monkeypatch.delenv("HYBRIDPLAN_DEBUG", raising=False)
    monkeypatch.setattr(models_cli, "handle", _raising(error))
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2
    assert lines[0].startswith("hybridplan models: error: an input is too large or too deeply nested")
    assert type(error).__name__ in lines[0] and lines[1].startswith("  fix: ")


def test_a_usage_error_keeps_its_code_and_form(monkeypatch, capsys):
    from hybridplan.errors import UsageError

    monkeypatch.setattr(models_cli, "handle", _raising(UsageError("--x 3 is bad", fix="give 2")))
    assert main(["models"]) == 2
    assert capsys.readouterr().err == "hybridplan models: error: --x 3 is bad\n  fix: give 2\n"


def test_sigterm_ends_a_command_with_a_line_and_code_143_and_puts_the_handler_back(monkeypatch, capsys):
    ended = []

    def handle(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the signal's handler raises in here
        finally:
            ended.append(True)  # what a command cleans up (its ranks, its database) is cleaned up
        return 0

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setattr(models_cli, "handle", handle)
    started = time.monotonic()
    assert main(["models"]) == 143
    assert time.monotonic() - started < 5 and ended == [True]
    err = capsys.readouterr().err
    assert err.startswith("terminated (SIGTERM)") and len(err.strip().splitlines()) == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_config_nested_beyond_pythons_limit_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """``--model hf:FILE`` reads the file while the arguments are parsed: 200,000 nested lists (the issue's case)."""
    monkeypatch.delenv("HYBRIDPLAN_DEBUG", raising=False)
    deep = tmp_path / "config.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(["run", "--model", f"hf:{deep}", "--cluster", "1x4", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2 and err.startswith("hybridplan")


def test_an_unexpected_error_while_parsing_names_the_program(monkeypatch, capsys):
    import hybridplan.cli.common as common

    def broken(text):
        raise KeyError(text)

    monkeypatch.delenv("HYBRIDPLAN_DEBUG", raising=False)
    monkeypatch.setattr(common, "model_name", broken)
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", "p.json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hybridplan: unexpected error: KeyError: 'gpt-tiny'") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
