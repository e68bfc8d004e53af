"""[Note: recompute chosen per stage] (predict/memory.py): two profiles of the same model, without and with
recompute, predict a plan that recomputes some stages and not others; the prediction equals what the simulated
runtime measures (byte-identical to the real CPU runtime, tests/runtime/test_sim_agreement.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridplan.cli import main
from hybridplan.errors import ProfileError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP


@pytest.fixture(scope="module")
def profiles(mlp_files: Path, mlp_recompute_db: Path) -> tuple[Path, Path]:
    """The MLP user model (5 layers) profiled on 1x4 simulated devices, pipeline and tensor x2, without and with
    activation checkpointing: the session's ``mlp_files`` and ``mlp_recompute_db`` (tests/conftest.py; the same
    model, cluster, batch, micro-batches, scenarios and options but for the recompute flag), shared rather than
    profiled again."""
    return mlp_files / "p.sqlite", mlp_recompute_db


def _plan(schedule: str, first: dict, second: dict) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 32, "num_microbatches": 2, "stages": [
        {"layers": [0, 3], "parallelism": "none", "degree": 1, "devices": [0], **first},
        {"layers": [3, 5], "parallelism": "tensor", "degree": 2, "devices": [1, 2], **second}]})


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_a_stage_holds_what_it_holds_in_a_plan_where_every_stage_does_as_it_does(profiles, schedule):
    """The premise of the composition, measured: in a plan that recomputes stage 0 only, stage 0 holds what it
    holds when the whole run recomputes, and stage 1 what it holds when nothing does; the mixed prediction takes
    each stage's prediction from the profile that ran like it."""
    plain, recomputed = profiles
    cluster, sim = Cluster.parse("1x3"), {"backend": "sim"}
    mixed = validate_plan(plain, _plan(schedule, {"recompute": "full"}, {}), cluster=cluster, run_options=sim,
                          recompute_db=recomputed, model=MLP)
    everything = validate_plan(recomputed, _plan(schedule, {}, {}), cluster=cluster, run_options=sim, model=MLP)
    nothing = validate_plan(plain, _plan(schedule, {}, {}), cluster=cluster, run_options=sim, model=MLP)
    for report in (mixed, everything, nothing):
        assert report.run.ok, report.run.reason
    expected = [everything.rows[0]] + nothing.rows[1:]
    assert [(r.predicted, r.measured) for r in mixed.rows] == [(r.predicted, r.measured) for r in expected]
    assert [r.predicted for r in mixed.rows] == [r.measured for r in mixed.rows]  # exact on these stages


def test_each_stage_takes_its_own_profile(profiles):
    plain, recomputed = profiles
    mixed = MemoryPredictor.from_db(plain, recompute_db=recomputed).predict(_plan("1f1b", {"recompute": "full"}, {}))
    everything = MemoryPredictor.from_db(recomputed).predict(_plan("1f1b", {"recompute": "full"}, {}))
    nothing = MemoryPredictor.from_db(plain).predict(_plan("1f1b", {}, {}))
    assert mixed.devices[0].peak_memory_bytes == everything.devices[0].peak_memory_bytes
    assert mixed.devices[0].peak_memory_bytes != nothing.devices[0].peak_memory_bytes  # the profiles differ here
    assert [d.peak_memory_bytes for d in mixed.devices[1:]] == [d.peak_memory_bytes for d in nothing.devices[1:]]


def test_the_recompute_profile_is_checked(profiles, sharded_mlp_files, tmp_path, capsys):
    plain, recomputed = profiles
    with pytest.raises(ProfileError, match="was profiled without recompute"):
        MemoryPredictor.from_db(plain, recompute_db=plain)
    with pytest.raises(ProfileError, match="was itself profiled with recompute"):
        MemoryPredictor.from_db(recomputed, recompute_db=recomputed)
    other = sharded_mlp_files / "r.sqlite"  # the MLP profiled with recompute on 1x2 (tests/conftest.py)
    with pytest.raises(ProfileError, match="profiles another cluster"):
        MemoryPredictor.from_db(plain, recompute_db=other)
    with pytest.raises(ProfileError, match="give that database as --recompute-db"):
        MemoryPredictor.from_db(plain).predict(_plan("1f1b", {"recompute": "full"}, {}))
    plan = tmp_path / "plan.json"
    _plan("1f1b", {"recompute": "full"}, {}).save(plan)
    assert main(["predict", "--db", str(plain), "--plan", str(plan), "--recompute-db", str(recomputed)]) == 0
    assert "plan peak" in capsys.readouterr().out
    assert main(["predict", "--db", str(plain), "--plan", str(plan), "--recompute-db", str(plain)]) == 2
    assert "was profiled without recompute" in capsys.readouterr().err
