"""``hybridplan report``: the table shows the input's numbers, the PNG is written, bad input is refused."""

from __future__ import annotations

import pytest

from hybridplan.cli import main
from tests.report.util import PLAN, VALIDATION, png, write

pytest.importorskip("matplotlib")


def test_validation_table_and_png(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "val.json", VALIDATION)
    assert main(["report", str(path), "--device-memory", "4GiB"]) == 0
    out = capsys.readouterr().out
    assert "3.00 GiB" in out and "2.00 GiB" in out and "+50.00%" in out and "+0.00%" in out
    assert "capacity 4.00 GiB" in out
    png(tmp_path / "val.png")


def test_run_result_is_measured_only(tmp_path, capsys):
    run = {"status": "oom", "reason": "x", "iteration_seconds": None, "losses": [], "plan": PLAN,
           "devices": [{"device": 1, "stage": 1, "peak_memory_bytes": 5 * 2**20}, {"device": 0, "stage": 0, "peak_memory_bytes": 7 * 2**20}]}
    out_png = tmp_path / "out" / "run.png"
    out_png.parent.mkdir()
    assert main(["report", str(write(tmp_path, "run.json", run)), "--png", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "(run: oom)" in out and "7.00 MiB" in out and out.index("7.00 MiB") < out.index("5.00 MiB")  # device order
    png(out_png)


def test_prediction_from_plan_and_profile(tmp_path, capsys, profile_db):
    plan = write(tmp_path, "plan.json", PLAN)
    assert main(["report", "--plan", str(plan), "--db", str(profile_db), "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    from hybridplan.plan import Plan
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.units import format_bytes

    predicted = MemoryPredictor.from_db(profile_db, schedule="gpipe", global_batch_size=8, num_microbatches=2).predict(
        Plan.from_dict(PLAN))
    for d in predicted.devices:
        assert format_bytes(d.peak_memory_bytes) in out
    png(tmp_path / "p.png")


@pytest.mark.parametrize("argv, message", [
    ([], "either an input file or --plan"),
    (["--plan", "p.json"], "--plan needs --db"),
    (["x.json", "--pareto"], "--pareto needs --db and --cluster"),
    (["missing.json"], "cannot read"),
])
def test_bad_invocations(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["report", *argv]) == 2
    assert message in capsys.readouterr().err


def test_pareto_front_of_a_profile_with_the_plan_marked(tmp_path, capsys, profile_db):
    from hybridplan.profiling.layer_costs import flop_time_profile, measure_layer_costs
    from hybridplan.models.zoo import get_model

    model = get_model("tests.cli.user_models:mlp")
    profile = flop_time_profile(model, measure_layer_costs(model), precision="fp32", device_type="cpu", peak_flops=1e9)
    profile.save(tmp_path / "times.json")
    plan = write(tmp_path, "plan.json", PLAN)
    argv = ["report", "--plan", str(plan), "--db", str(profile_db), "--cluster", "1x2", "--pareto",
            "--time-profile", str(tmp_path / "times.json"), "--png", str(tmp_path / "m.png")]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "frontier plans of" in out.out and "plan" in out.out.splitlines()[-2]  # the marked plan, last row
    png(tmp_path / "m.png")
    png(tmp_path / "m-pareto.png")
