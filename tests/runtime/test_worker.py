"""The process of a locally launched rank (runtime/worker.py): run as a module, it is the torchrun entry point
under its former name. Its ``spawn_entry`` runs in every real run (tests/runtime/test_processes.py and others)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.runtime.util import sim_config

REPO = Path(__file__).resolve().parents[2]


def test_the_former_module_name_still_runs_it(tmp_path):
    """``-m hybridplan.runtime.worker`` (documented before runtime/torchrun.py existed) reaches the same main."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "hybridplan.runtime.worker", "--config", str(sim_config(tmp_path)), "--out", "x.json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: python -m hybridplan.runtime.worker")
    assert "torchrun runs real devices only" in proc.stderr
