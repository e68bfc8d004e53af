"""Files the CLI tests share: a memory profile (simulated devices) and a time profile of the MLP user model."""

from __future__ import annotations

import json

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.time_profile import LayerInfo, TimeProfile, TimingTable
from hybridplan.profiling.campaign import Campaign, CampaignConfig
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import ProfileStore

MLP = "tests.cli.user_models:mlp"  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)
MIXED = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 2, "stages": [
    {"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
    {"layers": [2, 3], "parallelism": "none", "degree": 1, "devices": [2]},
    {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]}


@pytest.fixture(scope="session")
def mlp_files(tmp_path_factory):
    """``p.sqlite``: a memory profile of the MLP on 1x4 (pipeline and tensor x2; simulated devices); ``t.json``: a
    time profile whose layer 2 is slow and whose tensor x2 halves the Linear layers' times; ``plan.json``: MIXED."""
    d = tmp_path_factory.mktemp("mlp")
    with ProfileStore(d / "p.sqlite") as store:
        Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
                                scenarios=(Scenario("none", 1), Scenario("tensor", 2)), run_options={"backend": "sim"}),
                 store).run()
    fwd = (1e-3, 1e-4, 4e-3, 1e-4, 1e-3)
    profile = TimeProfile(
        model=MLP,
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=128.0, parameter_bytes=4096.0) for i in range(5)),
        timings=tuple(
            TimingTable(device_type="cpu", tensor_degree=t, micro_batch_size=16,
                        forward_s=tuple(f / t for f in fwd), backward_s=tuple(2 * f / t for f in fwd))
            for t in (1, 2)
        ),
        tensor_comm_in_times=True,
        source="synthetic",
    )
    profile.save(d / "t.json")
    (d / "plan.json").write_text(json.dumps(MIXED))
    return d
