"""``hybridplan show`` as a user calls it: a plan, its prediction (what ``predict --json`` printed) or validation, a
time profile, to a PNG; bad input in one or two lines with exit code 2, before the drawing libraries are imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridplan.cli import main
from tests.report.test_plan_picture import PLAN
from tests.report.util import GIB, VALIDATION, png
from tests.report.util import PLAN as TWO_STAGES


@pytest.fixture(scope="module")
def inputs(mlp_files, tmp_path_factory) -> Path:
    """plan.json (2 stages, data 2 x tensor 2 then tensor 2, on 2x4), p.json (its prediction from ``predict --json``),
    t.json (the MLP's time profile), v.json (a validation of a two-stage plan) and v_plan.json (that plan)."""
    d = tmp_path_factory.mktemp("show")
    (d / "plan.json").write_text(json.dumps(PLAN))
    (d / "t.json").write_text((mlp_files / "t.json").read_text())
    (d / "v.json").write_text(json.dumps(VALIDATION))
    (d / "v_plan.json").write_text(json.dumps(TWO_STAGES))
    return d


@pytest.fixture(scope="module")
def prediction(inputs, mlp_files) -> Path:
    out = inputs / "p.json"
    code = subprocess.run([sys.executable, "-m", "hybridplan", "predict", "--db", str(mlp_files / "p.sqlite"), "--plan",
                           str(inputs / "plan.json"), "--json"], capture_output=True, text=True, check=False)
    assert code.returncode == 0, code.stderr
    out.write_text(code.stdout)
    return out


def test_a_plan_with_its_prediction_and_time_profile(inputs, prediction, tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["show", str(inputs / "plan.json"), "--prediction", str(prediction), "--cluster", "2x4",
                 "--device-memory", "20KiB", "--time-profile", str(inputs / "t.json"), "--png", str(out)]) == 0
    assert capsys.readouterr().out == f"picture written to {out}\n"
    assert len(png(out)) > 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]


def test_a_plan_alone_and_a_validation(inputs, tmp_path):
    assert main(["show", str(inputs / "plan.json"), "--png", str(tmp_path / "a.png")]) == 0
    png(tmp_path / "a.png")
    assert main(["show", str(inputs / "v_plan.json"), "--validation", str(inputs / "v.json"), "--gpu", "t4",
                 "--png", str(tmp_path / "v.png")]) == 0
    png(tmp_path / "v.png")


def test_the_validation_draws_measured_bars_and_predicted_marks(inputs):
    from hybridplan.plan import Cluster, Plan
    from hybridplan.report.device_memory import plan_memory_from
    from hybridplan.report.plan_picture import draw_plan
    from hybridplan.report.timeline import play, unit_durations

    plan = Plan.from_dict(TWO_STAGES)
    memory = plan_memory_from(VALIDATION, plan, "v.json", validation=True)
    fig = draw_plan(plan, Cluster.parse("1x2", device_memory="4GiB"), play(plan, unit_durations(plan), unit="unit",
                                                                           source="u"), memory)
    bars = fig.axes[1]
    heights = sorted((round(r.get_x() + r.get_width() / 2), r.get_height()) for c in bars.containers for r in c)
    assert heights == [(0, 2), (1, 1)]  # measured: 2 and 1 GiB
    marks = [c for c in bars.collections if c.get_label() == "predicted tensor peak"]
    assert [tuple(xy) for xy in marks[0].get_offsets()] == [(0, 3), (1, 1)]  # predicted: 3 and 1 GiB
    assert VALIDATION["devices"][0]["predicted"] == 3 * GIB


def _bad(args: list[str], folder: Path) -> tuple[int, str, bool]:
    """Run ``hybridplan show ARGS`` in a process; its exit code, stderr, and whether it imported matplotlib or torch."""
    code = ("import sys\nfrom hybridplan.cli import main\ncode = main(sys.argv[1:])\n"
            "print(any(m in sys.modules for m in ('torch', 'matplotlib')))\nsys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, "show", *args], capture_output=True, text=True, cwd=folder)
    return proc.returncode, proc.stderr, proc.stdout.strip() == "True"


@pytest.mark.parametrize("args, expect", [
    (["p.json", "--png", "a.png"], "'p.json' is not a plan: plan lacks key(s)"),
    (["plan.json", "--prediction", "plan.json", "--png", "a.png"], "--prediction plan.json is not a prediction (it is a plan)"),
    (["plan.json", "--prediction", "p4.json", "--png", "a.png"], "--prediction p4.json does not match the plan: it has 4"
                                                                 " device(s) [0, 1, 2, 3], the plan 6"),
    (["plan.json", "--validation", "v.json", "--png", "a.png"], "--validation v.json validates another plan"),
    (["plan.json", "--png", "missing/a.png"], "--png 'missing/a.png' cannot be written"),
    (["plan.json", "--cluster", "1x4", "--png", "a.png"], "device(s) [4, 5] do not exist on cluster 1x4"),
])
def test_bad_input_is_one_error_before_any_drawing(inputs, prediction, args, expect):
    data = json.loads(prediction.read_text())
    (inputs / "p4.json").write_text(json.dumps({**data, "devices": data["devices"][:4]}))
    code, err, imported = _bad(args, inputs)
    assert code == 2 and expect in err, err
    assert err.startswith("hybridplan show: error:") and len(err.splitlines()) == 2 and "Traceback" not in err
    assert not imported
    assert not (inputs / "a.png").exists()
