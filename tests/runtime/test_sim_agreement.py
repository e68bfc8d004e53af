"""Simulated devices measure what the real CPU runtime measures, to the byte.

The simulator runs the real runtime's code on fake tensors (runtime/sim.py), so each device's peaks,
static and data bytes, peak breakdown and per-action timeline equal a real gloo run's: the plans below
cover the three stage kinds, both schedules, three model families, mixed precision and activation
checkpointing, and the simulator simulates one device per stage and copies it to the others (the
comparison with the real devices checks that argument too).

Differences found while building it, and fixed at their cause rather than tolerated:
- a real tensor-parallel stage counted gloo's persistent scratch buffer (16 KiB for gpt-tiny) from
  its first collective on: hybridplan/collectives.py now fills and reads it with the trackers off;
- a stage output was never released under fake tensors (a fake storage's data pointer is 0, so every
  storage looked shared): runtime/release.py compares storages by identity.
"""

from __future__ import annotations

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from tests.runtime.util import make_plan

pytestmark = pytest.mark.distributed

AGREEMENT = 0.01
"""The issue's criterion: simulated per-device peaks within 1% of the real runtime's."""

PLANS = [
    pytest.param(
        "gpt-tiny",
        make_plan("1f1b", 16, 4, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3, 4])]),
        "1x5",
        {},
        id="gpt-1f1b-tensor-none-data",
    ),
    pytest.param(
        "wresnet-tiny",
        make_plan("gpipe", 16, 4, [(0, 2, "data", [0, 1]), (2, 5, "none", [2]), (5, 7, "tensor", [3, 4])]),
        "1x5",
        {},
        id="wresnet-gpipe-data-none-tensor",
    ),
    pytest.param(
        "moe-tiny",
        make_plan("1f1b", 16, 4, [(0, 3, "data", [0, 1]), (3, 6, "tensor", [2, 3])]),
        "1x4",
        {"precision": "bf16", "activation_checkpointing": True},
        id="moe-1f1b-data-tensor-bf16-checkpointing",
    ),
]


@pytest.mark.parametrize("model, plan, cluster, options", PLANS)
def test_simulated_devices_measure_what_real_ones_do(model, plan, cluster, options):
    def run(backend: str):
        cfg = RunConfig(model=model, plan=plan, cluster=Cluster.parse(cluster), iterations=2, backend=backend, **options)
        result = launch(cfg)
        assert result.ok, result.reason
        return result

    real, sim = run("real"), run("sim")
    assert sim.iteration_seconds is None and sim.losses == [] and len(real.losses) == 2
    assert [(d.device, d.stage, d.rank_in_stage) for d in sim.devices] == [
        (d.device, d.stage, d.rank_in_stage) for d in real.devices
    ]
    for s, r in zip(sim.devices, real.devices):
        assert abs(s.peak_memory_bytes - r.peak_memory_bytes) <= AGREEMENT * r.peak_memory_bytes
        # ... and in fact identical, everywhere:
        assert s.iteration_peaks == r.iteration_peaks, s.device
        assert (s.static_memory_bytes, s.data_bytes, s.in_flight) == (r.static_memory_bytes, r.data_bytes, r.in_flight)
        assert s.peak_breakdown == r.peak_breakdown, s.device
        assert s.timeline == r.timeline, s.device
