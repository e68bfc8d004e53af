"""Shared test setup: ``tests/`` on ``sys.path`` (so test files, and the processes they spawn, can
``import gloo``), and the ``gloo_pool`` fixture for multi-process tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from gloo import GlooPool  # noqa: E402  (needs the path above)


HEAVY_FILES: dict[str, int] = {
    "cli/test_errors_doc.py": 12,
    "cli/test_gpus.py": 11,
    "cli/test_plan_simulated.py": 49,
    "cli/test_profile.py": 24,
    "cli/test_run.py": 34,
    "models/test_gpt.py": 7,
    "models/test_hf.py": 21,
    "predict/test_data_tensor.py": 51,
    "predict/test_memory_2bw.py": 8,
    "predict/test_wider_data.py": 8,
    "predict/test_zero_stage.py": 62,
    "profiling/test_campaign.py": 48,
    "profiling/test_loss_memory.py": 6,
    "profiling/test_recomputed_spans.py": 13,
    "profiling/test_replay.py": 12,
    "profiling/test_stage_memo.py": 60,
    "runtime/test_2bw.py": 29,
    "runtime/test_composite_stages.py": 43,
    "runtime/test_engines.py": 24,
    "runtime/test_executor.py": 29,
    "runtime/test_flat_zero1.py": 15,
    "runtime/test_fused_adamw.py": 22,
    "runtime/test_grad_buffers.py": 33,
    "runtime/test_multinode.py": 17,
    "runtime/test_orphans.py": 34,
    "runtime/test_precision.py": 16,
    "runtime/test_processes.py": 57,
    "runtime/test_repeats.py": 41,
    "runtime/test_sharding.py": 102,
    "runtime/test_shared_gpu.py": 30,
    "runtime/test_selective_recompute.py": 20,
    "runtime/test_sim.py": 26,
    "runtime/test_sim_agreement.py": 25,
    "runtime/test_stage.py": 7,
    "runtime/test_vocab_parallel_loss.py": 13,
    "search/time/test_bottleneck_cuts.py": 16,
    "test_readme.py": 38,
    "workflows/test_estimate_memory.py": 26,
    "workflows/test_stage_cache.py": 24,
}
"""Test files (relative to tests/) that take 6 s or more on the 2-core machine, with their seconds in one process
(``-n 0 --durations=0``, summed per file): real multi-process runs, simulated campaigns, whole CLI commands. Every
test in them is marked ``heavy``; ``pytest -m "not slow and not heavy"`` is the quick tier (docs/testing.md). The
workers take the files longest first (:func:`pytest_collection_modifyitems`), so no long file starts near the end
of a run while the other worker idles. A new file that grows heavy belongs here."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of :data:`HEAVY_FILES` ``heavy``, and order the files longest first (heavy files by their
    seconds, then the others as collected; each file's tests keep their order).

    pytest-xdist's ``--dist loadfile`` hands each worker the next file in this order when it runs low
    (``--no-loadscope-reorder`` in pyproject.toml keeps it from reordering by number of tests): longest first
    leaves the short files to even out the two workers' ends.
    """
    root = Path(_TESTS)
    seconds: dict[pytest.Item, int] = {}
    for item in items:
        seconds[item] = HEAVY_FILES.get(item.path.relative_to(root).as_posix(), 0)
        if seconds[item]:
            item.add_marker(pytest.mark.heavy)
    items.sort(key=lambda item: -seconds[item])  # stable: the rest stay as collected


@pytest.fixture(scope="session")
def gloo_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], GlooPool]]:
    """``gloo_pool(world)``: a pool of ``world`` gloo processes shared by the session's tests.

    Spawning and importing torch costs seconds per process on this 2-core machine; a job milliseconds.
    """
    pools: dict[int, GlooPool] = {}

    def get(world: int) -> GlooPool:
        if world not in pools:
            pools[world] = GlooPool(world, tmp_path_factory.mktemp(f"gloo{world}"))
        return pools[world]

    yield get
    for pool in pools.values():
        pool.close()


@pytest.fixture(scope="session")
def mlp_files(mlp_files_and_summary: tuple[Path, Any]) -> Path:
    """``mlp_files_and_summary``'s folder (below)."""
    return mlp_files_and_summary[0]


@pytest.fixture(scope="session")
def mlp_files_and_summary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The folder below and the summary of its profiling campaign (tests/profiling/test_campaign.py checks it
    rather than running the same campaign again).

    ``p.sqlite``: a memory profile of the MLP user model (tests/cli/user_models.py) on 1x4 (pipeline and
    tensor x2; simulated devices, a few seconds); ``t.json``: a time profile whose layer 2 is slow and whose
    tensor x2 halves the Linear layers' times; ``plan.json``: tests.cli.conftest.MIXED."""
    import json

    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.profiling.layer_info import LayerInfo
    from hybridplan.profiling.time_profile import TimeProfile
    from hybridplan.profiling.timing_table import TimingTable
    from tests.cli.conftest import MIXED, MLP

    d = tmp_path_factory.mktemp("mlp")
    with ProfileStore(d / "p.sqlite") as store:
        summary = Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
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
    return d, summary


@pytest.fixture(scope="session")
def mlp_recompute_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mlp_files``' campaign again with activation checkpointing (the MLP on 1x4, pipeline and tensor x2, simulated
    devices): tests/cli/test_plan.py and tests/predict/test_recompute_per_stage.py share it."""
    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore
    from tests.cli.conftest import MLP

    path = tmp_path_factory.mktemp("mlp_recompute") / "r.sqlite"
    with ProfileStore(path) as store:
        Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
                                scenarios=(Scenario("none", 1), Scenario("tensor", 2)),
                                run_options={"backend": "sim", "activation_checkpointing": True}), store).run()
    return path


@pytest.fixture(scope="session")
def sharded_mlp_files(mlp_files: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP profiled on 1x2 with the data x2 and ZeRO-3 scenarios (``p.sqlite``) and again with activation
    checkpointing (``r.sqlite``), on simulated devices; ``mlp_files``' time profile beside them."""
    import shutil

    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.store import ProfileStore
    from tests.cli.conftest import MLP

    d = tmp_path_factory.mktemp("sharded")
    scenarios = (Scenario("none", 1), Scenario("data", 2), Scenario("data", 2, zero=3), Scenario("tensor", 2))
    for name, options in (("p", {"backend": "sim"}), ("r", {"backend": "sim", "activation_checkpointing": True})):
        with ProfileStore(d / f"{name}.sqlite") as store:
            Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x2"), global_batch_size=32, num_microbatches=2,
                                    scenarios=scenarios, run_options=options), store).run()
    shutil.copy(mlp_files / "t.json", d / "t.json")
    return d
