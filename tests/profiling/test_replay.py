"""A device's quantities, replayed at its position in its plan's schedule, give its measured peak exactly.

This is the claim the predictor stands on (profiling/quantities.py, profiling/schedule_memory.py), checked
on real gloo runs of plans with every stage kind, both schedules, and a model with convolutions.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.profiling.quantities import quantities_from_report
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from tests.runtime.util import make_plan

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    "model, cluster, plan",
    [
        ("gpt-tiny", "1x4", make_plan("1f1b", 32, 8, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3])])),
        ("gpt-tiny", "1x4", make_plan("gpipe", 32, 8, [(0, 3, "none", [0]), (3, 5, "none", [1]), (5, 7, "none", [2]), (7, 10, "none", [3])])),
        ("wresnet-tiny", "1x5", make_plan("1f1b", 16, 4, [(0, 2, "data", [0, 1]), (2, 5, "none", [2]), (5, 7, "tensor", [3, 4])])),
    ],
)
def test_replay_reproduces_measured_peaks(model, cluster, plan):
    result = launch(RunConfig(model=model, plan=plan, cluster=Cluster.parse(cluster), iterations=2))
    assert result.ok, result.reason
    for d in result.devices:
        q = quantities_from_report(asdict(d))
        replayed = stage_peak(q, plan.schedule, plan.num_stages - 1 - d.stage, plan.num_microbatches)
        assert replayed == d.peak_memory_bytes, (d.device, replayed, d.peak_memory_bytes)
