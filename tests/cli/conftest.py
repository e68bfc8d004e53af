"""The MLP user model the CLI tests name, and a plan of it (the ``mlp_files`` fixture is in tests/conftest.py);
``files``, the name the CLI tests give ``mlp_files``; and ``profile_db``, a small profile of the MLP for
``hybridplan report`` (tests/cli/test_report.py)."""

from __future__ import annotations

import pytest

MLP = "tests.cli.user_models:mlp"  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)
MIXED = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 2, "stages": [
    {"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
    {"layers": [2, 3], "parallelism": "none", "degree": 1, "devices": [2]},
    {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]}


@pytest.fixture
def files(mlp_files):
    """The MLP's memory and time profiles and the MIXED plan (tests/conftest.py)."""
    return mlp_files


@pytest.fixture(scope="session")
def profile_db(tmp_path_factory):
    """A small profile database (pipeline scenario of the 5-layer MLP on 2 simulated devices), built once."""
    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore

    db = tmp_path_factory.mktemp("profile") / "mlp.sqlite"
    cfg = CampaignConfig(model="tests.cli.user_models:mlp", cluster=Cluster.parse("1x2"), global_batch_size=8,
                         num_microbatches=2, schedule="gpipe", scenarios=(Scenario("none", 1),),
                         run_options={"backend": "sim"})
    with ProfileStore(db) as store:
        Campaign(cfg, store).run()
    return db
