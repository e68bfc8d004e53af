"""``hybridplan predict`` as a user calls it: the predictor's numbers for the plan, at the plan's own schedule and
batch (``files``: the MLP's profile and the MIXED plan, tests/cli/conftest.py)."""

from __future__ import annotations

import json

from hybridplan.cli import main
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.units import format_bytes
from tests.cli.conftest import MIXED


def _predicted(files, plan: dict, method: str = "quantities"):
    p = Plan.from_dict(plan)
    return MemoryPredictor.from_db(files / "p.sqlite", schedule=p.schedule, global_batch_size=p.global_batch_size,
                                   num_microbatches=p.num_microbatches, method=method).predict(p)


def test_the_json_is_the_predictors_prediction(files, capsys):
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == _predicted(files, MIXED).to_dict()


def test_the_table_lists_every_device_and_the_plan_peak(files, capsys):
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json")]) == 0
    out = capsys.readouterr().out
    expected = _predicted(files, MIXED)
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(d.device, d.stage) for d in expected.devices]
    assert out.rstrip().endswith(f"plan peak: {format_bytes(expected.peak_memory_bytes)}")


def test_the_plans_batch_and_schedule_are_the_targets(files, tmp_path, capsys):
    plan = {**MIXED, "schedule": "gpipe", "global_batch_size": 64, "num_microbatches": 4}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(tmp_path / "p.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == _predicted(files, plan).to_dict() and got != _predicted(files, MIXED).to_dict()
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(tmp_path / "p.json"), "--json",
                 "--method", "capture"]) == 0
    assert json.loads(capsys.readouterr().out) == _predicted(files, plan, "capture").to_dict()
