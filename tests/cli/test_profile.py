"""``hybridplan profile`` as a user calls it: the runs of a campaign listed without running them, a campaign on
simulated devices written to the database and resumed, and options it refuses; a campaign on two "nodes"
(--hosts) equal to a local one, resumed after a kill."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridplan.cli import main
from hybridplan.profiling.database import ProfileDB
from tests.cli.conftest import MLP
from tests.runtime.util import cmdline, descendants, free_port, running

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


def test_a_huggingface_model_is_profiled_planned_predicted_and_validated(tmp_path, capsys):
    """``--model hf:...`` through every step, on simulated devices: the database records the name (a config
    is data, so later commands need no --model), and the plan's predicted peaks come within 5% of its run."""
    import json

    db, plan = str(tmp_path / "p.sqlite"), str(tmp_path / "best.json")
    assert main(["profile", "--model", "hf:llama-tiny", "--cluster", "1x2", "--global-batch-size", "8",
                 "--num-microbatches", "2", "--scenarios", "pipeline", "--backend", "sim", "--db", db]) == 0
    assert "done: 6 runs executed" in capsys.readouterr().out  # 3 cuts of 4 layers at batch sizes 2 and 4
    assert main(["plan", "--db", db, "--cluster", "1x2", "--out", plan]) == 0
    chosen = json.loads(open(plan).read())
    assert chosen["model"] == "hf:llama-tiny" and chosen["stages"][-1]["layers"][1] == 4
    capsys.readouterr()
    assert main(["predict", "--db", db, "--plan", plan, "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)["peak_memory_bytes"]
    assert main(["validate", "--db", db, "--plan", plan, "--backend", "sim", "--json"]) == 0
    validation = json.loads(capsys.readouterr().out)
    assert validation["status"] == "ok" and validation["predicted_peak_bytes"] == predicted
    assert validation["max_abs_relative_error"] <= 0.05


# ---------------------------------------------------------------------------------------------- several machines
MLP2 = "tests.cli.user_models:mlp2"
TWO_NODES = ["profile", "--model", MLP2, "--cluster", "2x1", "--global-batch-size", "8", "--num-microbatches", "2"]
"""Two runs (batch 2 and 4), each of two stages, one on each node."""
REPO = Path(__file__).resolve().parents[2]


def _rows(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table but the seconds a run took and when it ended."""
    with sqlite3.connect(db) as conn:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for t in tables:
            cols = [c[1] for c in conn.execute(f"PRAGMA table_info({t})") if c[1] not in ("wall_seconds", "finished_at")]
            out[t] = sorted(conn.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall(), key=repr)
    return out


def _runs_in(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    except sqlite3.Error:  # not created yet
        return 0


@pytest.mark.distributed
def test_a_campaign_on_two_nodes_writes_the_local_database_and_resumes_after_a_kill(tmp_path, monkeypatch, capsys):
    """Each run on two "nodes" (torchrun --nnodes 2, rendezvous on 127.0.0.1); the head is killed (SIGKILL)
    during the second run: nothing it started survives, the first run is in the database; the command
    run again resumes, and the database equals, row for row, the one a local campaign writes."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    local, multi = tmp_path / "local.sqlite", tmp_path / "multi.sqlite"
    assert main([*TWO_NODES, "--db", str(local)]) == 0
    assert "done: 2 runs executed" in capsys.readouterr().out
    hosts = ["--hosts", "127.0.0.1,127.0.0.1", "--launcher", "local", "--master-port", str(free_port())]
    cmd = [sys.executable, "-m", "hybridplan", *TWO_NODES, "--db", str(multi), *hosts]
    with (tmp_path / "head.log").open("w") as log:
        head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    seen: set = set()
    try:
        deadline = time.monotonic() + 240
        while _runs_in(multi) < 1 or not any("hybridplan.runtime.torchrun" in cmdline(p) for p, _ in descendants(head.pid)):
            assert head.poll() is None, (tmp_path / "head.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()
            time.sleep(0.2)
        seen.update(descendants(head.pid))  # agents, torchrun on each node, their ranks
        head.kill()
        head.wait()
        gone_by = time.monotonic() + 15
        while (left := [p for p in seen if running(p)]) and time.monotonic() < gone_by:
            time.sleep(0.1)
        assert not left, [cmdline(p) for p, _ in left]
    finally:
        for proc in seen | set(descendants(head.pid) if head.poll() is None else []):
            if running(proc):
                os.kill(proc[0], signal.SIGKILL)
        if head.poll() is None:
            head.kill()
    assert _runs_in(multi) == 1
    assert main([*TWO_NODES, "--db", str(multi), *hosts]) == 0
    assert "done: 1 runs executed, 1 resumed from the database, 0 failed" in capsys.readouterr().out
    assert _rows(multi) == _rows(local)


def test_a_taken_rendezvous_port_exits_2_before_any_run(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main([*TWO_NODES, "--db", str(tmp_path / "p.sqlite"), "--hosts", "127.0.0.1,127.0.0.1", "--launcher", "local",
                     "--master-port", str(port)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"port {port} on " in err and "is not free" in err and "Traceback" not in err
    assert _runs_in(tmp_path / "p.sqlite") == 0


@pytest.mark.slow  # four torchrun launches, about a minute on 2 cores; benchmarks/multinode_profiling runs it too
@pytest.mark.distributed
def test_tensor_groups_across_two_nodes_of_two_devices_write_the_local_database(tmp_path, monkeypatch, capsys):
    """2x2: each run's tensor pair is devices 1 and 2, one on each node, and node 1 runs one rank of two."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    args = [*TWO_NODES[:4], "2x2", *TWO_NODES[5:], "--scenarios", "tensor2"]
    local, multi = tmp_path / "local.sqlite", tmp_path / "multi.sqlite"
    assert main([*args, "--db", str(local)]) == 0
    assert main([*args, "--db", str(multi), "--hosts", "127.0.0.1,127.0.0.1", "--launcher", "local",
                 "--master-port", str(free_port())]) == 0
    assert "started 3 processes on 2 hosts" in capsys.readouterr().err
    with sqlite3.connect(multi) as conn:
        plans = [json.loads(p) for (p,) in conn.execute("SELECT plan FROM runs")]
    assert [[s["devices"] for s in p["stages"]] for p in plans] == [[[0], [1, 2]]] * 2
    assert _rows(multi) == _rows(local)


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
