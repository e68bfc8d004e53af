"""Every command's ``--help`` says what it does, what it reads and writes, and gives an example."""

from __future__ import annotations

import pytest

from hybridplan.cli import _COMMANDS, main


def test_the_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in _COMMANDS)


@pytest.mark.parametrize("command", _COMMANDS)
def test_command_help(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]  # after the usage paragraph
    assert len(description.split()) >= 12, f"{command}: no description"
    assert "\nReads: " in out and "\nWrites: " in out
    assert f"examples:\n  hybridplan {command}" in out


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["profile", "--help"], ["plan", "--help"]])
def test_help_imports_no_torch(argv):
    """Help and argument errors come before torch is imported (seconds): tests/cli/test_errors_doc.py checks the
    errors, this the help."""
    import subprocess
    import sys

    code = ("import sys\nfrom hybridplan.cli import main\ncode = main(sys.argv[1:])\n"
            "print('torch' in sys.modules)\nsys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("False")
