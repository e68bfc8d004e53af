"""``hybridplan estimate-memory`` as a user calls it, on the MLP user model (``files``: tests/cli/conftest.py)."""

from __future__ import annotations

import json

from hybridplan.cli import main
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.sim import simulate
from tests.cli.conftest import MIXED, MLP


def test_a_plan(files, capsys):
    assert main(["estimate-memory", "--model", MLP, "--cluster", "1x4", "--plan", str(files / "plan.json"), "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    reference = simulate(RunConfig(model=MLP, plan=Plan.from_dict(MIXED), cluster=Cluster.parse("1x4"), iterations=2,
                                   backend="sim"))
    assert [d["peak_memory_bytes"] for d in data["estimates"][0]["devices"]] == \
        [d.peak_memory_bytes for d in reference.devices]
    assert "simulated stage" in out.err and "fake tensors" in data["note"]


def test_the_best_plans(tmp_path, capsys):
    best = tmp_path / "best.json"
    assert main(["estimate-memory", "--model", MLP, "--cluster", "1x4", "--global-batch-size", "16",
                 "--num-microbatches", "2", "--top", "2", "--out", str(best)]) == 0
    out = capsys.readouterr().out
    assert "#1 of 5" in out and "#2 of 5" in out and "#3" not in out
    data = json.loads(best.read_text())
    assert data["estimated_peak_bytes"] > 0 and Plan.from_dict(data).num_devices == 4


def test_bad_input_exits_2(files, tmp_path, capsys):
    plan = str(files / "plan.json")
    cases = [
        (["--cluster", "1x4"], "needs --global-batch-size and --num-microbatches"),
        (["--cluster", "1x4", "--plan", plan, "--global-batch-size", "8"], "differs from the plan's 32"),
        (["--cluster", "1x4", "--plan", plan, "--top", "2"], "not allowed with argument --plan"),
        (["--cluster", "1x4", "--plan", plan, "--out", str(tmp_path / "no" / "x.json")], "cannot be written"),
        (["--cluster", "1x3", "--plan", plan], "device 3 does not exist"),
    ]
    for args, message in cases:
        assert main(["estimate-memory", "--model", MLP] + args) == 2, args
        assert message in capsys.readouterr().err, args
