"""The stage cache gives every device the bytes a whole-plan simulation gives, simulating each stage once."""

from __future__ import annotations

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.workflows.runs import measure_plan, plan_from_choices
from hybridplan.workflows.stage_cache import StageCache, stage_key
from hybridplan.search import PlanSpace, enumerate_plans

MLP = "tests.cli.user_models:mlp"  # 5 layers


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_cache_matches_whole_plan_simulation(tmp_path, schedule):
    cluster = Cluster.parse("2x2")
    space = PlanSpace.for_cluster(cluster, 5)
    plans = [plan_from_choices(space, c, schedule=schedule, global_batch_size=16, num_microbatches=4)
             for c in list(enumerate_plans(space))[::11][:3]]
    cache = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster, run_options={"backend": "sim"})
    for plan in plans:
        whole = measure_plan(None, plan, cluster=cluster, backend="sim", model=MLP)
        assert whole.status == "ok"
        assert [d.measured for d in cache.measure(plan)] == [d.measured for d in whole.devices]
    distinct = {stage_key(p, i) for p in plans for i in range(p.num_stages)}
    assert cache.simulated == len(distinct) < sum(p.num_stages for p in plans)
    again = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster)  # reloaded from the file
    again.measure(plans[0])
    assert again.simulated == 0


def test_stage_key_follows_the_schedule():
    space = PlanSpace(5, 1, 4, pipeline_only=True)
    choices = next(iter(enumerate_plans(space)))
    gpipe = plan_from_choices(space, choices, schedule="gpipe", global_batch_size=8, num_microbatches=2)
    one = plan_from_choices(space, choices, schedule="1f1b", global_batch_size=8, num_microbatches=2)
    assert [stage_key(gpipe, i).split(",")[-2:] for i in range(4)] == [["0", "gpipe"]] * 4
    assert [stage_key(one, i).rsplit(",", 1)[1] for i in range(4)] == ["2", "2", "1", "0"]  # min(after, m)


def test_one_cache_serves_both_schedules(tmp_path):
    """GPipe's last stage and 1F1B's have no warm-up forwards alike but hold different bytes (GPipe keeps every
    micro-batch in flight): the cache keeps them apart, each equal to its whole-plan simulation."""
    cluster = Cluster.parse("1x2")
    space = PlanSpace(5, 1, 2, pipeline_only=True)
    choices = next(iter(enumerate_plans(space)))
    plans = [plan_from_choices(space, choices, schedule=s, global_batch_size=16, num_microbatches=4)
             for s in ("gpipe", "1f1b")]
    cache = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster, run_options={"backend": "sim"})
    measured = [[d.measured for d in cache.measure(p)] for p in plans]
    for p, got in zip(plans, measured):
        assert got == [d.measured for d in measure_plan(None, p, cluster=cluster, backend="sim", model=MLP).devices]
    assert measured[0][1] != measured[1][1] and cache.simulated == 4


def test_data_x_tensor_stages_are_cached_by_their_tensor_degree(tmp_path):
    """Degree 4 on 1x4 is 2 replicas of tensor x2, or one tensor x4 group; a recomputed stage differs too;
    every cached device matches a whole-plan simulation."""
    from hybridplan.plan import Plan

    cluster = Cluster.parse("1x8")

    def plan(stage0: dict) -> Plan:
        return Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 2, "stages": [
            {"layers": [0, 3], "devices": [0, 1, 2, 3], **stage0},
            {"layers": [3, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [4, 5, 6, 7]}]})

    plans = [plan({"parallelism": "data+tensor", "degree": 4, "tensor_degree": 2}),
             plan({"parallelism": "tensor", "degree": 4}),
             plan({"parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "recompute": "full"})]
    assert len({stage_key(p, 0) for p in plans}) == 3
    cache = StageCache(tmp_path / "stages.json", model="gpt-tiny", cluster=cluster)
    for p in plans:
        whole = measure_plan(None, p, cluster=cluster, backend="sim", model="gpt-tiny")
        assert [d.measured for d in cache.measure(p)] == [d.measured for d in whole.devices]
    assert cache.simulated == 4  # stage 1 is the same in all three


def test_cuda_stages_keep_their_reserved_peak_and_an_older_file_is_completed(tmp_path):
    """On simulated CUDA devices each stage's reserved peak is kept beside its tensor peak, equal to a whole-plan
    simulation's; a cache file written before (tensor peaks only) makes its stages simulated once more."""
    import json

    cluster = Cluster.parse("1x4", device_type="cuda")
    space = PlanSpace.for_cluster(cluster, 5, pipeline_only=True)
    plan = plan_from_choices(space, next(iter(enumerate_plans(space))), schedule="1f1b", global_batch_size=8,
                             num_microbatches=2)
    options = {"backend": "sim", "device_type": "cuda"}
    cache = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster, run_options=options)
    cache.measure(plan)
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate

    whole = simulate(RunConfig(model=MLP, plan=plan, cluster=cluster, iterations=2, **options), distinct_only=False)
    assert cache.reserved_peaks(plan) == {d.device: d.reserved_peak_bytes for d in whole.devices}
    saved = json.loads((tmp_path / "stages.json").read_text())
    del saved["reserved"]
    (tmp_path / "stages.json").write_text(json.dumps(saved))
    older = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster, run_options=options)
    assert older.reserved_peaks(plan) == {}
    older.measure(plan)
    assert older.simulated == plan.num_stages and older.reserved_peaks(plan) == cache.reserved_peaks(plan)


def test_zero_stages_are_cached_device_by_device(tmp_path):
    """A ZeRO stage's devices hold different shares: the cache keeps each device's peak, in device-list order,
    equal to a whole-plan simulation's, and reuses them where the same stage sits on other devices (data x4 over
    both nodes of 2x2 as well)."""
    from hybridplan.plan import Plan

    cluster = Cluster.parse("2x2")

    def plan(*stages: dict) -> Plan:
        return Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4,
                               "stages": list(stages)})

    zero3 = {"layers": [2, 5], "parallelism": "data", "degree": 2, "zero": 3, "devices": [2, 3]}
    plans = [plan({"layers": [0, 2], "parallelism": "data", "degree": 2, "zero": 1, "devices": [0, 1]}, zero3),
             plan({"layers": [0, 1], "parallelism": "none", "degree": 1, "devices": [0]},
                  {"layers": [1, 2], "parallelism": "none", "degree": 1, "devices": [1]}, zero3),
             plan({"layers": [0, 5], "parallelism": "data", "degree": 4, "zero": 1, "devices": [0, 1, 2, 3]})]
    cache = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster, run_options={"backend": "sim"})
    measured = []
    for p in plans:
        whole = measure_plan(None, p, cluster=cluster, backend="sim", model=MLP)
        assert whole.status == "ok"
        measured.append([d.measured for d in cache.measure(p)])
        assert measured[-1] == [d.measured for d in whole.devices]
    assert cache.simulated == 5  # the ZeRO-3 stage [2, 5) once, though in two plans
    assert measured[0][0] != measured[0][1]  # ZeRO-1's two shares differ: one peak per device is needed
    again = StageCache(tmp_path / "stages.json", model=MLP, cluster=cluster)  # per-device lists reload too
    assert [d.measured for d in again.measure(plans[2])] == measured[2] and again.simulated == 0
    unordered = plan({"layers": [0, 5], "parallelism": "data", "degree": 4, "zero": 1, "devices": [1, 0, 2, 3]})
    with pytest.raises(ValueError, match="not in ascending order"):
        stage_key(unordered, 0)


def test_one_file_keeps_each_settings_stages_and_refuses_another_model(tmp_path):
    """fp32 then bf16 on one file: each answer is its own setting's whole-plan simulation (the options are in the
    keys); the file names its model, and another model's cache is refused before anything is simulated."""
    from hybridplan.errors import UsageError

    cluster = Cluster.parse("1x2")
    space = PlanSpace(5, 1, 2, pipeline_only=True)
    plan = plan_from_choices(space, next(iter(enumerate_plans(space))), schedule="1f1b", global_batch_size=16,
                             num_microbatches=4)
    path = tmp_path / "stages.json"
    answers = {}
    for precision in ("fp32", "bf16"):
        cache = StageCache(path, model=MLP, cluster=cluster, run_options={"backend": "sim", "precision": precision})
        answers[precision] = [d.measured for d in cache.measure(plan)]
        assert cache.simulated == plan.num_stages  # nothing answered from the other setting's entries
        whole = measure_plan(None, plan, cluster=cluster, backend="sim", model=MLP,
                             run_options={"precision": precision})
        assert answers[precision] == [d.measured for d in whole.devices]
    assert answers["fp32"] != answers["bf16"]
    with pytest.raises(UsageError, match="holds stages of model") as info:
        StageCache(path, model="gpt-tiny", cluster=cluster)
    assert str(path) in (info.value.fix or "")


@pytest.mark.parametrize("text", ["nope", "[1, 2]", "\udcff"])
def test_a_file_that_is_no_stage_cache_is_refused_with_the_fix(tmp_path, text):
    from hybridplan.errors import UsageError

    path = tmp_path / "stages.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(UsageError, match="stage cache") as info:
        StageCache(path, model=MLP, cluster=Cluster.parse("1x2"))
    assert f"delete {path}" in (info.value.fix or "")
