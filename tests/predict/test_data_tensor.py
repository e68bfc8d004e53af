"""[Note: a data x tensor stage is a tensor stage at a smaller batch] (predict/plan_prediction.py): a "data+tensor" stage is
predicted from the tensor scenario's statistics, and the prediction equals what the simulated runtime measures
(byte-exact: simulated devices are byte-identical to the real CPU runtime, tests/runtime/test_sim_agreement.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.workflows.validate import validate_plan
from tests.cli.conftest import MLP


def _plan(schedule: str, stages: list[dict]) -> Plan:
    return Plan.from_dict({"schedule": schedule, "global_batch_size": 32, "num_microbatches": 2, "stages": stages})


DT = {"parallelism": "data+tensor", "degree": 4, "tensor_degree": 2}


def _sharded_rows(mlp_files, plan: Plan, stage: int, **kwargs):
    """The validation rows of ``plan``'s 4-device ``stage`` (run whole on simulated devices, predicted from
    ``mlp_files``' profile)."""
    report = validate_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"}, **kwargs)
    assert report.run.ok, report.run.reason
    rows = [r for r in report.rows if r.stage == stage]
    assert len(rows) == 4
    return rows


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages", [
    [{"layers": [0, 2], **DT, "devices": [0, 1, 2, 3]}, {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}],
    [{"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]}, {"layers": [3, 5], **DT, "devices": [2, 3, 4, 5]}],
])
def test_data_tensor_predictions_equal_the_simulated_runtime(mlp_files, schedule, stages):
    plan = _plan(schedule, stages)
    report = validate_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    assert [(r.predicted, r.measured) for r in report.rows] == [(r.measured, r.measured) for r in report.rows]


def test_a_data_tensor_stage_is_its_tensor_stage_at_the_replica_batch(mlp_files):
    """By hand: replica micro-batches of 16 / 2 = 8 rows, as a tensor x2 stage of a global batch of 16."""
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    composite = _plan("1f1b", [{"layers": [0, 2], **DT, "devices": [0, 1, 2, 3]},
                               {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}])
    tensor = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [2]}]})
    assert predictor.predict(composite).devices[0].peak_memory_bytes == predictor.predict(tensor).devices[0].peak_memory_bytes
    # the pipeline-only stage after it still sees the whole batch
    assert predictor.predict(composite).devices[4].peak_memory_bytes != predictor.predict(tensor).devices[2].peak_memory_bytes


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_zero1_data_tensor_predictions_equal_the_simulated_runtime(mlp_files, schedule):
    """[Note: ZeRO-1 of a data x tensor stage] (predict/zero_layout.py): layers 0-1 as 2 replicas of a tensor x2 group
    whose shards' AdamW state ZeRO-1 splits over each tensor rank's data group. By hand (a column-parallel
    Linear(16, 32): shards of 16 x 16 and 16 elements) one replica keeps the weight shard's moments, the other
    the bias shard's, each with one step count: the replicas differ, every device predicted to the byte."""
    plan = _plan(schedule, [{"layers": [0, 2], **DT, "zero": 1, "devices": [0, 1, 2, 3]},
                            {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}])
    report = validate_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse("1x5"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    rows = [(r.predicted, r.measured) for r in report.rows]
    assert rows == [(m, m) for _, m in rows]
    measured = [d.static_memory_bytes for d in report.run.devices[:4]]
    predicted = [d.quantities["static"] for d in report.prediction.devices[:4]]
    for static in (measured, predicted):  # replica 0 is devices 0 and 1, replica 1 devices 2 and 3
        assert static[0] == static[1] and static[2] == static[3]
        assert static[0] - static[2] == 8 * (16 * 16 - 16)


def test_zero_of_a_data_tensor_stage_the_profile_cannot_predict_is_refused(mlp_files):
    """Any ZeRO level without the shards' shapes."""
    from hybridplan.errors import ProfileError
    from hybridplan.predict.zero_layout import ZeroLayout

    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    def plan(zero: int) -> Plan:
        return _plan("1f1b", [{"layers": [0, 2], **DT, "zero": zero, "devices": [0, 1, 2, 3]},
                              {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}])

    assert predictor.zero_layout is not None
    predictor.zero_layout = ZeroLayout([[[e, *s] for e, s in layer] for layer in predictor.zero_layout.shapes])  # none recorded
    with pytest.raises(ProfileError, match="does not record the tensor x2 parameter shards"):
        predictor.predict(plan(1))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("stages", "tolerance"), [
    ([{"layers": [0, 2], **DT, "zero": 3, "devices": [0, 1, 2, 3]},
      {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}], 0.0),  # measured: to the byte
    # measured: 14,056 predicted, 14,568 bytes (-3.51%): a 512-byte transient of this 2-layer span the rules miss
    ([{"layers": [0, 1], "parallelism": "none", "degree": 1, "devices": [0]},
      {"layers": [1, 3], **DT, "zero": 3, "devices": [1, 2, 3, 4]},
      {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [5]}], 0.04),
    # two layers with parameters, the first backward after two forwards under both schedules (measured: 15,856 bytes;
    # predicted +3.03% under 1F1B, -0.61% under GPipe): layer 0 does not set its suffix's first backward, so
    # [Note: a first backward after several forwards] does not apply
    ([{"layers": [0, 3], **DT, "zero": 3, "devices": [0, 1, 2, 3]},
      {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [4]}], 0.04),
])
def test_zero3_data_tensor_predictions_against_the_simulated_runtime(mlp_files, schedule, stages, tolerance):
    """[Note: ZeRO-3 composed from an unsharded stage] (predict/zero3_transients.py): the tensor x2 stage at the replica's batch,
    its static and gradient moved to each rank's chunks of the shards (exact: the replicas' chunks of the
    column-parallel Linear(16, 32)'s 16 x 16 weight and 16 bias shards are 8 rows each, even), its transients by
    the ZeRO-3 rules with the shards' gathered bytes; the expectation is the simulated runtime's count."""
    plan = _plan(schedule, stages)
    report = validate_plan(mlp_files / "p.sqlite", plan, cluster=Cluster.parse(f"1x{plan.num_devices}"), model=MLP,
                           run_options={"backend": "sim"})
    assert report.run.ok, report.run.reason
    zero = [i for i, s in enumerate(plan.stages) if s.zero][0]
    rows = [r for r in report.rows if r.stage == zero]
    assert len(rows) == 4
    for row in rows:
        assert abs(row.predicted - row.measured) <= tolerance * row.measured, (row.device, row.predicted, row.measured)
    measured = {d.device: d.static_memory_bytes for d in report.run.devices}
    predicted = {d.device: d.quantities["static"] for d in report.prediction.devices}
    assert all(predicted[r.device] == measured[r.device] for r in rows)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("layers", [[0, 2], [1, 3]])
def test_zero2_data_tensor_predictions_against_the_simulated_runtime(mlp_files, schedule, layers):
    """[Note: ZeRO-3 composed from an unsharded stage] (predict/zero3_transients.py): the composed ZeRO-3 stage replayed with the
    ZeRO-2 transients; the expectation is the simulated runtime's count."""
    before = [{"layers": [0, layers[0]], "parallelism": "none", "degree": 1, "devices": [0]}] if layers[0] else []
    after = [{"layers": [layers[1], 5], "parallelism": "none", "degree": 1}] if layers[1] < 5 else []
    first = len(before)
    stages = before + [{"layers": layers, **DT, "zero": 2, "devices": [first + i for i in range(4)]}] + [
        {**s, "devices": [first + 4]} for s in after]
    for row in _sharded_rows(mlp_files, _plan(schedule, stages), first):
        assert abs(row.predicted - row.measured) <= 0.02 * row.measured, (row.device, row.predicted, row.measured)


def test_zero3_data_tensor_under_gpipe_is_predicted_and_searched(mlp_files):
    """[Note: a first backward after several forwards] (predict/zero3_transients.py): ZeRO-3 of a data x tensor stage under GPipe
    is predicted (against the simulated runtime in
    :func:`test_zero3_data_tensor_predictions_against_the_simulated_runtime`), so the memory search keeps it."""
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    stages = [{"layers": [0, 2], **DT, "zero": 3, "devices": [0, 1, 2, 3]},
              {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [4]}]
    assert predictor.predict(_plan("gpipe", stages)).devices[0].peak_memory_bytes > 0
    assert predictor.retargeted(schedule="gpipe").allowed(0, 2, "data+tensor", 4, tensor_degree=2, zero=3)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("zero", "layers", "tolerance"), [
    (3, [0, 3], 0.0), (2, [0, 3], 0.0),  # measured: 17,808 bytes on every rank under both schedules
    (3, [1, 3], 0.0),  # 14,568 bytes
    # ZeRO-2 measures 14,056 bytes, 512 below ZeRO-3, which its peak is taken to be at least (+3.64%)
    (2, [1, 3], 0.04),
])
def test_recomputed_zero_data_tensor_predictions_against_the_simulated_runtime(mlp_files, mlp_recompute_db, schedule,
                                                                               zero, layers, tolerance):
    """[Note: a recomputed ZeRO-3 stage] (predict/zero3_transients.py): a recomputed ZeRO-2/3 data x tensor stage is
    composed from the recompute profile's tensor stage (refused until 28 Nov; composed as a stage that is not
    recomputed, layers 0-2 came out +8.81%, its first layer's moment taken from a suffix its ReLU and head set); the
    expectation is the simulated runtime's count."""
    first = 1 if layers[0] else 0
    before = [{"layers": [0, layers[0]], "parallelism": "none", "degree": 1, "devices": [0]}] if first else []
    plan = _plan(schedule, before + [
        {"layers": layers, **DT, "zero": zero, "recompute": "full", "devices": [first + i for i in range(4)]},
        {"layers": [layers[1], 5], "parallelism": "none", "degree": 1, "devices": [first + 4]}])
    for row in _sharded_rows(mlp_files, plan, first, recompute_db=mlp_recompute_db):
        assert abs(row.predicted - row.measured) <= tolerance * row.measured, (row.device, row.predicted, row.measured)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("zero", "layers", "tolerance"), [
    # the ReLU's backward holds the head's reduce-scatter input and gradient shard (refused until 28 Nov: composed
    # as a stage before the head, -3.1% under 1F1B and -5.9% under GPipe)
    (3, [3, 5], 0.01), (2, [3, 5], 0.01),
    # layer 2's backward holds the head's reduce-scatter input too, but not the gradient the head handed back
    # (+6.55% under GPipe with it and with the head gathered again twice), nor does layer 0's
    (3, [2, 5], 0.01), (3, [0, 5], 0.01),
    # ZeRO-2 keeps the ZeRO-3 bound (measured +3.08% and +2.71%)
    (2, [2, 5], 0.035), (2, [0, 5], 0.03),
])
def test_zero_data_tensor_stages_holding_the_last_layer(mlp_files, schedule, zero, layers, tolerance):
    """[Note: the layers before the head] (predict/zero3_transients.py): a ZeRO-2/3 data x tensor stage that ends
    the model, its layers before the head composed from the tensor stage's suffixes without the head; the
    expectation is the simulated runtime's count."""
    for row in _sharded_rows(mlp_files, _ending_plan(schedule, zero, layers), 1 if layers[0] else 0):
        assert abs(row.predicted - row.measured) <= tolerance * row.measured, (row.device, row.predicted, row.measured)


def _ending_plan(schedule: str, zero: int, layers: list[int], **stage: object) -> Plan:
    """``layers`` (ending the model) as a ZeRO ``zero`` data x tensor 2 x 2 stage after a pipeline-only one."""
    before = [{"layers": [0, layers[0]], "parallelism": "none", "degree": 1, "devices": [0]}] if layers[0] else []
    first = len(before)
    return _plan(schedule, before + [{"layers": layers, **DT, "zero": zero, **stage,
                                      "devices": [first + i for i in range(4)]}])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("zero", [2, 3])
def test_recomputed_zero_data_tensor_stages_holding_the_last_layer(mlp_files, mlp_recompute_db, schedule, zero):
    """[Note: the layers before the head] under recompute: the MLP's layers 3-5 (a ReLU, then the head), whose
    ReLU holds the head's reduce-scatter input and gradient shard (refused until 28 Nov; with the recomputed
    composition alone -6.06% .. -5.88% under GPipe, -3.21% .. -3.09% under 1F1B); the expectation is the simulated
    runtime's count."""
    plan = _ending_plan(schedule, zero, [3, 5], recompute="full")
    for row in _sharded_rows(mlp_files, plan, 1, recompute_db=mlp_recompute_db):
        assert abs(row.predicted - row.measured) <= 0.01 * row.measured, (row.device, row.predicted, row.measured)


@pytest.fixture(scope="module")
def big_vocabulary(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[bool, Path]]:
    """A 2-block Llama whose embedding outweighs everything its rows hold (32,768 x 64; bf16, CUDA allocator), as
    a HuggingFace config folder, and its profiles on 1x4 (pipeline and tensor x2), plain and recomputed."""
    import json

    from hybridplan.models.hf_config import HF_CONFIGS
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.store import ProfileStore

    folder = tmp_path_factory.mktemp("big_vocabulary")
    (folder / "config.json").write_text(json.dumps({**HF_CONFIGS["llama-tiny"], "vocab_size": 32768,
                                                    "hidden_size": 64}))
    model, dbs = f"hf:{folder}", {}
    for recompute in (False, True):
        dbs[recompute] = folder / f"p{int(recompute)}.sqlite"
        with ProfileStore(dbs[recompute]) as store:
            Campaign(CampaignConfig(model=model, cluster=Cluster.parse("1x4"), global_batch_size=8, num_microbatches=2,
                                    scenarios=(Scenario("none", 1), Scenario("tensor", 2)), neighbors=1,
                                    run_options={**BIG_VOCABULARY_RUN, "backend": "sim",
                                                 **({"activation_checkpointing": True} if recompute else {})}),
                     store).run()
    return model, dbs


BIG_VOCABULARY_RUN = {"precision": "bf16", "device_type": "cuda"}


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("zero", [2, 3])
def test_the_models_first_layer_alone_holds_its_reduce_scatter(big_vocabulary, zero, recompute):
    """[Note: the first layer's reduce-scatter] (predict/composed_zero.py): the embedding alone as data 2 x tensor 2,
    ZeRO-2 or ZeRO-3, holds its gathered bytes, whole gradients and the reduce-scatter's output with its fp32 copy at
    once; composed from the layer's own phase it was 13.3% low (19.96% recomputed). Within 0.05% of the simulated
    devices, none below."""
    model, dbs = big_vocabulary
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 1], **DT, "zero": zero, "devices": [0, 1, 2, 3], **({"recompute": "full"} if recompute else {})},
        {"layers": [1, 4], "parallelism": "none", "degree": 1, "devices": [4]}]})
    report = validate_plan(dbs[False], plan, cluster=Cluster.parse("1x5"), model=model, recompute_db=dbs[True],
                           run_options={**BIG_VOCABULARY_RUN, "backend": "sim"})
    assert report.run.ok, report.run.reason
    rows = [(r.predicted, r.measured) for r in report.rows if r.stage == 0]
    assert len(rows) == 4
    for predicted, measured in rows:
        assert 0 <= predicted - measured <= 0.0005 * measured, (predicted, measured)
