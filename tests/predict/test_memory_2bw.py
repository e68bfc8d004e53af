"""PipeDream-2BW and PipeDream-Flush in the memory predictor: the weight stash added to (or removed from) a
profile of another schedule, checked by hand and against real 2BW runs (the adjustment alone:
tests/predict/test_stash.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.quantities import INDEX
from tests.predict.test_memory import L, linear, stats_at

STASH = {("none", 1): {0: 1000, 1: 1200, 2: 700, 3: 900}, ("tensor", 2): {0: 500, 1: 600, 2: 350, 3: 450}}
STATS = {
    ("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)],
    ("tensor", 2): [stats_at(2, 8, lambda a, b, m: linear(a, b, m, 2)), stats_at(4, 16, lambda a, b, m: linear(a, b, m, 2))],
}


def _predictor(schedule: str, profile_schedule: str | None, stash=STASH) -> MemoryPredictor:
    return MemoryPredictor(STATS, num_layers=L, schedule=schedule, global_batch_size=32, num_microbatches=4,
                           profile_schedule=profile_schedule, stash=stash)


def _plan(schedule: str) -> Plan:
    return Plan(schedule, 32, 4, (StagePlan(0, 2, "tensor", 2, (0, 1)), StagePlan(2, 3, "none", 1, (2,)),
                                  StagePlan(3, 4, "data", 1, (3,))))


def _peaks(p: MemoryPredictor, schedule: str) -> list[int]:
    return [d.peak_memory_bytes for d in p.predict(_plan(schedule)).devices]


def test_2bw_adds_the_stash_of_each_stage_and_flush_is_1f1b() -> None:
    base = _peaks(_predictor("1f1b", "1f1b"), "1f1b")
    assert _peaks(_predictor("flush", "1f1b"), "flush") == base
    # the stash is live at every action, so every device's peak grows by exactly its stage's stash:
    # tensor x2 over layers [0, 2): its shards 500 + 600; "none" over [2, 3): 700; "data" x1 over [3, 4): 900
    stash = [1100, 1100, 700, 900]
    assert _peaks(_predictor("2bw", "1f1b"), "2bw") == [b + s for b, s in zip(base, stash)]
    # a 2BW profile (its static holds the stash) predicts the other schedules with it removed
    assert _peaks(_predictor("1f1b", "2bw"), "1f1b") == [b - s for b, s in zip(base, stash)]
    # the predictor re-targets a plan of another schedule, keeping what it knows about the profile
    assert _peaks(_predictor("1f1b", "1f1b"), "2bw") == _peaks(_predictor("2bw", "1f1b"), "2bw")
    # the span tables of the search agree with the per-stage path
    p = _predictor("2bw", "1f1b")
    matrix = p.stage_memory_matrix("tensor", 2, 1, L)
    assert matrix[0, 2] == pytest.approx(p.stage_memory(0, 2, "tensor", 2, 1))
    q = p.span_quantities(0, 2, "tensor", 2)
    q1 = _predictor("1f1b", "1f1b").span_quantities(0, 2, "tensor", 2)
    assert q[INDEX["static"]] - q1[INDEX["static"]] == pytest.approx(1100.0)
    np.testing.assert_allclose(np.delete(q, INDEX["static"]), np.delete(q1, INDEX["static"]))


def test_missing_stash_sizes_are_named() -> None:
    with pytest.raises(ProfileError, match="no weight-stash sizes"):
        _predictor("2bw", "1f1b", stash={("none", 1): STASH[("none", 1)]}).predict(_plan("2bw"))
    assert np.isinf(_predictor("2bw", "1f1b", stash={}).stage_memory_matrix("none", 1, 0, L)).all()


@pytest.mark.distributed
def test_predictions_of_real_2bw_runs(tmp_path) -> None:
    """Profiled on simulated devices under 1F1B, predicted for 2BW, then run for real under 2BW: within 1%
    (the issue's target), and in fact to the byte. The plans are at a profiled batch size with every span of
    them profiled, as in tests/profiling/test_campaign.py, so the check isolates the schedule conversion."""
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    model, cluster = "tests.cli.user_models:mlp", Cluster.parse("1x4")
    db = tmp_path / "p.sqlite"
    with ProfileStore(db) as store:
        Campaign(CampaignConfig(model=model, cluster=cluster, global_batch_size=32, num_microbatches=4, batch_sizes=(32, 16),
                                neighbors=1, scenarios=(Scenario("none", 1), Scenario("tensor", 2)),
                                run_options={"backend": "sim"}), store).run()
    plans = [
        Plan("2bw", 32, 4, (StagePlan(0, 2, "tensor", 2, (0, 1)), StagePlan(2, 3, "none", 1, (2,)), StagePlan(3, 5, "none", 1, (3,)))),
        Plan("2bw", 32, 4, (StagePlan(0, 1, "none", 1, (0,)), StagePlan(1, 3, "none", 1, (1,)), StagePlan(3, 5, "tensor", 2, (2, 3)))),
    ]
    predictor = MemoryPredictor.from_db(db)
    assert predictor.profile_schedule == "1f1b"
    for plan in plans:
        predicted = predictor.predict(plan)
        measured = launch(RunConfig(model=model, plan=plan, cluster=cluster, iterations=2))
        assert measured.ok, measured.reason
        for p, m in zip(predicted.devices, measured.devices):
            assert abs(p.peak_memory_bytes - m.peak_memory_bytes) <= 0.01 * m.peak_memory_bytes
        assert [p.peak_memory_bytes for p in predicted.devices] == [m.peak_memory_bytes for m in measured.devices]
        assert all(m.peak_breakdown.get("weight_stash", 0) > 0 for m in measured.devices)
