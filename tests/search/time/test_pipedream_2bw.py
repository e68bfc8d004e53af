"""The PipeDream-2BW planner (search/time/pipedream_2bw.py): its closed-form time by hand, and recomputation only
where memory asks for it."""

from __future__ import annotations

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from hybridplan.search.time.pipedream_2bw import plan_pipedream_2bw
from tests.search.time.util import TOY_CLUSTER, toy_profile


def test_pipedream_2bw_closed_form_by_hand() -> None:
    # 2 layers of (fwd 1 s, bwd 2 s) per sample, 2 devices on one node, no communication costs.
    profile = TimeProfile(
        model="two",
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=0.0, parameter_bytes=0.0) for i in range(2)),
        timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=(1.0, 1.0), backward_s=(2.0, 2.0)),),
    )
    cands = plan_pipedream_2bw(profile, Cluster.uniform(1, 2, device_type="A"), 4)
    configs = {(c.replicas, c.stages, c.micro_batch_size, c.recompute): c for c in cands}
    # w=1, d=2, b=1: m=4, period = one layer = 3 s -> 12 s; with recompute 4 s -> 16 s
    assert configs[(1, 2, 1, False)].iteration_s == pytest.approx(12.0)
    assert configs[(1, 2, 1, True)].iteration_s == pytest.approx(16.0)
    # w=2, d=1, b=2: m = 4 / (2 * 2) = 1, period = 2 samples * 2 layers * 3 s = 12 s
    assert configs[(2, 1, 2, False)].iteration_s == pytest.approx(12.0)
    assert (1, 2, 4, False) not in configs  # m = 1 < d = 2 breaks the two-version bound
    assert all(c.replicas * c.stages == 2 and c.num_microbatches >= c.stages for c in cands)
    assert cands[0].recompute is False and cands[0].samples_per_s == pytest.approx(4 / cands[0].iteration_s)


def test_pipedream_2bw_recomputes_only_when_memory_says_so() -> None:
    profile = toy_profile(params=1e6, num_layers=6)
    cands = plan_pipedream_2bw(profile, TOY_CLUSTER, 16, memory_ok=lambda plan: plan.extra["recompute"])
    assert cands and all(c.recompute and c.plan.extra["weight_versions"] == 2 for c in cands)
    for c in cands:
        c.plan.validate(num_layers=6)
