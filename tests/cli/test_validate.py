"""``hybridplan validate`` as a user calls it, on the MLP's profile (simulated devices: the run is simulated too)
and the MIXED plan of ``files`` (tests/cli/conftest.py)."""

from __future__ import annotations

import json

from hybridplan.cli import main
from tests.cli.conftest import MLP


def test_the_json_printed_is_the_json_written(files, tmp_path, capsys):
    out = tmp_path / "v.json"
    args = ["validate", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--model", MLP]
    assert main(args + ["--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["status"] == "ok" and [d["device"] for d in printed["devices"]] == [0, 1, 2, 3]
    assert all(d["predicted"] > 0 and d["measured"] > 0 for d in printed["devices"])


def test_the_table_names_the_run_and_every_device(files, capsys):
    assert main(["validate", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--model", MLP]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "run: ok" in lines and lines[-1].startswith("largest per-device error")
    assert [line.split()[0] for line in lines if line.split() and line.split()[0].isdigit()] == ["0", "1", "2", "3"]


def test_a_capacity_needs_the_cluster_it_applies_to(files, capsys):
    assert main(["validate", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--model", MLP,
                 "--device-memory", "40GiB"]) == 2
    assert "no --cluster was given" in capsys.readouterr().err
