"""A stage's eight memory quantities (profiling/quantities.py) from its per-action timeline, derived by hand."""

from __future__ import annotations

import pytest

from hybridplan.errors import ProfileError
from hybridplan.profiling.quantities import QUANTITIES, quantities_from_report, quantities_from_timeline


def test_quantities_from_timeline():
    timeline = [
        {"action": "F0", "before": 100, "peak": 180, "after": 150},
        {"action": "F1", "before": 150, "peak": 230, "after": 200},
        {"action": "B0", "before": 200, "peak": 260, "after": 190},
        {"action": "B1", "before": 190, "peak": 220, "after": 140},
        {"action": "step", "before": 130, "peak": 175, "after": 130},
    ]
    q = dict(zip(QUANTITIES, quantities_from_timeline(90, 10, timeline)))
    assert q == {"static": 90, "data": 10, "activation": 50, "gradient": 40, "forward_transient": 80,
                 "first_backward_transient": 60, "backward_transient": 30, "step_transient": 45}
    with pytest.raises(Exception, match="forward, backward and step"):
        quantities_from_timeline(0, 0, timeline[:2])


def test_one_forward_and_one_backward_suffice():
    """One micro-batch: the later-backward transient falls back to the first backward's."""
    timeline = [
        {"action": "F0", "before": 10, "peak": 25, "after": 20},
        {"action": "B0", "before": 20, "peak": 50, "after": 15},
        {"action": "step", "before": 15, "peak": 18, "after": 15},
    ]
    q = dict(zip(QUANTITIES, quantities_from_timeline(10, 0, timeline)))
    # activation F0: 20 - 10; gradient: (15 - 20) + 10; transients: 25 - 10, 50 - 20 (twice), 18 - 15
    assert q == {"static": 10, "data": 0, "activation": 10, "gradient": 5, "forward_transient": 15,
                 "first_backward_transient": 30, "backward_transient": 30, "step_transient": 3}


def test_a_device_report_gives_the_same_vector_as_its_timeline():
    timeline = [{"action": "F0", "before": 5, "peak": 9, "after": 7}, {"action": "B0", "before": 7, "peak": 8, "after": 6},
                {"action": "step", "before": 6, "peak": 6, "after": 6}]
    report = {"static_memory_bytes": 4, "data_bytes": 1, "timeline": timeline, "peak_memory_bytes": 9}
    assert list(quantities_from_report(report)) == list(quantities_from_timeline(4, 1, timeline))


@pytest.mark.parametrize("missing", ["static_memory_bytes", "data_bytes", "timeline"])
def test_a_device_report_without_memory_tracking_is_refused(missing):
    report = {"static_memory_bytes": 4, "data_bytes": 1, "timeline": [{"action": "F0", "before": 0, "peak": 0, "after": 0}]}
    del report[missing]
    with pytest.raises(ProfileError, match="without memory tracking"):
        quantities_from_report(report)
