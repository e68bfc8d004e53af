"""The profiling campaign end to end, on simulated devices (byte-identical to the real CPU runtime,
tests/runtime/test_sim_agreement.py), with one real run to check a prediction."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError, ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.campaign import Campaign, CampaignConfig
from hybridplan.profiling.statistics import load_statistics
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.store import ProfileStore

MLP = "tests.cli.user_models:mlp"  # 5 layers: Linear, ReLU, Linear, ReLU, Linear


def config(**kw):
    base = dict(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
                scenarios=(Scenario("none", 1), Scenario("tensor", 2)), run_options={"backend": "sim"})
    base.update(kw)
    return CampaignConfig(**base)


def campaign(db, progress=None, **kw):
    store = ProfileStore(db)
    return store, Campaign(config(**kw), store, progress=progress)


def test_statistics_cover_every_layer_and_are_stored(tmp_path, mlp_files_and_summary):
    """The campaign of ``config()``: the session's ``mlp_files`` ran exactly it (tests/conftest.py, identity
    asserted below); its store copied and its summary checked rather than the campaign run again."""
    files, summary = mlp_files_and_summary
    shutil.copy(files / "p.sqlite", tmp_path / "p.sqlite")
    store, _ = campaign(tmp_path / "p.sqlite")  # refuses a database of another campaign: the same configuration
    assert summary.runs_executed == summary.runs_total > 0 and not summary.unmeasured
    stats = load_statistics(store)
    assert set(stats) == {("none", 1), ("tensor", 2)}
    for sizes in stats.values():
        assert sorted(s.microbatch_size for s in sizes) == [4, 8]  # B/4 and B/2 over 2 micro-batches
        for s in sizes:
            assert not np.isnan(s.mi[:, :8]).any() and not np.isnan(s.ma[1:, :8]).any()
            assert s.inconsistency == 0  # a span measured twice gave the same quantities
    rows = store.statistics_rows()
    assert ("pipeline", 8, 0, "M_i", "static", stats[("none", 1)][0].mi[0, 0]) in rows
    # the loss's backward alone ([Note: the loss's backward floor]): cross-entropy over the MLP's 10 classes holds
    # twice its float32 logits, 80 bytes a sample
    assert store.get_meta("loss_backward_transient") == {"samples": [1, 2], "bytes": [80, 160]}
    store.close()


def test_prediction_matches_a_real_run(tmp_path):
    """Profiled on simulated devices, predicted, then run for real: the same bytes on every device.

    Predicted at a profiled batch size with every span of the plan profiled (neighbors=1 measures all
    pairs of adjacent layers), so that the check covers profiling, statistics and the schedule replay
    without the approximations whose accuracy benchmarks/capture_accuracy measures: extrapolation in
    batch size and the composition of transients (maxima over time, not sums) from M_i and M_a.
    """
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    store, c = campaign(tmp_path / "p.sqlite", batch_sizes=(32, 16), neighbors=1)
    c.run()
    store.close()
    plan = Plan("gpipe", 32, 2, (StagePlan(0, 2, "tensor", 2, (0, 1)), StagePlan(2, 3, "none", 1, (2,)),
                                 StagePlan(3, 5, "none", 1, (3,))))
    predicted = MemoryPredictor.from_db(tmp_path / "p.sqlite", schedule="gpipe").predict(plan)
    measured = launch(RunConfig(model=MLP, plan=plan, cluster=Cluster.parse("1x4"), iterations=2))
    assert measured.ok, measured.reason
    assert [p.peak_memory_bytes for p in predicted.devices] == [m.peak_memory_bytes for m in measured.devices]


def test_resume_after_interruption(tmp_path, mlp_files):
    """Interrupted after 5 runs, then resumed: the statistics equal those of an uninterrupted campaign of the same
    configuration, the session's ``mlp_files`` (tests/conftest.py runs exactly ``config()``; copied, not rerun)."""
    db = tmp_path / "p.sqlite"
    seen = []

    def interrupt(msg):
        seen.append(msg)
        if len(seen) == 5:
            raise KeyboardInterrupt

    store, c = campaign(db, progress=interrupt)
    with pytest.raises(KeyboardInterrupt):
        c.run()
    store.close()
    store, c = campaign(db)
    summary = c.run()
    assert summary.runs_resumed == 5 and summary.runs_executed == summary.runs_total - 5
    resumed, identity = load_statistics(store), store.get_meta("identity")
    store.close()
    shutil.copy(mlp_files / "p.sqlite", tmp_path / "fresh.sqlite")
    fresh_store = ProfileStore(tmp_path / "fresh.sqlite")
    assert fresh_store.get_meta("identity") == identity
    expected = load_statistics(fresh_store)
    for key in expected:
        for a, b in zip(sorted(resumed[key], key=lambda s: s.batch_size), sorted(expected[key], key=lambda s: s.batch_size)):
            np.testing.assert_array_equal(a.mi, b.mi)
            np.testing.assert_array_equal(np.nan_to_num(a.ma), np.nan_to_num(b.ma))
    fresh_store.close()


def test_out_of_memory_spans_are_substituted(tmp_path):
    """With long neighbour chains and little memory, chains fail and nearest-neighbour pairs replace them."""
    db = tmp_path / "p.sqlite"
    store, c = campaign(db, scenarios=(Scenario("none", 1),), neighbors=4)
    c.run()
    full = load_statistics(store)[("none", 1)]
    biggest = {(m.start, m.stop): m.peak for m in store.measurements(batch_size=16)}
    store.close()
    # a capacity that holds every span of two layers but not the four-layer chain [0, 4)
    small = max(p for (a, b), p in biggest.items() if b - a <= 2)
    capacity = (small + biggest[(0, 4)]) // 2
    store, c = campaign(tmp_path / "small.sqlite", scenarios=(Scenario("none", 1),), neighbors=4,
                        cluster=Cluster.parse("1x4", device_memory=capacity))
    summary = c.run()
    assert summary.runs_failed >= 1
    assert any(r.status == "oom" for r in store.runs())
    stats = load_statistics(store)[("none", 1)]
    store.close()
    for s, f in zip(sorted(stats, key=lambda s: s.batch_size), sorted(full, key=lambda s: s.batch_size)):
        assert not np.isnan(s.ma[1:, :8]).any()  # every M_a still known, from substitutes
        # sums of layer contributions do not depend on which neighbours measured them (transients,
        # maxima over time, may)
        np.testing.assert_allclose(s.span(1, 3)[:4], f.span(1, 3)[:4])
        np.testing.assert_allclose(s.span(0, 5)[:4], f.span(0, 5)[:4])


def test_layer_merger(tmp_path):
    store, c = campaign(tmp_path / "p.sqlite", merge_to=3)
    c.run()
    groups = store.get_meta("merge_groups")
    assert len(groups) == 4 and groups[0] == 0 and groups[-1] == 5
    tensor = store.measurements(kind="tensor", degree=2)
    assert tensor and all(m.start in groups and m.stop in groups for m in tensor)
    store.close()
    p = MemoryPredictor.from_db(tmp_path / "p.sqlite")
    aligned = [b for b in groups[1:-1]][0]
    plan = Plan("1f1b", 32, 2, (StagePlan(0, aligned, "tensor", 2, (0, 1)), StagePlan(aligned, 5, "tensor", 2, (2, 3))))
    assert p.predict(plan).peak_memory_bytes > 0
    off = next(b for b in range(1, 5) if b not in groups)
    bad = Plan("1f1b", 32, 2, (StagePlan(0, off, "tensor", 2, (0, 1)), StagePlan(off, 5, "tensor", 2, (2, 3))))
    with pytest.raises(ProfileError, match="merged layers"):
        p.predict(bad)
    view = p.on_units(groups)
    assert view.num_layers == 3 and view.stage_memory(0, 1, "tensor", 2, 1) == p.stage_memory(0, aligned, "tensor", 2, 1)


@pytest.fixture(scope="module")
def pipeline_only_db(tmp_path_factory):
    """``config()`` with the pipeline scenario only, run once for the module; tests copy it (neither changes it)."""
    db = tmp_path_factory.mktemp("pipeline_only") / "p.sqlite"
    store, c = campaign(db, scenarios=(Scenario("none", 1),))
    c.run()
    store.close()
    return db


def test_database_of_another_campaign_is_refused(tmp_path, pipeline_only_db):
    shutil.copy(pipeline_only_db, tmp_path / "p.sqlite")
    with pytest.raises(ProfileError, match="holds another campaign"):
        campaign(tmp_path / "p.sqlite", global_batch_size=64)


@pytest.mark.parametrize("kw, message", [
    (dict(global_batch_size=6), "does not split into 2 micro-batches"),
    (dict(batch_sizes=(16, 16)), "two different batch sizes"),
    (dict(scenarios=(Scenario("data", 8),)), "needs 8 devices per node"),
])
def test_bad_campaigns(tmp_path, kw, message):
    with pytest.raises(ProfileError, match=message):
        campaign(tmp_path / "p.sqlite", **kw)


def test_profiled_plan_with_missing_scenario_is_refused(tmp_path, pipeline_only_db):
    shutil.copy(pipeline_only_db, tmp_path / "p.sqlite")
    plan = Plan("1f1b", 32, 2, (StagePlan(0, 2, "data", 2, (0, 1)), StagePlan(2, 5, "none", 1, (2,))))
    with pytest.raises(ProfileError, match="no data2 statistics"):
        MemoryPredictor.from_db(tmp_path / "p.sqlite").predict(plan)
    with pytest.raises(PlanError):
        MemoryPredictor.from_db(tmp_path / "p.sqlite").predict(Plan("1f1b", 32, 2, (StagePlan(0, 4, "none", 1, (0,)),)))
