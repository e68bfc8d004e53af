"""The lifeline (runtime/lifeline.py): a rank tied to its launcher ends, with code ``EXIT_LAUNCHER_GONE``, once the
launcher has died, whether it waits on a pidfd or polls the pid; and at once if the launcher is gone already.

Each "launcher" and "rank" here is a small child process of the test (the lifeline imports no torch); killing the
launcher leaves it an unreaped zombie until the test waits for it, as a killed launcher may stay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from hybridplan.runtime.result import EXIT_LAUNCHER_GONE
from tests.runtime.util import proc_stat

_RANK = """
import os, sys, time
if sys.argv[2] == "polling":
    del os.pidfd_open
from hybridplan.runtime.lifeline import tie_to_launcher
tie_to_launcher(int(sys.argv[1]))
print("tied", flush=True)
time.sleep(60)
"""
_MODES = pytest.mark.parametrize("mode", ["pidfd", "polling"])


def _rank(launcher_pid: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _RANK, str(launcher_pid), mode], stdout=subprocess.PIPE, text=True)


@_MODES
def test_a_rank_ends_once_its_launcher_is_killed(mode: str) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rank = _rank(launcher.pid, mode)
    try:
        assert rank.stdout.readline().strip() == "tied"  # the lifeline is set up and the launcher lives
        assert rank.poll() is None
        os.kill(launcher.pid, signal.SIGKILL)  # a zombie until launcher.wait() below
        assert rank.wait(timeout=10) == EXIT_LAUNCHER_GONE  # 4: the rank ended itself
    finally:
        for proc in (rank, launcher):
            proc.kill()
            proc.wait()


@_MODES
def test_a_rank_whose_launcher_is_already_gone_ends_at_once(mode: str) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: the pid names no process now
    rank = _rank(gone.pid, mode)
    try:
        assert rank.wait(timeout=10) == EXIT_LAUNCHER_GONE
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.distributed  # as in tests/runtime/test_orphans.py, where it was first
@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_lifeline_notices_an_exit_even_while_the_process_is_an_unreaped_zombie(
    monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    from hybridplan.runtime import lifeline

    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait = lifeline._launcher_exit_waiter(child.pid)
        done = threading.Event()
        threading.Thread(target=lambda: (wait(), done.set()), daemon=True).start()
        assert not done.wait(0.3)
        os.kill(child.pid, signal.SIGKILL)  # not reaped: a zombie until child.wait() below
        assert done.wait(3 * lifeline._POLL_S + 1.0)
        assert proc_stat(child.pid)[0] == "Z"
    finally:
        child.kill()
        child.wait()
