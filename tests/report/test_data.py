"""The report's views (report/data.py): every input form is read into its view with its numbers kept; unknown
or malformed documents are refused."""

from __future__ import annotations

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
from tests.report.util import GIB, PLAN, VALIDATION, benchmark_views, png, write

pytest.importorskip("matplotlib")


def test_pareto_document_round_trip_and_plot(tmp_path, capsys):
    points = [ParetoPoint(2 * GIB, 1.0, "a"), ParetoPoint(GIB, 2.0, "b"), ParetoPoint(3 * GIB, 3.0, "c", frontier=False)]
    doc = pareto_document(points, title="front", marks=[ParetoPoint(1.5 * GIB, 2.5, "memory-optimal")])
    path = write(tmp_path, "front.json", doc)
    view = load_view(path)
    assert isinstance(view, ParetoView) and [p.label for p in view.frontier] == ["b", "a"]
    assert main(["report", str(path), "--png", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "2 frontier plans of 3" in out and "memory-optimal" in out and "1.0000" in out
    png(tmp_path / "f.png")


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


def test_benchmark_documents_are_read_as_their_views(tmp_path):
    """tests/report/util.py ``benchmark_documents``; their tables and plots: test_tables.py, test_plots.py."""
    views = benchmark_views(tmp_path)
    assert [type(v) for v in views] == [ComparisonView, ErrorView, SweepView, ScalingView]
    assert views[1].device_errors() == pytest.approx([0.01, -0.1, 0.0])
    assert views[1].plan_errors() == pytest.approx([0.01, 0.0])


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
