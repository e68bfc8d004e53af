"""``hybridplan predict`` as a user calls it: the predictor's numbers for the plan, at the plan's own schedule and
batch (``files``: the MLP's profile and the MIXED plan, tests/cli/conftest.py)."""

from __future__ import annotations

import json

from hybridplan.cli import main
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.units import format_bytes
from tests.cli.conftest import MIXED


def _predicted(files, plan: dict, method: str = "quantities"):
    p = Plan.from_dict(plan)
    return MemoryPredictor.from_db(files / "p.sqlite", schedule=p.schedule, global_batch_size=p.global_batch_size,
                                   num_microbatches=p.num_microbatches, method=method).predict(p)


def _predicted_from(db, plan: dict) -> dict[int, int]:
    """Each device's predicted tensor peak of ``plan`` from the profile ``db``."""
    p = Plan.from_dict(plan)
    predictor = MemoryPredictor.from_db(db, schedule=p.schedule, global_batch_size=p.global_batch_size,
                                        num_microbatches=p.num_microbatches)
    return {d.device: d.peak_memory_bytes for d in predictor.predict(p).devices}


def test_a_cpu_profile_records_no_workspaces_and_composes_as_before(files):
    """A CPU holds no cuBLAS workspace: nothing is recorded, so nothing is taken out of static."""
    from hybridplan.profiling.statistics import load_statistics
    from hybridplan.profiling.store import ProfileStore

    with ProfileStore(files / "p.sqlite", create=False) as store:
        assert store.measurements() and all(m.workspaces is None for m in store.measurements())
        assert all(s.workspaces is None for stats in load_statistics(store).values() for s in stats)


def test_the_json_is_the_predictors_prediction(files, capsys):
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == _predicted(files, MIXED).to_dict()


def test_the_table_lists_every_device_and_the_plan_peak(files, capsys):
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(files / "plan.json")]) == 0
    out = capsys.readouterr().out
    expected = _predicted(files, MIXED)
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(d.device, d.stage) for d in expected.devices]
    assert out.rstrip().endswith(f"plan peak: {format_bytes(expected.peak_memory_bytes)}")


def test_the_plans_batch_and_schedule_are_the_targets(files, tmp_path, capsys):
    plan = {**MIXED, "schedule": "gpipe", "global_batch_size": 64, "num_microbatches": 4}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(tmp_path / "p.json"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == _predicted(files, plan).to_dict() and got != _predicted(files, MIXED).to_dict()
    assert main(["predict", "--db", str(files / "p.sqlite"), "--plan", str(tmp_path / "p.json"), "--json",
                 "--method", "capture"]) == 0
    assert json.loads(capsys.readouterr().out) == _predicted(files, plan, "capture").to_dict()


def test_a_cuda_profile_adds_the_reserved_peak_and_the_memory_outside_the_allocator(files, tmp_path, capsys):
    """A profile taken on simulated CUDA devices: each device also gets the allocator's reserved peak, the memory
    outside the allocator (the H100's context 618.8 MiB, the libraries' 84 MiB, 562 MiB per NCCL communicator:
    ../shared/notes/gpu-h100-facts.md) and their total, which must fit. A profile written before reserved peaks
    were recorded still loads: its reserved peak is not predicted, and the table says its total is a lower bound."""
    import sqlite3

    from hybridplan.plan.cluster import Cluster
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore
    from tests.cli.conftest import MLP

    db = tmp_path / "cuda.sqlite"
    with ProfileStore(db) as store:
        Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4", device_type="cuda"), global_batch_size=32,
                                num_microbatches=2, scenarios=(Scenario("none", 1), Scenario("tensor", 2)),
                                run_options={"backend": "sim", "device_type": "cuda"}), store).run()
    assert main(["predict", "--db", str(db), "--plan", str(files / "plan.json"), "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    mib = 2**20
    communicators = {0: 3, 1: 3, 2: 4, 3: 2}  # MIXED, by hand: tests/runtime/test_gpu_memory.py
    for d in devices:
        assert d["overhead_bytes"] == round(618.8 * mib) + 84 * mib + communicators[d["device"]] * 562 * mib
        assert d["total_bytes"] == d["reserved_peak_bytes"] + d["overhead_bytes"]
    # Reserved, by hand from the allocator's rules (runtime/cuda_allocator.py), on a plan whose every stage starts
    # with a Linear (so it holds the workspaces however they are composed: see below) and on MIXED: each device's
    # two 32 MiB cuBLAS workspaces (forward and backward threads) take a 32 MiB segment each (>= 10 MiB: the
    # request rounded up to 2 MiB); every other block is at most 1 MiB (the 1 MiB cuBLASLt workspace, the MLP's few
    # KiB of tensors) and all fit one 2 MiB small segment: 66 MiB.
    assert [d["reserved_peak_bytes"] for d in devices] == [66 * mib] * 4
    aligned = {**MIXED, "stages": [{"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
                                   {"layers": [2, 4], "parallelism": "none", "degree": 1, "devices": [2]},
                                   {"layers": [4, 5], "parallelism": "none", "degree": 1, "devices": [3]}]}
    (tmp_path / "aligned.json").write_text(json.dumps(aligned))
    assert main(["predict", "--db", str(db), "--plan", str(tmp_path / "aligned.json"), "--json"]) == 0
    for d in json.loads(capsys.readouterr().out)["devices"]:
        assert d["reserved_peak_bytes"] == 66 * mib and d["total_bytes"] == 66 * mib + d["overhead_bytes"]
    assert main(["predict", "--db", str(db), "--plan", str(tmp_path / "aligned.json")]) == 0
    out = capsys.readouterr().out
    assert "total (min)" not in out and "not predicted" not in out and format_bytes(66 * mib) in out

    # MIXED's last stage [3, 5) starts with a ReLU; its Linear's M_a comes from the chain at 2, which had already run
    # a Linear: composed as per-layer bytes, it held no workspace. Each measured device's workspaces are now taken
    # out of static and the stage gets back its Linear's, by hand 32 + 1 + 32 MiB (profiling/statistics.py [Note:
    # workspaces are per device]); against a simulated run of the plan, the rest is the tensors' few KiB.
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate

    mixed = _predicted_from(db, MIXED)
    run = simulate(RunConfig(model=MLP, plan=Plan.from_dict(MIXED), cluster=Cluster.parse("1x4", device_type="cuda"),
                             backend="sim", device_type="cuda"))
    simulated = {d.device: d.peak_memory_bytes for d in run.devices}
    assert mixed[3] >= 65 * mib and 0 <= simulated[3] - mixed[3] < 4096
    with sqlite3.connect(db) as old:  # as written before the workspaces were recorded: composed as before
        old.execute("DROP TABLE workspaces")
    before = _predicted_from(db, MIXED)
    assert {d: mixed[d] - before[d] for d in mixed} == {0: 0, 1: 0, 2: 0, 3: 65 * mib}

    with sqlite3.connect(db) as old:  # as written before the reserved peaks were recorded
        old.execute("DROP TABLE reserved_peaks")
    assert main(["predict", "--db", str(db), "--plan", str(files / "plan.json"), "--json"]) == 0
    for d in json.loads(capsys.readouterr().out)["devices"]:
        assert d["reserved_peak_bytes"] is None and d["total_bytes"] == d["peak_memory_bytes"] + d["overhead_bytes"]
    assert main(["predict", "--db", str(db), "--plan", str(files / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "total (min)" in out and "reserved peak not predicted" in out
