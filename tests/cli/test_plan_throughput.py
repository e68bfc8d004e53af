"""``hybridplan plan --objective throughput|pareto``, ``--mode 2bw``, ``--baseline`` as a user calls them: a memory
profile (simulated devices) and a time profile of the MLP user model (``files``: tests/cli/conftest.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.cli import main
from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.search.baselines import BASELINES
from tests.cli.conftest import MLP


def test_throughput_plan_fits_the_device_memory(files, capsys):
    base = ["plan", "--objective", "throughput", "--db", str(files / "p.sqlite"), "--time-profile", str(files / "t.json"),
            "--cluster", "1x4", "--model", MLP]
    assert main(base + ["--out", str(files / "fast.json")]) == 0
    assert "fastest plan" in capsys.readouterr().out
    fast = json.loads((files / "fast.json").read_text())
    assert fast["predicted_iteration_s"] > 0 and fast["predicted_peak_bytes"] > 0
    # a capacity just under the fastest plan's peak: another plan, every device within the capacity
    capacity = fast["predicted_peak_bytes"] - 1
    assert main(base + ["--device-memory", str(capacity), "--out", str(files / "fit.json")]) == 0
    capsys.readouterr()
    fit = Plan.load(files / "fit.json")
    assert fit.extra["predicted_peak_bytes"] <= capacity
    assert fit.extra["predicted_iteration_s"] >= fast["predicted_iteration_s"]
    assert max(d.peak_memory_bytes for d in MemoryPredictor.from_db(files / "p.sqlite").predict(fit).devices) <= capacity
    assert main(base + ["--device-memory", "1KiB"]) == 2
    assert "no feasible plan" in capsys.readouterr().err


def test_pareto_frontier(files, capsys):
    out = files / "front.json"
    assert main(["plan", "--objective", "pareto", "--db", str(files / "p.sqlite"), "--time-profile", str(files / "t.json"),
                 "--cluster", "1x4", "--model", MLP, "--out", str(out)]) == 0
    assert "Pareto frontier" in capsys.readouterr().out
    frontier = json.loads(out.read_text())["frontier"]
    assert frontier
    memory = [p["predicted_peak_bytes"] for p in frontier]
    seconds = [p["predicted_iteration_s"] for p in frontier]
    assert memory == sorted(memory) and seconds == sorted(seconds, reverse=True)  # non-dominated
    assert len(set(memory)) == len(memory) and len(set(seconds)) == len(seconds)
    for p in frontier:
        Plan.from_dict(p["plan"]).validate(num_layers=5, cluster=Cluster.parse("1x4"))


def test_2bw_mode(files, capsys):
    out = files / "2bw.json"
    assert main(["plan", "--objective", "throughput", "--mode", "2bw", "--db", str(files / "p.sqlite"), "--time-profile",
                 str(files / "t.json"), "--cluster", "1x4", "--model", MLP, "--out", str(out)]) == 0
    assert "2bw w=" in capsys.readouterr().out
    plan = Plan.load(out)
    assert plan.schedule == "2bw" and plan.extra["pipeline"] == "pipedream-2bw" and plan.extra["recompute"] is False


@pytest.mark.parametrize("name", list(BASELINES))
def test_baselines(files, capsys, name):
    out = files / f"{name}.json"
    assert main(["plan", "--baseline", name, "--db", str(files / "p.sqlite"), "--time-profile", str(files / "t.json"),
                 "--cluster", "1x4", "--model", MLP, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"baseline {name}" in text and "per iteration" in text and "predicted plan peak" in text
    plan = Plan.load(out)
    assert plan.extra["baseline"] == name and plan.num_stages == 4 and plan.extra["predicted_iteration_s"] > 0
    if name == "torchgpipe-time":  # the slow layer 2 gets a stage of its own
        assert any((s.start, s.stop) == (2, 3) for s in plan.stages)


@pytest.mark.parametrize("args, message", [
    (["plan", "--objective", "pareto", "--time-profile", "{d}/t.json", "--cluster", "1x4", "--global-batch-size", "32"],
     "needs memory predictions"),
    (["plan", "--objective", "throughput", "--cluster", "1x4", "--time-profile", "{d}/t.json"], "global batch size is unknown"),
    (["plan", "--baseline", "torchgpipe-time", "--db", "{d}/p.sqlite", "--cluster", "1x4", "--model", MLP],
     "no time profile was given"),
    # the database names user code (the MLP): it is imported only when the user names it (issue 9, item 3)
    (["plan", "--baseline", "equal", "--db", "{d}/p.sqlite", "--cluster", "1x4"], "add --model tests.cli.user_models:mlp"),
    (["plan", "--objective", "throughput", "--db", "{d}/p.sqlite", "--time-profile", "{d}/t.json", "--cluster", "1x4"],
     "building it would import and run code"),
    (["plan", "--baseline", "equal", "--db", "{d}/p.sqlite", "--cluster", "1x4", "--model", "gpt-tiny"],
     "is another model"),
])
def test_bad_input_exits_2(files, capsys, args, message):
    assert main([a.format(d=files) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_throughput_and_pareto_with_zero_and_recompute(sharded_mlp_files, capsys):
    """--zero and --recompute-db reach the throughput search from the command line: at a batch of 512 and 50,000 B
    per device (no plain plan fits: tests/workflows/test_plan_throughput.py) the written plan has a ZeRO stage and
    fits as ``predict --recompute-db`` says; the table labels the options; the Pareto
    frontier over the extended space is written and non-dominated."""
    d = sharded_mlp_files
    base = ["plan", "--db", str(d / "p.sqlite"), "--time-profile", str(d / "t.json"), "--cluster", "1x2", "--model",
            MLP, "--global-batch-size", "512", "--zero", "--recompute-db", str(d / "r.sqlite"), "--allow-cross-node"]
    out = d / "fast.json"
    assert main(base + ["--objective", "throughput", "--device-memory", "50000", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "zero=[" in text and "fastest plan" in text
    plan = Plan.load(out)
    assert any(s.zero for s in plan.stages) and plan.extra["predicted_peak_bytes"] <= 50_000
    assert main(["predict", "--db", str(d / "p.sqlite"), "--recompute-db", str(d / "r.sqlite"), "--plan", str(out),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_memory_bytes"] <= 50_000
    front = d / "front.json"
    assert main(base + ["--objective", "pareto", "--out", str(front)]) == 0
    assert "Pareto frontier" in capsys.readouterr().out
    frontier = json.loads(front.read_text())["frontier"]
    memory = [p["predicted_peak_bytes"] for p in frontier]
    seconds = [p["predicted_iteration_s"] for p in frontier]
    assert memory == sorted(memory) and seconds == sorted(seconds, reverse=True) and len(frontier) >= 2
    assert any("zero=" in p["label"] for p in frontier)
