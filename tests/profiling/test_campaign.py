"""The profiling campaign end to end, on simulated devices (byte-identical to the real CPU runtime,
tests/runtime/test_sim_agreement.py), with one real run to check a prediction."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    (dict(replica_batch_sizes=(5,)), "replica batch size 5 does not split into 2 micro-batches"),
    (dict(replica_batch_sizes=(16,)), "replica batch size 16 .* or is profiled already"),
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


# ---------------------------------------------------------------------------------------------- resume after any ending
# The campaign of issue 32 (profile --zero --activation-checkpointing), small: the MLP on 1x2, 14 runs on simulated
# devices (deterministic: the same bytes every time), through the command line as a user runs it.
RESUME_ARGS = ["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "16", "--num-microbatches", "2",
               "--zero", "--activation-checkpointing", "--backend", "sim"]

# A child that runs the command and sends itself ``signal`` in the middle of recording a run: after the run's row and
# ``at`` measurement rows of the campaign are written, inside the run's transaction, the worst moment to end.
_ENDED = """
import os, sys
from contextlib import contextmanager
from hybridplan.profiling import store

signal, at = int(sys.argv[1]), int(sys.argv[2])
written = [0]
real = store.ProfileStore._transaction

class Connection:
    def __init__(self, db):
        self.db = db

    def __getattr__(self, name):
        return getattr(self.db, name)

    def execute(self, sql, *args):
        out = self.db.execute(sql, *args)
        if sql.startswith("INSERT INTO measurements"):
            written[0] += 1
            if written[0] == at:
                os.kill(os.getpid(), signal)
        return out

@contextmanager
def transaction(self):
    with real(self) as db:
        yield Connection(db)

store.ProfileStore._transaction = transaction
from hybridplan.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _content(db) -> dict:
    """Everything a campaign wrote that does not depend on when it ran: runs by key, each device's row, statistics,
    settings."""
    import sqlite3

    with sqlite3.connect(db) as c:
        key = dict(c.execute("SELECT id, key FROM runs"))
        tables = {}
        for table in ("measurements", "reserved_peaks", "workspaces"):
            columns = [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
            tables[table] = sorted((key[r[0]], *r[1:]) for r in c.execute(f"SELECT {', '.join(columns)} FROM {table}"))
        return {"runs": sorted(c.execute("SELECT key, scenario, batch_size, plan, status, reason FROM runs")),
                "statistics": sorted(c.execute("SELECT * FROM statistics")), "meta": sorted(c.execute("SELECT * FROM meta")),
                **tables}


def _profile(db, capsys) -> tuple[int, int]:
    """Run (or resume) the campaign in this process; (runs executed, runs resumed)."""
    import re

    from hybridplan.cli import main

    assert main([*RESUME_ARGS, "--db", str(db)]) == 0
    done = re.search(r"done: (\d+) runs executed, (\d+) resumed", capsys.readouterr().out)
    assert done is not None
    return int(done.group(1)), int(done.group(2))


@pytest.mark.slow  # 28 s on 2 cores: four campaigns, three of them in processes of their own
def test_resume_after_any_ending_gives_the_uninterrupted_database(tmp_path, capsys):
    """Ended by SIGTERM, SIGINT and SIGKILL in the middle of recording a run, then run again: the database holds what an
    uninterrupted campaign's holds (same runs, same bytes), and the second run executes only the runs the first did not
    record, with no run repeated and no unique-key error."""
    import os
    import signal
    import subprocess
    import sys

    executed, resumed = _profile(tmp_path / "whole.sqlite", capsys)
    assert resumed == 0 and executed > 10
    whole = _content(tmp_path / "whole.sqlite")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path])}
    endings = ((signal.SIGTERM, 3, 143), (signal.SIGINT, 12, 130), (signal.SIGKILL, 20, -signal.SIGKILL))
    children = {sig: subprocess.Popen([sys.executable, "-c", _ENDED, str(int(sig)), str(at), *RESUME_ARGS, "--db",
                                       str(tmp_path / f"{sig.name}.sqlite")], stderr=subprocess.PIPE, text=True, env=env)
                for sig, at, _ in endings}  # side by side: each mostly imports torch
    for sig, _, code in endings:
        _, stderr = children[sig].communicate(timeout=120)
        assert children[sig].returncode == code, stderr
        assert "Traceback" not in stderr
        db = tmp_path / f"{sig.name}.sqlite"
        partial = _content(db)
        assert 0 < len(partial["runs"]) < len(whole["runs"])  # it ended in the middle, the run in flight not recorded
        keys = {run[0] for run in partial["runs"]}
        assert {m[0] for m in partial["measurements"]} <= keys  # no row of an unrecorded run
        assert all(run in whole["runs"] for run in partial["runs"])
        executed, resumed = _profile(db, capsys)
        assert resumed == len(partial["runs"]) and executed == len(whole["runs"]) - resumed
        assert _content(db) == whole, sig.name


def test_a_run_stopped_from_outside_is_run_again(tmp_path, capsys):
    """A run whose ranks were ended by SIGTERM (the campaign's process group stopped) is recorded as failed; resumed,
    the campaign runs it again and replaces its record rather than counting it as a failure of its plan."""
    import sqlite3

    _profile(tmp_path / "whole.sqlite", capsys)
    whole = _content(tmp_path / "whole.sqlite")
    shutil.copy(tmp_path / "whole.sqlite", tmp_path / "p.sqlite")
    with sqlite3.connect(tmp_path / "p.sqlite") as c:
        (last,) = c.execute("SELECT max(id) FROM runs").fetchone()
        for table in ("measurements", "reserved_peaks", "workspaces"):
            c.execute(f"DELETE FROM {table} WHERE run_id = ?", (last,))
        c.execute("UPDATE runs SET status = 'failed', reason = 'device 1 (stage 0) was killed by signal 15 without a"
                  " report' WHERE id = ?", (last,))
    executed, resumed = _profile(tmp_path / "p.sqlite", capsys)
    assert (executed, resumed) == (1, len(whole["runs"]) - 1)
    assert _content(tmp_path / "p.sqlite") == whole


def test_zero_that_adds_nothing_says_so_and_which_batch_sizes_would():
    """Issue 32: --zero with micro-batches of 1 and 2 samples (32 over 8 micro-batches, halved and quartered) adds no
    ZeRO-3 scenario; the campaign says so and names batch sizes that would, which indeed do."""
    said = []
    with ProfileStore(":memory:") as store:
        c = Campaign(config(global_batch_size=32, num_microbatches=8, scenarios=None, zero=True), store,
                     progress=said.append)
    assert not any(s.zero for s in c.scenarios)
    assert said == ["note: --zero adds no ZeRO-3 scenario: the profiled batch sizes [8, 16] over 8 micro-batches give"
                    " micro-batches of [1, 2] sample(s), which do not all split 2 ways, so no data-parallel scenario"
                    " applies; profiled batch sizes that are multiples of 16 would (--profile-batch-sizes 16,32, or a"
                    " --global-batch-size that is a multiple of 64: its halves and quarters are profiled)"]
    for kw in ({"batch_sizes": (16, 32)}, {"global_batch_size": 64}):
        said.clear()
        with ProfileStore(":memory:") as store:
            c = Campaign(config(**{"global_batch_size": 32, **kw}, num_microbatches=8, scenarios=None, zero=True), store,
                         progress=said.append)
        assert Scenario("data", 2, 3) in c.scenarios and not said


def test_the_pipeline_and_tensor_scenarios_are_profiled_at_a_replicas_rows_too(tmp_path):
    """[Note: a replica's rows are measured] (profiling/campaign.py): a replica batch is profiled in the pipeline and
    tensor scenarios only (the data scenarios' replicas run those rows already) and loaded as a third size. A target
    at those rows reads its own measurement, and the campaign's target the fit through the two larger sizes, as
    without the third: gpt-tiny's first backward is no straight line through 2, 4 and 8 rows."""
    from hybridplan.predict.batch_scaling import scaled_to_batch, span_in_units

    store = ProfileStore(tmp_path / "p.sqlite")
    Campaign(config(model="gpt-tiny", scenarios=(Scenario("none", 1), Scenario("tensor", 2), Scenario("data", 2)),
                    replica_batch_sizes=(4,)), store).run()
    stats = load_statistics(store)
    rows = {key: sorted(s.microbatch_size for s in sizes) for key, sizes in stats.items()}
    assert rows == {("none", 1): [2, 4, 8], ("tensor", 2): [2, 4, 8], ("data", 2): [4, 8]}
    at = {s.microbatch_size: s for s in stats[("tensor", 2)]}
    replica = MemoryPredictor.from_db(tmp_path / "p.sqlite").retargeted(global_batch_size=4)
    target = MemoryPredictor.from_db(tmp_path / "p.sqlite")  # B = 32: 16 rows
    differs = []
    for span in ((0, 1), (1, 4), (3, 7)):
        assert np.array_equal(replica.span_quantities(*span, "tensor", 2)[:8], span_in_units(at[2], *span)[:8])
        fit = scaled_to_batch([span_in_units(at[b], *span) for b in (4, 8)], [at[4], at[8]], global_batch_size=32,
                              microbatch_size=16)
        through_the_smaller = scaled_to_batch([span_in_units(at[b], *span) for b in (2, 4)], [at[2], at[4]],
                                              global_batch_size=32, microbatch_size=16)
        assert np.array_equal(target.span_quantities(*span, "tensor", 2)[:8], fit[:8])
        differs.append(not np.array_equal(fit[:8], through_the_smaller[:8]))
    assert any(differs)
    store.close()
