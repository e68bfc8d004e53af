"""[Note: predicting ZeRO from a profile] (predict/zero.py): ZeRO-1 stages are the data stage's prediction with
each device's share of the optimizer state, recomputed from the parameter shapes (byte-exact against the
simulated runtime, which is byte-identical to the real CPU runtime: tests/runtime/test_sharding.py); ZeRO-3
stages come from a profiled ``data<d>-zero3`` scenario; what cannot be predicted is refused, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridplan.errors import ProfileError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.zero import ZeroLayout, fsdp_rows, zero1_shares
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP

# Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10): parameters [32, 16], [32], [32, 32], [32], [10, 32], [10]
MLP_SHAPES = [[[4, 32, 16], [4, 32]], [], [[4, 32, 32], [4, 32]], [], [[4, 10, 32], [4, 10]]]


def test_zero1_partition_is_greedy_by_size():
    # by hand: sizes 512, 32, 1024, 32 on 2 ranks: 1024 -> rank 0; 512 -> rank 1; 32 (first) -> rank 1; 32 -> rank 1
    assert zero1_shares([512, 32, 1024, 32], 2) == [[2], [0, 1, 3]]
    # ties go to the lowest rank, equal sizes keep their order
    assert zero1_shares([5, 5, 5], 3) == [[0], [1], [2]]


def test_fsdp_chunks_rows_like_torch_chunk():
    assert [fsdp_rows(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [fsdp_rows(2, 4, r) for r in range(4)] == [1, 1, 0, 0]
    assert [fsdp_rows(32, 2, r) for r in range(2)] == [16, 16]


def test_optimizer_state_per_rank_by_hand():
    layout = ZeroLayout(MLP_SHAPES)
    # layers 2-4 on 2 ranks: parameters of 1024, 32, 320, 10 elements; moments 8 bytes per element, step 4 bytes
    assert layout.optimizer_bytes(2, 5, 0, 2, 0) == 8 * (1024 + 32 + 320 + 10) + 4 * 4
    # ZeRO-1: rank 0 takes the 1024, rank 1 the 320, 32 and 10
    assert layout.optimizer_bytes(2, 5, 1, 2, 0) == 8 * 1024 + 4
    assert layout.optimizer_bytes(2, 5, 1, 2, 1) == 8 * (320 + 32 + 10) + 3 * 4
    # ZeRO-3 on 4 ranks: rows of [32, 32] -> 8 each; [32] -> 8; [10, 32] -> 3, 3, 3, 1; [10] -> 3, 3, 3, 1
    assert layout.optimizer_bytes(2, 5, 3, 4, 3) == 8 * (8 * 32 + 8 + 1 * 32 + 1) + 4 * 4
    assert layout.static_delta(2, 5, 3, 4, 3) == 8 * ((1 - 3) * 32 + (1 - 3))


@pytest.fixture(scope="module")
def zero_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP profiled on 1x4 simulated devices: pipeline, data x2 and data x2 with ZeRO-3 (a few seconds)."""
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore

    path = tmp_path_factory.mktemp("zero") / "p.sqlite"
    with ProfileStore(path) as store:
        Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
                                scenarios=(Scenario("none", 1), Scenario("data", 2), Scenario("data", 2, 3)),
                                run_options={"backend": "sim"}), store).run()
    return path


def _plan(schedule: str, stages: list[tuple[int, int, str, list[int], int]]) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 32, "num_microbatches": 2, "stages": [
        {"layers": [a, b], "parallelism": kind, "degree": len(devs), "devices": devs, **({"zero": z} if z else {})}
        for a, b, kind, devs, z in stages]})


def _validate(db: Path, plan: Plan) -> list[tuple[int, int]]:
    report = validate_plan(db, plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    return [(r.predicted, r.measured) for r in report.rows]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero1_predictions_equal_the_simulated_runtime(zero_db, schedule):
    """Layers 0-2 as 2 ZeRO-1 replicas: every device to the byte (the data stage's prediction is exact here)."""
    rows = _validate(zero_db, _plan(schedule, [(0, 3, "data", [0, 1], 1), (3, 5, "none", [2], 0)]))
    assert rows[0][0] != rows[1][0]  # uneven shares: the 32 x 32 weight on one rank, the 3 other parameters on the other
    assert [p for p, _ in rows[:2]] == [m for _, m in rows[:2]]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero1_errs_by_exactly_what_the_data_stage_errs(zero_db, schedule):
    """Layers 2-4 on 2 ranks (the 32 x 32 weight's state on one, the rest on the other), where the step sets the
    peak: the data stage's step transient is composed 2,560 bytes high from its span statistics (its own
    error). The rank stepping the 32 x 32 weight keeps the stage's largest step temporaries, so it is off by
    exactly that error, no more; the other rank's step falls below its backward, whose transient is composed
    1,640 bytes high (the data stage's other error): it is off by at most the data stage's error."""
    def errors(zero: int) -> list[int]:
        return [p - m for p, m in _validate(zero_db, _plan(schedule, [(0, 2, "none", [0], 0), (2, 5, "data", [1, 2], zero)]))]

    plain, sharded = errors(0), errors(1)
    assert plain[1] == plain[2] > 0
    assert sharded[1] == plain[1]
    assert 0 <= sharded[2] < plain[2]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero3_predictions_are_close_to_the_simulated_runtime(zero_db, schedule):
    rows = _validate(zero_db, _plan(schedule, [(0, 3, "data", [0, 1], 3), (3, 5, "none", [2], 0)]))
    for predicted, measured in rows[:2]:
        assert abs(predicted - measured) <= 0.05 * measured


@pytest.mark.parametrize("stage, why", [
    ((0, 3, "data", [0, 1], 2), "ZeRO-2 is not yet predicted"),
])
def test_unpredictable_zero_stages_are_refused(zero_db, stage, why):
    predictor = MemoryPredictor.from_db(zero_db)
    with pytest.raises(ProfileError, match=why):
        predictor.predict(_plan("1f1b", [stage, (3, 5, "none", [2], 0)]))


def test_zero3_needs_its_scenario(mlp_files):
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    with pytest.raises(ProfileError, match="no ZeRO-3 scenario"):
        predictor.predict(_plan("1f1b", [(0, 3, "data", [0, 1], 3), (3, 5, "none", [2], 0)]))


def test_the_search_shards_data_stages_when_it_lowers_the_peak(zero_db):
    """``PlanSpace(zero=True)``: on 1x2 the MLP's best plan can only get lower; a chosen ZeRO stage becomes a plan
    whose prediction is the searched value."""
    from hybridplan.search import PlanSpace, solve_exact

    predictor = MemoryPredictor.from_db(zero_db)
    plain = solve_exact(predictor, PlanSpace(5, 1, 2))
    sharded = solve_exact(predictor, PlanSpace(5, 1, 2, zero=True))
    assert sharded.peak <= plain.peak
    # by hand: 5 layers on 2 devices are two 1-device stages or one 2-device stage over all layers; ZeRO-1 of
    # that stage only removes optimizer state, so wherever data x2 is allowed its ZeRO-1 form is lower
    whole = predictor.stage_memory(0, 5, "data", 2, 0)
    assert predictor.stage_memory(0, 5, "data", 2, 0, zero=1) < whole
    plan = sharded.to_plan(schedule=predictor.schedule, global_batch_size=predictor.global_batch_size,
                           num_microbatches=predictor.num_microbatches)
    assert max(d.peak_memory_bytes for d in predictor.predict(plan).devices) == round(sharded.peak)


BF16 = {"backend": "sim", "precision": "bf16"}


@pytest.fixture(scope="module")
def bf16_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP profiled in bf16 on 1x4 simulated devices: pipeline, data x2 and data x2 with ZeRO-3."""
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore

    path = tmp_path_factory.mktemp("zero_bf16") / "p.sqlite"
    with ProfileStore(path) as store:
        Campaign(CampaignConfig(model=MLP, cluster=Cluster.parse("1x4"), global_batch_size=32, num_microbatches=2,
                                scenarios=(Scenario("none", 1), Scenario("data", 2), Scenario("data", 2, 3)),
                                run_options=BF16), store).run()
    return path


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_in_bf16_is_predicted_to_the_byte(bf16_db, zero):
    """Mixed precision (runtime/sharding.py): ZeRO-1 shards the fp32 master copies with the moments (12 bytes per
    element of the share) and steps with an fp32 copy of one gradient; ZeRO-3 keeps fp32 shards as its masters,
    so its ranks differ by fp32 state as in fp32 (from its data2-zero3 scenario profiled in bf16). Layers 0-2 on
    2 ranks (ZeRO-1: the 32 x 32 weight's state on one, the three others' on the other): both to the byte."""
    plan = _plan("gpipe", [(0, 3, "data", [0, 1], zero), (3, 5, "none", [2], 0)])
    report = validate_plan(bf16_db, plan, cluster=Cluster.parse("1x3"), model=MLP, run_options=BF16)
    assert report.run.ok, report.run.reason
    rows = [(r.predicted, r.measured) for r in report.rows[:2]]
    assert rows == [(m, m) for _, m in rows]
    assert zero == 3 or rows[0] != rows[1]
