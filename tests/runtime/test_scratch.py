"""The temporary folders of runs (runtime/scratch.py): a folder whose owner was killed is removed by the next one of
its kind; a living owner's folder, another kind's and another naming's are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from hybridplan.runtime.scratch import remove_stale, scratch_dir


def _dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_dead_owners_folder_is_removed_by_the_next_one(tmp):
    dead = _dead_pid()
    stale = tmp / f"hybridplan-run-{dead}-abc"
    (stale / "reports").mkdir(parents=True)
    (stale / "reports" / "rank0.json").write_text("{}")
    kept = [tmp / f"hybridplan-run-{os.getpid()}-xyz",  # alive: this process
            tmp / f"hybridplan-node-{dead}-abc",  # another kind
            tmp / "hybridplan-run-k2j4h5"]  # an older version's name: no pid
    for folder in kept:
        folder.mkdir()
    with scratch_dir("run") as folder:
        assert os.path.basename(folder).startswith(f"hybridplan-run-{os.getpid()}-") and os.path.isdir(folder)
        assert not stale.exists() and all(k.exists() for k in kept)
    assert not os.path.exists(folder)
    assert remove_stale("node") == [str(tmp / f"hybridplan-node-{dead}-abc")]


def test_a_file_or_a_link_of_that_name_is_left_alone(tmp):
    dead = _dead_pid()
    (tmp / "elsewhere").mkdir()
    (tmp / f"hybridplan-run-{dead}-link").symlink_to(tmp / "elsewhere")
    (tmp / f"hybridplan-run-{dead}-file").write_text("x")
    assert remove_stale("run") == []
    assert (tmp / "elsewhere").exists() and (tmp / f"hybridplan-run-{dead}-file").exists()


def test_a_launcher_killed_with_sigkill_leaves_a_folder_that_the_next_run_removes(tmp):
    """As ``kill -9`` of ``hybridplan run`` does: the ``with`` block never ends."""
    code = ("import os, signal, sys; from hybridplan.runtime.scratch import scratch_dir\n"
            "with scratch_dir('run') as d:\n    print(d, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == -9
    left = proc.stdout.strip()
    assert os.path.isdir(left) and os.path.dirname(left) == str(tmp)
    with scratch_dir("run"):
        assert not os.path.exists(left)
