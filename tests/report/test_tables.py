"""The report's terminal tables (report/tables.py): the numbers of the view, in order, with the derived columns
computed by hand below."""

from __future__ import annotations

from hybridplan.report.data import MemoryView
from hybridplan.report.tables import render_table, share_within
from tests.report.util import VALIDATION, benchmark_views


def test_benchmark_tables(tmp_path):
    """tests/report/util.py ``benchmark_documents``, as tables."""
    views = benchmark_views(tmp_path)
    tables = [render_table(v) for v in views]
    assert "ours lower by" in tables[0] and " 50.00%" in tables[0]  # 1 - 1 GiB / 2 GiB
    assert [line.split()[-1] for line in tables[0].splitlines()[2:]] == ["yes", "no"]  # 1 and 2 GiB against 1.5
    assert "66.67%" in tables[1]  # 2 of 3 devices within 2%
    assert views[2].rank(1) == 2 and views[2].rank(0) == 3 and "1.050" in tables[2]
    assert "1.50x parameters" in tables[3]


def test_memory_table_rows_and_plan_peak():
    lines = render_table(MemoryView.from_validation(VALIDATION)).splitlines()
    assert lines[0] == "validation (run: ok)"  # the title and the run's status
    # device, stage, predicted, measured, error: (3 - 2) / 2 = +50%, (1 - 1) / 1 = 0%
    assert lines[2].split() == ["0", "0", "3.00", "GiB", "2.00", "GiB", "+50.00%"]
    assert lines[3].split() == ["1", "1", "1.00", "GiB", "1.00", "GiB", "+0.00%"]
    # the plan peaks are the devices' largest: 3 GiB predicted against 2 GiB measured
    assert lines[4] == "plan peak: predicted 3.00 GiB, measured 2.00 GiB, error +50.00%"


def test_share_within_counts_both_signs_and_the_threshold_itself():
    errors = [0.01, -0.02, 0.03, -0.5]
    assert share_within(errors, 0.02) == 0.5  # 0.01 and -0.02 (at the threshold)
    assert share_within(errors, 1.0) == 1.0
    assert share_within([], 0.02) == 0.0
