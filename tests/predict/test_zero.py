"""[Note: predicting ZeRO from a profile] (predict/zero.py): ZeRO-1 stages are the data stage's prediction with
each device's share of the optimizer state, recomputed from the parameter shapes (byte-exact against the
simulated runtime, which is byte-identical to the real CPU runtime: tests/runtime/test_sharding.py); ZeRO-3
stages come from a profiled ``data<d>-zero3`` scenario; what cannot be predicted is refused, saying why."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hybridplan.errors import ProfileError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
import numpy as np

from hybridplan.predict.zero import (ZeroLayout, Zero2Transients, first_backward_prefetch_floor, fsdp_rows, gathered_backward_transient, loss_phases,
                                     prefetched_bytes, sharded_backward_floor, sharded_forward_transient, zero1_shares,
                                     zero2_peak)
from hybridplan.predict.zero_stage import zero_peaks
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP

# Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10): parameters [32, 16], [32], [32, 32], [32], [10, 32], [10]
MLP_SHAPES = [[[4, 32, 16], [4, 32]], [], [[4, 32, 32], [4, 32]], [], [[4, 10, 32], [4, 10]]]


def test_zero1_partition_is_greedy_by_size():
    # by hand: sizes 512, 32, 1024, 32 on 2 ranks: 1024 -> rank 0; 512 -> rank 1; 32 (first) -> rank 1; 32 -> rank 1
    assert zero1_shares([512, 32, 1024, 32], 2) == [[2], [0, 1, 3]]
    # ties go to the lowest rank, equal sizes keep their order
    assert zero1_shares([5, 5, 5], 3) == [[0], [1], [2]]


def test_a_zero3_rank_against_the_unsharded_stage_by_hand():
    """[Note: ZeRO-3 composed from an unsharded stage]: one fp32 parameter of 5 x 3 over 2 ranks, chunks of 3 and 2
    rows. Each rank stores the padded 3-row chunk (36 bytes, not 60) and its gradient shard likewise, the moments of
    its own rows (72 and 48 bytes, not 120) and one step counter; it steps its own chunk (2 temporaries of 36 and 24
    bytes, not 60)."""
    layout = ZeroLayout([[[4, 5, 3]]])
    assert layout.stored_bytes(0, 1, 2) == 36
    assert layout.unsharded_shift(0, 1, 2, 0) == ((36 - 60) + (72 - 120), 36 - 60, 2 * (36 - 60))
    assert layout.unsharded_shift(0, 1, 2, 1) == ((36 - 60) + (48 - 120), 36 - 60, 2 * (24 - 60))


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


def test_gathered_bytes_pad_each_parameter_to_whole_chunks():
    layout = ZeroLayout(MLP_SHAPES)
    # 2 ranks: [32, 16] + [32] -> 4 * 544; the ReLU has none; [32, 32] + [32] -> 4 * 1056
    assert layout.gathered_bytes(0, 3, 2) == [4 * 544, 0, 4 * 1056]
    # 4 ranks: [10, 32] is gathered as 4 chunks of 3 rows (12 rows), [10] as 4 chunks of 3
    assert layout.gathered_bytes(4, 5, 4) == [4 * (12 * 32 + 12)]


def test_zero2_transients_by_hand():
    # the data stage's prefixes: forward transients 10, 30, 25, activations 5, 12, 20; gathered 4, 8, 2 bytes.
    # Layer 0: 10 + 2 * 4; layer 1 raises the transient: 30 + 2 * 8; layer 2 does not: at least the activations
    # before it, 12 + 2 * 2. ZeRO-3: the largest, 46. ZeRO-2 keeps the earlier layers: 18, 46 + 4, 16 + 12 -> 50
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=False) == 46
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 2], keep=True) == 50
    # layer 2 would set it with a large all-gather: 12 + 2 * 40 (+ 12 kept)
    assert sharded_forward_transient([10, 30, 25], [5, 12, 20], [4, 8, 40], keep=True) == 104
    # suffixes' backward transients (layers 0.., 1.., 2..) 50, 70, 40: layer 2 sets 40 - 5, layer 1 70 - (20 + 5)
    assert gathered_backward_transient([50, 70, 40], [10, 20, 5], 0) == 45
    # 50, 30, 40: layer 1 raises nothing; layer 0 raises it to 50, which is 50 - 35 = 15 under ZeRO-2; layer 2's 35
    assert gathered_backward_transient([50, 30, 40], [10, 20, 5], 0) == 35


def test_prefetched_layer_by_hand():
    # suffixes' backward transients 50, 70, 40: layer 1 sets it; the layer before it with parameters is prefetched
    assert prefetched_bytes([50, 70, 40], [10, 20, 5]) == 10
    assert prefetched_bytes([50, 70, 40], [10, 0, 5]) == 10  # layer 1 has no parameters: layer 0 still
    assert prefetched_bytes([50, 70, 40], [0, 20, 5]) == 0  # nothing before it to prefetch
    assert prefetched_bytes([50, 30, 40], [10, 20, 5]) == 0  # layer 0 raises it to 50: nothing before layer 0
    assert prefetched_bytes([60, 60, 60], [10, 20, 5]) == 20  # the last layer sets it, the others add nothing


def test_first_backward_prefetch_floor_of_wresnet_tiny_as_measured():
    """[Note: a first backward after several forwards]: wresnet-tiny's layers 4-5 as data 2 x tensor 2, ZeRO-3,
    global batch 64 in 4 micro-batches (simulated devices): the first backward measured 903,296 bytes above its
    level under GPipe and 1F1B alike, while layer 4 ran with layer 5 gathered again (traced op by op). From the
    tensor x2 stage's first-backward suffixes at the replica's batch (380,544 from layer 4, 322,176 from layer 5),
    the shards' gathered bytes (75,392 and 298,240) and their halves: 380,544 - 298,240 + 149,120 + 75,392 +
    2 x 298,240 = 903,296."""
    assert first_backward_prefetch_floor([380544, 322176], [75392, 298240], [75392, 298240], [37696, 149120]) == 903296
    # one layer with parameters: nothing to prefetch again
    assert first_backward_prefetch_floor([380544, 322176], [0, 298240], [0, 298240], [0, 149120]) == -math.inf


def test_sharded_backward_floor_by_hand():
    # the data stage's suffixes 50, 70, 40; gathered 10, 20, 5: layer 2 sets 40 (+ its 5 + layer 1's 20 prefetched),
    # layer 1 raises it to 70 (+ 20 + layer 0's 10), layer 0 raises nothing
    assert sharded_backward_floor([50, 70, 40], [10, 20, 5]) == 100
    assert sharded_backward_floor([90, 70, 40], [10, 20, 5]) == 100  # layer 0: 90 + 10, nothing before it


def test_sharded_backward_floor_at_the_loss_by_hand():
    """[Note: the loss runs outside every FSDP unit]: the data stage's suffixes 35, 40 (layer 1 the model's last),
    gathered 10, 5; its head's phase 15 and its loss's 40. Layer 1: the loss holds nothing gathered (40), the head
    its 5 and the prefetched layer 0's 10 (30): 40, where the old floor added both to the loss's 40 (55). Layer 0's
    35 is above the head's 15, so its phase counts: 35 + 10 = 45. Without the head's phase known, layer 0 must
    rise above the last layer's 40 as before: it does not."""
    assert sharded_backward_floor([35, 40], [10, 5]) == 55
    assert sharded_backward_floor([35, 40], [10, 5], loss=(15, 40)) == 45
    assert sharded_backward_floor([35, 40], [10, 5], loss=(-np.inf, 40)) == 40
    # the head's phase above the loss's: 40 + 5 + 10 = 55; layer 0's 35 is below the head's 40
    assert sharded_backward_floor([35, 40], [10, 5], loss=(40, 20)) == 55


def test_loss_phases_of_gpt_tiny_head_as_traced():
    """[Note: the loss runs outside every FSDP unit]: gpt-tiny's last layer (final norm + head, 33,280 gathered bytes
    over 2 ranks) measured alone in the data2 and data2-zero3 scenarios at micro-batches of 4 and 8 (2 and 4 rows
    per replica; benchmarks/extended_accuracy's profile), and the phases at 16 (8 rows per replica) read off the
    simulated runtime's op-by-op trace of that stage: forward, the head's matmul holds the received input 32,768,
    the norm's output 33,792 and the logits 65,536 (= 132,096), the loss holds the logits and their log-softmax
    with a few scalars (197,644); backward, the head's two matmul outputs (2 x 32,768) and the loss's two
    logits-sized gradients (2 x 65,536)."""
    forward = loss_phases([4, 8], [49_420, 98_828], [99_584, 132_608], 2 * 33_280, 16)
    assert forward == (32_768 + 33_792 + 65_536, 197_644)
    backward = loss_phases([4, 8], [40_960, 65_536], [74_240, 82_432], 33_280, 16)
    assert backward == (2 * 32_768, 2 * 65_536)
    # the loss never set the data stage's value (ZeRO-3 a whole 2G above it at both sizes): no loss phase
    assert loss_phases([4, 8], [10, 20], [30, 40], 20, 16) == (40.0, -np.inf)


WIDE = "tests.cli.user_models:wide_head"  # Linear(16, 32), ReLU, Linear(32, 4), Linear(4, 256): a loss-heavy head


@pytest.fixture(scope="module")
def wide_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``wide_head`` profiled on 1x4 simulated devices, data x2 with and without ZeRO-3, target batch 256 in 2
    micro-batches (64 rows per replica): its loss outweighs its head's gathered parameters."""
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore

    path = tmp_path_factory.mktemp("wide") / "p.sqlite"
    with ProfileStore(path) as store:
        Campaign(CampaignConfig(model=WIDE, cluster=Cluster.parse("1x4"), global_batch_size=256, num_microbatches=2,
                                scenarios=(Scenario("data", 2), Scenario("data", 2, 3)),
                                run_options={"backend": "sim"}), store).run()
    return path


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("start", [2, 3])
def test_zero3_stage_holding_the_loss_against_the_simulated_runtime(wide_db, schedule, start):
    """A ZeRO-3 stage with the model's last layer, after a pipeline-only stage: each rank's predicted peak against
    the simulated runtime. The head alone (layers 3-4) to the byte; with the layer before it within 0.5%. Adding
    twice the head's 5,120 gathered bytes to the loss's forward (the rule before) was 1.9% to 2.6% high."""
    from hybridplan.models.boundaries import boundary_specs
    from hybridplan.models.zoo import resolve_model
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate_stage

    plan = Plan.from_dict({"schedule": schedule, "global_batch_size": 256, "num_microbatches": 2, "stages": [
        {"layers": [0, start], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [start, 4], "parallelism": "data", "degree": 2, "zero": 3, "devices": [1, 2]}]})
    cfg = RunConfig(model=WIDE, plan=plan, cluster=Cluster.parse("1x3"), backend="sim", iterations=2)
    specs = boundary_specs(resolve_model(WIDE))
    measured = [max(simulate_stage(cfg, 1, specs=specs, rank=r).iteration_peaks[1:]) for r in (1, 2)]
    predictor = MemoryPredictor.from_db(wide_db, schedule=schedule)
    predicted = zero_peaks(predictor, start, 4, "data", 3, 2, 0)
    assert predicted is not None
    for p, m in zip(predicted, measured):
        if start == 3:
            assert round(p) == m
        else:
            assert abs(p - m) <= 0.005 * m


def test_a_zero3_stage_ending_the_model_is_floored_by_the_loss_once_its_rules_are_applied(wide_db):
    """[Note: the loss's backward floor]: the loss runs outside every FSDP unit and holds nothing gathered, so a ZeRO-3
    stage's backward is at least the loss's backward at its rows: 64 a replica here (256 in 2 micro-batches, 2
    replicas). With a loss of 10**6 bytes a row (none is that heavy: the floor binds) both backwards are 64 x 10**6
    after every ZeRO-3 rule; with the profile's own (cross-entropy over 256 classes: 2,048 bytes a row), the rules'
    value stands."""
    from hybridplan.predict.zero_stage import _zero3_quantities
    from hybridplan.profiling.quantities import INDEX

    predictor = MemoryPredictor.from_db(wide_db, schedule="1f1b")
    assert predictor.loss_backward == {"samples": [1, 2], "bytes": [2_048, 4_096]}
    ruled = _zero3_quantities(predictor, 3, 4, 2, predictor.span_quantities(3, 4, "data-zero3", 2))
    predictor.loss_backward = {"samples": [1, 2], "bytes": [10**6, 2 * 10**6]}
    floored = _zero3_quantities(predictor, 3, 4, 2, predictor.span_quantities(3, 4, "data-zero3", 2))
    for name in ("first_backward_transient", "backward_transient"):
        assert floored[INDEX[name]] == 64 * 10**6 > ruled[INDEX[name]] >= 64 * 2_048
    assert floored[INDEX["forward_transient"]] == ruled[INDEX["forward_transient"]]


def test_zero2_replay_by_hand():
    """static 100, activation 10, gradient 6, gathered 50; transients F 7 (gathering) / 3 (gathered), first B 4,
    gathered B 2, B 8 (resharded), step 1."""
    q = np.array([100, 0, 10, 6, 3, 20, 8, 1])
    t = Zero2Transients(gathering_forward=7, gathered_forward=3, first_backward=4, gathered_backward=2)
    # GPipe F0 F1 B0 B1: F0 gathers (107, level 160), F1 (163, 170), B0 frees them (174, 170 + 6 - 10 - 50 = 116),
    # B1 finds them resharded (124, 106), step 107
    assert zero2_peak(q, t, 50, "gpipe", 0, 2) == 174
    # 1F1B, one stage after: F0 F1 B0 F2 B1 B2 (3 micro-batches): F0 107 -> 160, F1 163 -> 170, B0 174 -> 116,
    # F2 gathers again 123 -> 176, B1 gathered 178 -> 116, B2 resharded 114 -> 96
    assert zero2_peak(q, t, 50, "1f1b", 1, 3) == 178


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_zero2_predictions_equal_the_simulated_runtime_on_a_profiled_span(zero_db, schedule):
    """Layers 0-2 as 2 ZeRO-2 replicas (a span the data2 and data2-zero3 scenarios measured): both devices to the
    byte. The peak is the first backward's, above a level that holds every layer gathered (6,400 bytes more than
    ZeRO-3's) with a transient that much lower (no all-gather, no prefetch): replaying ZeRO-3's transient at
    ZeRO-2's level would be 6,400 bytes high."""
    rows = _validate(zero_db, _plan(schedule, [(0, 3, "data", [0, 1], 2), (3, 5, "none", [2], 0)]))
    assert [p for p, _ in rows[:2]] == [m for _, m in rows[:2]]


def test_zero2_without_the_data_scenario_at_its_degree_is_refused(zero_db):
    predictor = MemoryPredictor.from_db(zero_db)
    with pytest.raises(ProfileError, match="ZeRO-2 is predicted from the data4 and data4-zero3"):
        predictor.predict(_plan("1f1b", [(0, 5, "data", [0, 1, 2, 3], 2)]))


@pytest.mark.parametrize("zero", [2, 3])
def test_zero2_and_zero3_need_the_zero3_scenario(mlp_files, zero):
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    with pytest.raises(ProfileError, match="no ZeRO-3 scenario"):
        predictor.predict(_plan("1f1b", [(0, 3, "data", [0, 1], zero), (3, 5, "none", [2], 0)]))


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


def test_zero2_in_bf16_is_refused_naming_why(bf16_db):
    """ZeRO-2's rules count the gathered parameters at the recorded fp32 sizes; FSDP's mixed precision gathers bf16
    copies, which no profile measured: refused (the search leaves it out) rather than guessed, though the profile
    has both scenarios ZeRO-2 is predicted from in fp32."""
    predictor = MemoryPredictor.from_db(bf16_db)
    assert {("data", 2), ("data-zero3", 2)} <= set(predictor.stats)
    with pytest.raises(ProfileError, match="ZeRO-2 is not predicted from a bf16 profile"):
        predictor.predict(_plan("gpipe", [(0, 3, "data", [0, 1], 2), (3, 5, "none", [2], 0)]))
    assert predictor.stage_memory(0, 3, "data", 2, 1, zero=2) == float("inf")
    assert predictor.stage_memory(0, 3, "data", 2, 1, zero=3) < float("inf")
