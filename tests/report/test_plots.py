"""The report's PNG plots (report/plots.py): every kind of view is drawn to a PNG file at the path asked for."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.report.data import MemoryView
from hybridplan.report.plots import render_plot
from tests.report.util import VALIDATION, benchmark_views, png

pytest.importorskip("matplotlib")


def test_benchmark_plots(tmp_path):
    """tests/report/util.py ``benchmark_documents``, as plots."""
    views = benchmark_views(tmp_path)
    for i, v in enumerate(views):
        png(render_plot(v, tmp_path / f"{i}.png"))


def test_a_memory_view_is_drawn_where_asked_and_nothing_else_is_written(tmp_path):
    out = tmp_path / "sub" / "m.png"
    out.parent.mkdir()
    assert render_plot(MemoryView.from_validation(VALIDATION), out) == out
    png(out)
    assert [p.name for p in out.parent.iterdir()] == ["m.png"]


def test_a_missing_folder_is_refused_with_the_folder_named(tmp_path):
    with pytest.raises(UsageError, match="folder .*missing.* does not exist"):
        render_plot(MemoryView.from_validation(VALIDATION), tmp_path / "missing" / "m.png")
