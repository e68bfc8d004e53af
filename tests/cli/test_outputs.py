"""Output paths (cli/outputs.py, [Note: what an output path may be]): a FIFO, a device or a directory is refused before
any work and never replaced; a symbolic link is followed and kept; a result whose write fails at the end is kept in
the temporary folder. First the helpers, then run, export and estimate-memory as a user calls them."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from hybridplan.cli import main
from hybridplan.cli.outputs import check_output, write_output
from hybridplan.errors import UsageError
from tests.cli.conftest import MLP


def _fifo(folder: Path) -> Path:
    path = folder / "pipe"
    os.mkfifo(path)
    return path


def _is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.fixture
def fallback_dir(tmp_path, monkeypatch) -> Path:
    """The temporary folder the fallback goes to, empty and of this test alone."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


# ---------------------------------------------------------------------------------------------------- the helpers
def test_a_fifo_is_refused_without_blocking_and_left_alone(tmp_path):
    fifo = _fifo(tmp_path)
    with pytest.raises(UsageError, match=r"--out '.*pipe' is a named pipe \(FIFO\), not a regular file"):
        check_output(fifo, "--out")  # opening it to write would wait for a reader: the test would hang
    assert _is_fifo(fifo) and sorted(os.listdir(tmp_path)) == ["pipe"]


def test_a_device_is_refused():
    with pytest.raises(UsageError, match="'/dev/null' is a character device"):
        check_output("/dev/null", "--out")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_to_a_fifo_is_refused(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(_fifo(tmp_path))
    with pytest.raises(UsageError, match="is a named pipe"):
        check_output(link, "--out")


def test_a_symlink_is_followed_and_kept(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "r.json"
    link.symlink_to(target)
    check_output(link, "--out")
    write_output(link, "new", "--out")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path / "real")) == ["r.json"]  # no temporary file left


def test_a_dangling_symlink_creates_its_file(tmp_path):
    link = tmp_path / "r.json"
    link.symlink_to(tmp_path / "made.json")
    check_output(link, "--out")
    assert not (tmp_path / "made.json").exists()  # the check leaves nothing
    write_output(link, "new", "--out")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "new"


def test_a_path_that_became_a_fifo_keeps_the_result_elsewhere(tmp_path, fallback_dir):
    out = tmp_path / "r.json"
    check_output(out, "--out")
    os.mkfifo(out)  # after the check, before the write
    with pytest.raises(UsageError, match=r"could not write --out '.*r.json' \(it is a named pipe \(FIFO\) now\); the"
                       " result was written to"):
        write_output(out, '{"status": "ok"}\n', "--out")
    assert _is_fifo(out)
    (kept,) = fallback_dir.iterdir()
    assert kept.read_text() == '{"status": "ok"}\n' and kept.name.endswith("r.json")


def test_an_unwritable_folder_at_the_end_keeps_the_result_elsewhere(tmp_path, fallback_dir):
    folder = tmp_path / "out"
    folder.mkdir()
    check_output(folder / "r.json", "--out")
    folder.rmdir()
    folder.write_text("a file where the folder was")
    with pytest.raises(UsageError, match="the result was written to"):
        write_output(folder / "r.json", "result", "--out")
    assert [p.read_text() for p in fallback_dir.iterdir()] == ["result"]


# ---------------------------------------------------------------------------------------------------- the commands
ONE_STAGE = {"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2,
             "stages": [{"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0]}]}
MEGATRON = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8, "stages": [
    {"layers": [0, 5], "parallelism": "data", "degree": 2, "devices": [0, 1]},
    {"layers": [5, 10], "parallelism": "data", "degree": 2, "devices": [2, 3]}]}


def _commands(folder: Path) -> dict[str, list[str]]:
    """The cheapest call of each command that reaches its ``--out`` (the MLP user model, simulated devices)."""
    (folder / "one.json").write_text(json.dumps(ONE_STAGE))
    (folder / "megatron.json").write_text(json.dumps(MEGATRON))
    return {
        "run": ["run", "--model", MLP, "--cluster", "1x1", "--plan", str(folder / "one.json"), "--backend", "sim",
                "--iterations", "2"],
        "export": ["export", "--plan", str(folder / "megatron.json"), "--to", "megatron"],
        "estimate-memory": ["estimate-memory", "--model", MLP, "--cluster", "1x1", "--plan", str(folder / "one.json")],
    }


@pytest.mark.parametrize("command", ["run", "export", "estimate-memory"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_command_refuses_an_out_that_is_no_file_before_any_work(tmp_path, capsys, command, kind):
    argv = _commands(tmp_path)[command]
    out = _fifo(tmp_path) if kind == "fifo" else tmp_path
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hybridplan {command}: error: --out '{out}' is ") and "Traceback" not in err
    assert ("named pipe" if kind == "fifo" else "directory") in err
    assert "running" not in err and "estimating" not in err  # no work started
    if kind == "fifo":
        assert _is_fifo(out)


@pytest.mark.parametrize("command", ["run", "export", "estimate-memory"])
def test_a_command_writes_through_a_symlink(tmp_path, capsys, command):
    argv = _commands(tmp_path)[command]
    target = tmp_path / "kept" / "result.txt"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "result.txt"
    link.symlink_to(target)
    assert main([*argv, "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    text = target.read_text()
    assert text != "old" and (("--pipeline-model-parallel-size 2" in text) if command == "export" else json.loads(text))
