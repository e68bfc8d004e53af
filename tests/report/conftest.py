"""A small profile database (pipeline scenario of a 5-layer MLP on 2 simulated devices), built once."""

from __future__ import annotations

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.campaign import Campaign, CampaignConfig
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import ProfileStore


@pytest.fixture(scope="session")
def profile_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("profile") / "mlp.sqlite"
    cfg = CampaignConfig(model="tests.cli.user_models:mlp", cluster=Cluster.parse("1x2"), global_batch_size=8,
                         num_microbatches=2, schedule="gpipe", scenarios=(Scenario("none", 1),),
                         run_options={"backend": "sim"})
    with ProfileStore(db) as store:
        Campaign(cfg, store).run()
    return db
