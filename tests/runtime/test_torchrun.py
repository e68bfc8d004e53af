"""The torchrun entry point (runtime/torchrun.py), short of a real multi-process run (that is
tests/cli/test_run.py ``test_torchrun_worker``): what it refuses (its former module name, runtime/worker.py:
tests/runtime/test_worker.py)."""

from __future__ import annotations

import pytest

from hybridplan.runtime.torchrun import main
from tests.runtime.util import sim_config


def test_a_simulated_run_is_refused_before_joining_a_group(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(sim_config(tmp_path)), "--out", str(tmp_path / "result.json")])
    assert exited.value.code == 2
    assert "asks for backend 'sim'; torchrun runs real devices only" in capsys.readouterr().err
