"""``hybridplan estimate`` as a user calls it: a memory profile (simulated devices) and a time profile of the MLP
user model (``files``: tests/cli/conftest.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.cli import main
from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from tests.cli.conftest import MIXED


def test_estimate_prints_time_per_stage_and_memory(files, capsys):
    args = ["estimate", "--plan", str(files / "plan.json"), "--time-profile", str(files / "t.json"), "--db",
            str(files / "p.sqlite"), "--cluster", "1x4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ms per iteration" in out and "fwd ms" in out and "predicted plan peak" in out
    assert "no per-message latency" in out  # t.json predates links: alpha = 0, said
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = Plan.from_dict(MIXED)
    expected = predict_iteration_time(plan, TimeProfile.load(files / "t.json"), Cluster.parse("1x4"))
    assert data["time"]["total_s"] == pytest.approx(expected.total_s) and len(data["time"]["stages"]) == 3
    assert data["memory"]["peak_memory_bytes"] == MemoryPredictor.from_db(files / "p.sqlite").predict(plan).peak_memory_bytes
    # the same plan under 2BW: no flush (faster), a weight stash (more memory)
    (files / "plan2bw.json").write_text(json.dumps({**MIXED, "schedule": "2bw"}))
    assert main(["estimate", "--plan", str(files / "plan2bw.json")] + args[3:] + ["--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["time"]["schedule"] == "2bw" and two["time"]["total_s"] < data["time"]["total_s"]
    assert two["memory"]["peak_memory_bytes"] > data["memory"]["peak_memory_bytes"]


def test_estimate_prints_the_per_message_latency(files, capsys):
    """A time profile with measured links: the table names the latency of every stage's messages and the JSON holds it."""
    data = json.loads((files / "t.json").read_text())
    data["links"] = {"backend": "gloo", "allreduce_latency_s": 1e-4, "p2p_latency_s": 2e-3}
    (files / "t_links.json").write_text(json.dumps(data))
    args = ["estimate", "--plan", str(files / "plan.json"), "--time-profile", str(files / "t_links.json"), "--cluster", "1x4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "per-message latency (in p2p and sync): stage 0: p2p 4.00 ms per micro-batch" in out
    assert "no per-message latency" not in out
    assert main(args + ["--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["time"]["stages"]
    # two boundaries (3 stages): 2 ms per message, one per direction
    assert [s["p2p_latency_s"] for s in stages] == pytest.approx([4e-3, 4e-3, 0.0])
    assert all(s["p2p_messages"] > 0 for s in stages[:2])


@pytest.mark.parametrize("args, message", [
    (["estimate", "--plan", "{d}/plan.json", "--cluster", "1x4", "--db", "{d}/p.sqlite"], "holds none"),
])
def test_bad_input_exits_2(files, capsys, args, message):
    assert main([a.format(d=files) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_estimate_is_within_10_percent_of_the_measured_iteration(tmp_path, capsys):
    """profile --time, then estimate and run a one-stage and a four-stage plan of gpt-tiny (256 samples in 8
    micro-batches: layers of milliseconds, far above the hooks' microseconds). The four stages are 4 processes on
    the host's cores: the estimate's core sharing. Timing on a shared machine: run it when the machine is otherwise
    idle (benchmarks/estimate_accuracy covers it with a table)."""
    db = tmp_path / "t.sqlite"
    assert main(["profile", "--model", "gpt-tiny", "--cluster", "1x1", "--global-batch-size", "256",
                 "--num-microbatches", "8", "--db", str(db), "--time"]) == 0
    capsys.readouterr()
    for cuts, cluster in (([0, 10], "1x1"), ([0, 3, 5, 7, 10], "1x4")):
        plan = {"schedule": "1f1b", "global_batch_size": 256, "num_microbatches": 8, "stages": [
            {"layers": [a, b], "parallelism": "none", "degree": 1, "devices": [i]} for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]}
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        assert main(["estimate", "--db", str(db), "--cluster", cluster, "--plan", str(tmp_path / "plan.json"), "--json"]) == 0
        estimate = json.loads(capsys.readouterr().out)["time"]
        assert estimate["optimizer_s"] > 0 and estimate["overhead_s"] > 0
        assert main(["run", "--model", "gpt-tiny", "--cluster", cluster, "--plan", str(tmp_path / "plan.json"),
                     "--iterations", "6", "--no-memory", "--json"]) == 0
        measured = json.loads(capsys.readouterr().out)["iteration_seconds"]
        assert estimate["total_s"] == pytest.approx(measured, rel=0.10), (cluster, estimate["total_s"], measured)
