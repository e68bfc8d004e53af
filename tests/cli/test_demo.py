"""``hybridplan demo``: a first answer from simulated uniform plans, then profile, plan and validate in one command,
here the MLP on two simulated devices (a few seconds); the files it writes, and a second call that resumes the
profile."""

from __future__ import annotations

import json

from hybridplan.cli import main
from hybridplan.plan import Cluster, Plan
from tests.cli.conftest import MLP


def test_the_whole_loop_answers_first_writes_its_four_files_and_resumes(tmp_path, capsys):
    args = ["demo", "--dir", str(tmp_path / "d"), "--model", MLP, "--backend", "sim", "--cluster", "1x2"]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["estimate.json", "plan.json", "profile.sqlite",
                                                                  "validation.json"]
    first = json.loads((tmp_path / "d" / "estimate.json").read_text())
    Plan.from_dict(first["plan"]).validate(num_layers=5, cluster=Cluster.parse("1x2"))
    assert first["peak_memory_bytes"] == max(d["peak_memory_bytes"] for d in first["devices"]) > 0
    plan = Plan.load(tmp_path / "d" / "plan.json")
    plan.validate(num_layers=5, cluster=Cluster.parse("1x2"))
    validation = json.loads((tmp_path / "d" / "validation.json").read_text())
    assert validation["status"] == "ok" and validation["plan"] == plan.to_dict()
    assert "run: ok" in printed.out and "1/4 a first answer" in printed.err and "4/4 running" in printed.err
    # the first answer is printed before any profiling run starts
    assert printed.err.index("first answer after") < printed.err.index("2/4 profiling")
    assert main(args) == 0
    assert " 0 runs (" in capsys.readouterr().err  # every profiling run resumed from the database


def test_a_dir_that_cannot_be_made_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    assert main(["demo", "--dir", str(tmp_path / "f" / "d")]) == 2
    assert "cannot be made" in capsys.readouterr().err
