"""The front door (runtime/launch.py): ``launch`` hands a run to the backend its configuration names."""

from __future__ import annotations

import pytest

from hybridplan.plan.cluster import Cluster
import hybridplan.runtime.launch as front_door
from hybridplan.runtime.config import RunConfig
from tests.runtime.util import make_plan

PLAN = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])


@pytest.mark.parametrize("backend", ["real", "sim"])
def test_launch_picks_the_backend_of_the_configuration(monkeypatch, backend):
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(front_door, "run_processes", lambda cfg, **kw: calls.append(("real", kw)) or "processes")
    monkeypatch.setattr(front_door, "simulate", lambda cfg, **kw: calls.append(("sim", kw)) or "simulated")
    cfg = RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x2"), backend=backend)
    say, started = print, list.append
    got = front_door.launch(cfg, on_event=say, on_start=started)
    if backend == "real":
        assert got == "processes" and calls == [("real", {"on_event": say, "on_start": started})]
    else:  # simulated devices start no process: nothing to tell on_start
        assert got == "simulated" and calls == [("sim", {"on_event": say})]
