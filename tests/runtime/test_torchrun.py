"""The torchrun entry point (runtime/torchrun.py), short of a real multi-process run (that is
tests/cli/test_run_cli.py ``test_torchrun_worker``): what it refuses, and that its former module name runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig, config_to_json
from hybridplan.runtime.torchrun import main
from tests.runtime.util import make_plan

REPO = Path(__file__).resolve().parents[2]
PLAN = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])


def _sim_config(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(config_to_json(RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x2"), backend="sim")))
    return path


def test_a_simulated_run_is_refused_before_joining_a_group(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(_sim_config(tmp_path)), "--out", str(tmp_path / "result.json")])
    assert exited.value.code == 2
    assert "asks for backend 'sim'; torchrun runs real devices only" in capsys.readouterr().err


def test_the_former_module_name_still_runs_it(tmp_path):
    """``-m hybridplan.runtime.worker`` (documented before runtime/torchrun.py existed) reaches the same main."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "hybridplan.runtime.worker", "--config", str(_sim_config(tmp_path)), "--out", "x.json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: python -m hybridplan.runtime.worker")
    assert "torchrun runs real devices only" in proc.stderr
