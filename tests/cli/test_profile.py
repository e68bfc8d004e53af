"""``hybridplan profile`` as a user calls it: the runs of a campaign listed without running them, a campaign on
simulated devices written to the database and resumed, and options it refuses."""

from __future__ import annotations

import pytest

from hybridplan.cli import main
from hybridplan.profiling.database import ProfileDB
from tests.cli.conftest import MLP

BASE = ["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2",
        "--scenarios", "pipeline"]


def test_dry_run_lists_every_run_and_writes_nothing(tmp_path, capsys):
    db = tmp_path / "p.sqlite"
    assert main(BASE + ["--db", str(db), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # two devices: two stages cut after layer 1, 2, 3 or 4 of the 5, at the default batch sizes B/4 = 2 and B/2 = 4
    expected = [f"pipeline @ batch {b:>5}: [0,{k}) [{k},5)" for b in (2, 4) for k in (1, 2, 3, 4)]
    assert [line.strip() for line in lines[:-1]] == [e.strip() for e in expected]
    assert lines[-1].startswith("8 runs: pipeline 8 ")
    assert not db.exists()


def test_a_campaign_is_written_and_a_second_call_resumes_it(tmp_path, capsys):
    db = tmp_path / "p.sqlite"
    assert main(BASE + ["--db", str(db), "--backend", "sim"]) == 0
    assert "done: 8 runs executed, 0 resumed" in capsys.readouterr().out
    with ProfileDB(db) as profile:
        assert profile.has_memory and profile.model == MLP
        assert set(profile.statistics) == {("none", 1)}
    assert main(BASE + ["--db", str(db), "--backend", "sim"]) == 0
    assert "done: 0 runs executed, 8 resumed" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2", "--db", "{d}/x.sqlite",
      "--time", "--backend", "sim"], "fake tensors that take no time"),
    (["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2", "--db", "{d}/x.sqlite",
      "--time-out", "t.json"], "need --time"),
])
def test_bad_input_exits_2(files, capsys, args, message):
    assert main([a.format(d=files) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_zero_adds_a_zero3_scenario_per_data_degree_with_as_many_runs(tmp_path, capsys):
    """``--zero``: data x2 with ZeRO-3 packs the same spans as data x2, so it lists as many runs (the profile's
    runs at most double)."""
    base = ["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "16", "--num-microbatches", "2",
            "--db", str(tmp_path / "p.sqlite"), "--dry-run"]
    assert main(base) == 0
    plain = capsys.readouterr().out.splitlines()[-1]
    assert main(base + ["--zero"]) == 0
    lines = capsys.readouterr().out.splitlines()
    data = sum(1 for line in lines if line.strip().startswith("data2 @"))
    zero = sum(1 for line in lines if line.strip().startswith("data2-zero3 @"))
    assert data == zero > 0
    assert "data2-zero3" not in plain
