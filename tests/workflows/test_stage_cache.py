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
    assert [stage_key(gpipe, i)[-1] for i in range(4)] == ["0"] * 4
    assert [stage_key(one, i).rsplit(",", 1)[1] for i in range(4)] == ["2", "2", "1", "0"]  # min(after, m)


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
    sharded = Plan.from_dict({**plans[0].to_dict(), "stages": [
        {**plans[0].to_dict()["stages"][0], "parallelism": "data", "tensor_degree": 1, "zero": 3},
        plans[0].to_dict()["stages"][1]]})
    with pytest.raises(ValueError, match="is ZeRO-sharded: its devices differ"):
        stage_key(sharded, 0)


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
