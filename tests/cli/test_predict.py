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


def test_a_cuda_profile_adds_the_memory_outside_the_allocator(files, tmp_path, capsys):
    """A profile taken on simulated CUDA devices: each device also gets the memory outside the allocator (the H100's
    context 618.8 MiB, the libraries' 84 MiB, 562 MiB per NCCL communicator: ../shared/notes/gpu-h100-facts.md)
    and the total that must fit; the reserved peak is not predicted."""
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
        assert d["total_bytes"] == d["peak_memory_bytes"] + d["overhead_bytes"] and d["reserved_peak_bytes"] is None
    assert main(["predict", "--db", str(db), "--plan", str(files / "plan.json")]) == 0
    assert "total (min)" in capsys.readouterr().out
