"""``hybridplan report``: the table shows the input's numbers, the PNG is written, bad input is refused."""

from __future__ import annotations

import json

import pytest

from hybridplan.cli import main
from hybridplan.errors import UsageError
from hybridplan.report.data import (
    ComparisonView,
    ErrorView,
    MemoryView,
    ParetoView,
    ScalingView,
    SweepView,
    load_view,
    pareto_document,
    ParetoPoint,
)
from hybridplan.report.tables import render_table

pytest.importorskip("matplotlib")

GIB = 2**30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLAN = {"schedule": "gpipe", "global_batch_size": 8, "num_microbatches": 2, "stages": [
    {"layers": [0, 2], "parallelism": "none", "degree": 1, "devices": [0]},
    {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [1]}]}
VALIDATION = {"plan": PLAN, "status": "ok", "reason": None, "devices": [
    {"device": 0, "stage": 0, "predicted": 3 * GIB, "measured": 2 * GIB, "relative_error": 0.5},
    {"device": 1, "stage": 1, "predicted": GIB, "measured": GIB, "relative_error": 0.0}],
    "max_abs_relative_error": 0.5, "predicted_peak_bytes": 3 * GIB, "measured_peak_bytes": 2 * GIB}


def _png(path) -> bytes:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000
    return data


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_validation_table_and_png(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "val.json", VALIDATION)
    assert main(["report", str(path), "--device-memory", "4GiB"]) == 0
    out = capsys.readouterr().out
    assert "3.00 GiB" in out and "2.00 GiB" in out and "+50.00%" in out and "+0.00%" in out
    assert "capacity 4.00 GiB" in out
    _png(tmp_path / "val.png")


def test_run_result_is_measured_only(tmp_path, capsys):
    run = {"status": "oom", "reason": "x", "iteration_seconds": None, "losses": [], "plan": PLAN,
           "devices": [{"device": 1, "stage": 1, "peak_memory_bytes": 5 * 2**20}, {"device": 0, "stage": 0, "peak_memory_bytes": 7 * 2**20}]}
    png = tmp_path / "out" / "run.png"
    png.parent.mkdir()
    assert main(["report", str(write(tmp_path, "run.json", run)), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "(run: oom)" in out and "7.00 MiB" in out and out.index("7.00 MiB") < out.index("5.00 MiB")  # device order
    _png(png)


def test_pareto_document_round_trip_and_plot(tmp_path, capsys):
    points = [ParetoPoint(2 * GIB, 1.0, "a"), ParetoPoint(GIB, 2.0, "b"), ParetoPoint(3 * GIB, 3.0, "c", frontier=False)]
    doc = pareto_document(points, title="front", marks=[ParetoPoint(1.5 * GIB, 2.5, "memory-optimal")])
    path = write(tmp_path, "front.json", doc)
    view = load_view(path)
    assert isinstance(view, ParetoView) and [p.label for p in view.frontier] == ["b", "a"]
    assert main(["report", str(path), "--png", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "2 frontier plans of 3" in out and "memory-optimal" in out and "1.0000" in out
    _png(tmp_path / "f.png")


def test_plan_objective_pareto_output_is_read(tmp_path):
    """The form 'hybridplan plan --objective pareto --out' writes."""
    doc = {"objective": "pareto", "model": "gpt-tiny", "cluster": "1x4", "frontier": [
        {"label": "a", "predicted_peak_bytes": 100, "predicted_iteration_s": 2.0, "samples_per_s": 4.0, "plan": PLAN},
        {"label": "b", "predicted_peak_bytes": 200, "predicted_iteration_s": 1.0, "samples_per_s": 8.0, "plan": PLAN}]}
    view = load_view(write(tmp_path, "p.json", doc))
    assert view.title == "gpt-tiny 1x4" and [(p.label, p.peak_memory_bytes, p.iteration_s) for p in view.frontier] == [
        ("a", 100.0, 2.0), ("b", 200.0, 1.0)]


def test_bare_candidate_list_gets_its_frontier_computed(tmp_path):
    items = [{"peak_memory_bytes": 1, "iteration_s": 5}, {"peak_memory_bytes": 2, "predicted": {"total_s": 1}},
             {"peak_memory_bytes": 3, "iteration_s": 4}]
    view = load_view(write(tmp_path, "c.json", {"candidates": items}))
    assert [p.frontier for p in view.points] == [True, True, False]


def test_benchmark_views(tmp_path):
    dev = lambda d, p, m: {"device": d, "stage": d, "predicted": p, "measured": m}  # noqa: E731
    comparison = {"format": "hybridplan.memory_comparison", "title": "t", "groups": [
        {"title": "g", "capacity_bytes": 1.5 * GIB, "plans": [{"name": "ours", "devices": [dev(0, GIB, GIB), dev(1, GIB, GIB)]},
                                 {"name": "equal", "devices": [dev(0, GIB, 2 * GIB), dev(1, GIB, GIB // 2)]}]}]}
    errors = {"format": "hybridplan.prediction_errors", "title": "e", "plans": [
        {"devices": [dev(0, 101, 100), dev(1, 90, 100)]}, {"devices": [dev(0, 100, 100)]}]}
    sweep = {"format": "hybridplan.plan_sweep", "title": "s", "picks": {"ours": 1, "other": 0}, "plans": [
        {"label": "p0", "predicted_peak_bytes": 3, "measured_peak_bytes": 30}, {"label": "p1", "predicted_peak_bytes": 2,
         "measured_peak_bytes": 21}, {"label": "p2", "predicted_peak_bytes": 1, "measured_peak_bytes": 20},
        {"label": "p3", "predicted_peak_bytes": 1, "measured_peak_bytes": None}]}
    scaling = {"format": "hybridplan.scaling", "title": "l", "capacity_bytes": GIB, "width_name": "channels", "series": [
        {"name": "ours", "points": [{"width": 1, "parameters": 300, "peak_memory_bytes": 10, "fits": True},
                                    {"width": 2, "parameters": 600, "peak_memory_bytes": None, "fits": False}]},
        {"name": "time", "points": [{"width": 1, "parameters": 200, "peak_memory_bytes": 10, "fits": True}]}]}
    views = [load_view(write(tmp_path, f"{i}.json", d)) for i, d in enumerate((comparison, errors, sweep, scaling))]
    assert [type(v) for v in views] == [ComparisonView, ErrorView, SweepView, ScalingView]
    tables = [render_table(v) for v in views]
    assert "ours lower by" in tables[0] and " 50.00%" in tables[0]  # 1 - 1 GiB / 2 GiB
    assert [line.split()[-1] for line in tables[0].splitlines()[2:]] == ["yes", "no"]  # 1 and 2 GiB against 1.5
    assert views[1].device_errors() == pytest.approx([0.01, -0.1, 0.0])
    assert views[1].plan_errors() == pytest.approx([0.01, 0.0])
    assert "66.67%" in tables[1]  # 2 of 3 devices within 2%
    assert views[2].rank(1) == 2 and views[2].rank(0) == 3 and "1.050" in tables[2]
    assert "1.50x parameters" in tables[3]
    from hybridplan.report.plots import render_plot

    for i, v in enumerate(views):
        _png(render_plot(v, tmp_path / f"{i}.png"))


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
    _png(tmp_path / "p.png")


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


def test_unknown_documents_are_refused(tmp_path):
    with pytest.raises(UsageError, match="not a file 'hybridplan report' knows"):
        load_view(write(tmp_path, "x.json", {"hello": 1}))
    with pytest.raises(UsageError, match="malformed hybridplan.scaling"):
        load_view(write(tmp_path, "y.json", {"format": "hybridplan.scaling", "series": [{"points": []}]}))
    (tmp_path / "z.json").write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        load_view(tmp_path / "z.json")


def test_memory_view_from_validation_keeps_values():
    view = MemoryView.from_validation(VALIDATION)
    assert [(d.predicted, d.measured) for d in view.devices] == [(3 * GIB, 2 * GIB), (GIB, GIB)]
    assert view.peak("predicted") == 3 * GIB and view.peak("measured") == 2 * GIB


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
    _png(tmp_path / "m.png")
    _png(tmp_path / "m-pareto.png")
