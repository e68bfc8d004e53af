"""Killing the launcher ends every process it started: ranks, forkserver, resource tracker (issue 9).

Each test starts a real command, waits until its ranks exist, records every descendant of the
launcher (found through the parent pids in /proc), kills the launcher and checks that every recorded
process is gone within ``_GONE_WITHIN_S``. A zombie counts as gone: the container's pid 1 may never
reap the orphans it inherits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.paths import GPT_PLAN as PLAN
from tests.runtime.util import Process, cmdline as _cmdline, descendants as _descendants, proc_stat, running as _running

pytestmark = pytest.mark.distributed

_REPO = Path(__file__).resolve().parents[2]
_GONE_WITHIN_S = 10.0
_START_WITHIN_S = 60.0


def _grandchildren(root: int) -> list[Process]:
    children = {pid for pid, _ in _descendants(root) if (st := proc_stat(pid)) is not None and st[1] == root}
    return [p for p in _descendants(root) if (st := proc_stat(p[0])) is not None and st[1] in children]


def _interruptible() -> None:
    """In the child before exec: SIGINT back to its default, so that Python turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_launcher(cmd: list[str], sig: signal.Signals, ranks: int, tmp_path: Path, *, settle_s: float) -> float:
    """Start ``cmd``, wait for ``ranks`` ranks, send ``sig`` to the launcher; return the seconds until
    every process it had started is gone (fails the test if some outlive ``_GONE_WITHIN_S``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "launcher.log"
    seen: set[Process] = set()
    with log.open("w") as out:
        # as from a terminal: a command started in the background of a non-interactive shell (a CI script's
        # `&`, nohup) inherits SIGINT ignored, and then neither Python nor the launcher ever sees the signal
        launcher = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                                    preexec_fn=_interruptible)
    try:
        deadline = time.monotonic() + _START_WITHIN_S
        while len(_grandchildren(launcher.pid)) < ranks:  # ranks are children of the forkserver
            assert launcher.poll() is None, f"launcher ended before its ranks started:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no {ranks} ranks after {_START_WITHIN_S} s:\n{log.read_text()}"
            time.sleep(0.1)
        time.sleep(settle_s)
        seen.update(_descendants(launcher.pid))
        assert len(seen) >= ranks + 1, seen  # the ranks and the forkserver at least
        launcher.send_signal(sig)
        killed = time.monotonic()
        launcher.wait(timeout=_GONE_WITHIN_S)
        while (left := [p for p in seen if _running(p)]) and time.monotonic() - killed < _GONE_WITHIN_S:
            time.sleep(0.05)
        elapsed = time.monotonic() - killed
        assert not left, (
            f"{len(left)} of {len(seen)} processes outlived the launcher by {elapsed:.1f} s: "
            f"{[(pid, _cmdline(pid)) for pid, _ in left]}"
        )
        return elapsed
    finally:  # leave nothing behind, even when the test failed
        if launcher.poll() is None:
            seen.update(_descendants(launcher.pid))
            launcher.kill()
            launcher.wait()
        for proc in seen:
            if _running(proc):
                try:
                    os.kill(proc[0], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _run_command(tmp_path: Path) -> list[str]:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    return [sys.executable, "-m", "hybridplan", "run", "--model", "gpt-tiny", "--cluster", "1x4",
            "--plan", str(plan), "--iterations", "100000"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_ranks_and_forkserver_die_with_a_killed_run(tmp_path: Path, sig: signal.Signals) -> None:
    elapsed = _kill_launcher(_run_command(tmp_path), sig, 4, tmp_path, settle_s=2.0)
    print(f"run, {sig.name}: every process gone {elapsed:.2f} s after the signal")


@pytest.mark.parametrize("model", ["gpt-tiny", "tests.runtime.faulty_models:hanging_gpt"], ids=["gpt-tiny", "hanging"])
def test_ranks_die_with_a_profiling_campaign_killed_during_its_first_run(tmp_path: Path, model: str) -> None:
    """gpt-tiny's first profiling run ends by itself ~2 s after the kill, which hid orphans; the hanging
    model's would not end."""
    cmd = [sys.executable, "-m", "hybridplan", "profile", "--model", model, "--cluster", "1x2",
           "--global-batch-size", "16", "--num-microbatches", "2", "--db", str(tmp_path / "p.sqlite")]
    elapsed = _kill_launcher(cmd, signal.SIGKILL, 2, tmp_path, settle_s=0.5)
    print(f"profile {model}, SIGKILL: every process gone {elapsed:.2f} s after the signal")
