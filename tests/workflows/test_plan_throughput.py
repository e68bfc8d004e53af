"""The fastest plans that fit in memory and the memory/time frontier (workflows/plan_throughput.py), on the MLP's
memory and time profiles of ``mlp_files`` (tests/conftest.py)."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.workflows.plan_memory import plan_memory
from hybridplan.workflows.plan_throughput import fits_at_target, plan_throughput
from hybridplan.workflows.sources import Sources
from tests.cli.conftest import MIXED, MLP

CLUSTER = Cluster.parse("1x4")


def _sources(files, db: bool = True) -> Sources:
    return Sources.open(files / "p.sqlite" if db else None, time_profile=str(files / "t.json"), model=MLP)


def test_candidates_fastest_first_each_priced_by_both_models(mlp_files):
    with _sources(mlp_files) as sources:
        answer = plan_throughput(sources, CLUSTER)
    profile, predictor = TimeProfile.load(mlp_files / "t.json"), MemoryPredictor.from_db(mlp_files / "p.sqlite")
    seconds = [c.seconds for c in answer.candidates]
    assert seconds == sorted(seconds) and answer.best is answer.candidates[0] and answer.global_batch_size == 32
    for c in answer.candidates:
        assert c.seconds == pytest.approx(predict_iteration_time(c.plan, profile, CLUSTER).total_s, rel=1e-12)
        assert c.peak == predictor.predict(c.plan).peak_memory_bytes
        assert c.plan.extra["predicted_iteration_s"] == c.seconds and c.plan.extra["predicted_peak_bytes"] == c.peak
        assert c.plan.extra["model"] == MLP and c.plan.extra["cluster"] == "1x4"
        assert c.samples_per_s == pytest.approx(32 / c.seconds)


def test_a_capacity_keeps_only_the_plans_that_fit(mlp_files):
    with _sources(mlp_files) as sources:
        everything = plan_throughput(sources, CLUSTER).candidates
    peaks = sorted({c.peak for c in everything})
    capacity = peaks[len(peaks) // 2]
    with _sources(mlp_files) as sources:
        kept = plan_throughput(sources, Cluster.parse("1x4", device_memory=int(capacity))).candidates
    assert kept and all(c.peak <= capacity for c in kept)
    fitting = {c.plan.stages for c in everything if c.peak <= capacity}
    assert fitting <= {c.plan.stages for c in kept}
    # the others: strategies whose fastest cut does not fit, cut again within the memory ([Note: cutting within
    # memory] in search/time/bottleneck_cuts.py)
    def strategy(plan: Plan) -> tuple[object, ...]:
        return plan.num_microbatches, tuple((s.parallelism, s.degree, s.devices) for s in plan.stages)

    too_large = {strategy(c.plan): c.plan.boundaries for c in everything if c.peak > capacity}
    for c in kept:
        if c.plan.stages not in fitting:
            assert too_large[strategy(c.plan)] != c.plan.boundaries
    with _sources(mlp_files) as sources, pytest.raises(UsageError, match="no feasible plan"):
        plan_throughput(sources, Cluster.parse("1x4", device_memory="1KiB"))


def test_the_frontier_is_non_dominated_and_reaches_the_memory_minimal_plan(mlp_files):
    with _sources(mlp_files) as sources:
        front = plan_throughput(sources, CLUSTER, objective="pareto").candidates
    points = [(c.peak, c.seconds) for c in front]
    assert [p[0] for p in points] == sorted(p[0] for p in points)
    assert [p[1] for p in points] == sorted((p[1] for p in points), reverse=True)
    lowest = plan_memory(mlp_files / "p.sqlite", CLUSTER).prediction.peak_memory_bytes
    assert points[0][0] <= lowest  # the CAPTURE search's answer is a candidate, so nothing on the front is above it
    with _sources(mlp_files, db=False) as sources, pytest.raises(UsageError, match="needs memory predictions"):
        plan_throughput(sources, CLUSTER, objective="pareto", global_batch_size=32)


def test_the_2bw_planner_plans_for_its_own_schedule(mlp_files):
    with _sources(mlp_files) as sources:
        answer = plan_throughput(sources, CLUSTER, mode="2bw")
    assert answer.candidates and all(c.plan.schedule == "2bw" and c.label.startswith("2bw w=") for c in answer.candidates)
    with _sources(mlp_files) as sources, pytest.raises(UsageError, match="whose schedule is '2bw', not 'gpipe'"):
        plan_throughput(sources, CLUSTER, mode="2bw", schedule="gpipe")


def test_fits_at_target_keeps_the_micro_batch_count_and_the_capacity(mlp_files):
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    plan = Plan.from_dict(MIXED)
    peak = predictor.predict(plan).peak_memory_bytes
    fits = fits_at_target(predictor, get_model(MLP), CLUSTER, capacity=peak)
    assert fits(plan) and not fits_at_target(predictor, get_model(MLP), CLUSTER, capacity=peak - 1)(plan)
    assert not fits(Plan.from_dict({**MIXED, "num_microbatches": 4}))  # another micro-batch count
    assert not fits_at_target(predictor, get_model(MLP), Cluster.parse("1x3"), capacity=peak)(plan)  # no device 3


# ------------------------------------------------------------------ the extended space (issue 11): ZeRO, recompute
@pytest.fixture
def sharded(sharded_mlp_files):
    return sharded_mlp_files


def _extended(files, cluster: Cluster, gbs: int, objective: str = "throughput", **options):  # type: ignore[no-untyped-def]
    with _sources(files) as sources:
        return plan_throughput(sources, cluster, global_batch_size=gbs, objective=objective, **options)  # type: ignore[arg-type]


def _every_combination(files, cluster: Cluster, gbs: int, answer, recompute: bool) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """(peak, seconds) of every plan of the extended space as the search defines it, by enumeration: each strategy
    (pp, dp, tp, mbs) with the search's cut, each stage with every ZeRO level and recompute choice, kept where
    every device fits (the answer's own feasibility check, which holds the predictor with the recompute profile)."""
    import itertools

    from hybridplan.search.time.rank_placement import megatron_placement
    from hybridplan.search.time.stage_options import stage_options, with_options
    from hybridplan.search.time.strategy_cut import assign_layers
    from hybridplan.search.time.throughput import divisors, enumerate_degrees

    profile, fit = answer.profile, answer.feasibility
    points = []
    for pp, dp, tp in enumerate_degrees(cluster.num_devices, profile.num_layers, (1, 2), plan_expressible=False):
        for mbs in divisors(gbs // dp):
            plan = assign_layers(profile, cluster, megatron_placement(cluster, pp, dp, tp), pipeline_degree=pp,
                                 data_degree=dp, tensor_degree=tp, micro_batch_size=mbs, global_batch_size=gbs)
            for combo in itertools.product(*(stage_options(s, (1, 2, 3), recompute) for s in plan.stages)):
                mixed = with_options(plan, combo)
                if fit(mixed):
                    points.append((fit.peak_memory(mixed), predict_iteration_time(mixed, profile, cluster).total_s))
    return points


def test_zero_makes_a_plan_fit_and_is_the_fastest_of_every_combination(sharded):
    """At a batch of 512 on 1x2 and 50,000 B per device no plain single stage fits (data x2 needs 53,948 B, tensor
    x2 54,764 B, as the predictor says), only two pipeline stages whose first holds one or two of the five layers
    (43,784 B and up; its fastest cut may not be one: [Note: cutting within memory] cuts it again); with --zero
    the fastest plan that fits is a ZeRO data stage, faster than those, as fast as the fastest of every
    combination of stage options of every strategy (enumerated), and priced by both models."""
    from hybridplan.search.time.stage_options import options_label

    cluster = Cluster.parse("1x2", device_memory=50_000)
    plain = _extended(sharded, cluster, 512).candidates
    assert plain and all(c.plan.num_stages == 2 and c.plan.boundaries[1] <= 2 for c in plain)
    answer = _extended(sharded, cluster, 512, zero=True)
    best = answer.best
    assert best.seconds < min(c.seconds for c in plain)
    assert any(s.zero for s in best.plan.stages) and "zero=" in best.label and options_label(best.plan) in best.label
    points = _every_combination(sharded, cluster, 512, answer, recompute=False)
    assert best.seconds == pytest.approx(min(t for _, t in points), rel=1e-12)
    predictor = MemoryPredictor.from_db(sharded / "p.sqlite", global_batch_size=512)
    assert all(d.peak_memory_bytes <= 50_000 for d in predictor.predict(best.plan).devices)
    assert best.seconds == pytest.approx(predict_iteration_time(best.plan, answer.profile, cluster).total_s, rel=1e-12)


def test_recompute_makes_a_plan_fit_per_stage(sharded):
    """At a batch of 32 and 20,100 B no plain plan fits; with --recompute-db the tensor x2 stage recomputed does
    (19,996 B, predicted from the recompute profile), at the cost of its forward again; the fastest of every
    combination."""
    cluster = Cluster.parse("1x2", device_memory=20_100)
    with pytest.raises(UsageError, match="no feasible plan"):
        _extended(sharded, cluster, 32)
    answer = _extended(sharded, cluster, 32, recompute_db=sharded / "r.sqlite")
    best = answer.best
    assert any(s.recompute == "full" for s in best.plan.stages) and "recompute=" in best.label
    points = _every_combination(sharded, cluster, 32, answer, recompute=True)
    assert best.seconds == pytest.approx(min(t for _, t in points), rel=1e-12)
    plain = best.plan.__class__.from_dict({**best.plan.to_dict(), "stages": [
        {k: v for k, v in s.items() if k != "recompute"} for s in best.plan.to_dict()["stages"]]})
    timed = predict_iteration_time(plain, answer.profile, cluster)
    assert best.seconds > timed.total_s  # the recomputed forward costs time
    predictor = MemoryPredictor.from_db(sharded / "p.sqlite", recompute_db=sharded / "r.sqlite")
    assert predictor.predict(best.plan).peak_memory_bytes <= 20_100 < predictor.predict(plain).peak_memory_bytes


def test_pareto_over_the_extended_space_equals_enumeration(sharded):
    """The frontier of peak memory and time with --zero and --recompute-db equals the frontier of every combination
    of stage options of every strategy (enumerated) together with the memory-minimal plan of the extended memory
    search (the frontier's other source)."""
    from hybridplan.search.time.throughput import pareto_frontier

    cluster = Cluster.parse("1x2")
    answer = _extended(sharded, cluster, 512, "pareto", zero=True, recompute_db=sharded / "r.sqlite")
    points = _every_combination(sharded, cluster, 512, answer, recompute=True)
    points += [(float(c.peak or 0.0), c.seconds) for c in answer.candidates if c.label.startswith("memory-minimal")]
    want = sorted({points[i] for i in pareto_frontier(points)})
    have = sorted((float(c.peak or 0.0), c.seconds) for c in answer.candidates)
    assert [p for p, _ in have] == [p for p, _ in want]
    assert [t for _, t in have] == pytest.approx([t for _, t in want], rel=1e-12)
    assert any(any(s.zero for s in c.plan.stages) for c in answer.candidates)


def test_extended_options_are_refused_where_they_do_not_apply(sharded):
    with pytest.raises(UsageError, match="not PipeDream-2BW's"):
        _extended(sharded, Cluster.parse("1x2"), 32, mode="2bw", zero=True)
    with pytest.raises(UsageError, match="the runtime shards no PipeDream-2BW stage"):
        _extended(sharded, Cluster.parse("1x2"), 32, schedule="2bw", zero=True)
    with Sources.open(None, time_profile=str(sharded / "t.json"), model=MLP) as sources:
        with pytest.raises(UsageError, match="and there are none"):
            plan_throughput(sources, Cluster.parse("1x2"), global_batch_size=32, recompute_db=sharded / "r.sqlite")


def test_recompute_is_refused_when_the_layer_times_were_measured_with_it(sharded, tmp_path):
    """A database whose layer times were taken with activation checkpointing (its time identity says so): their
    backward already holds the recomputation, so the plain stages could not be timed; refused, naming the fix."""
    import shutil

    from hybridplan.profiling.store import ProfileStore

    db = tmp_path / "p.sqlite"
    shutil.copy(sharded / "p.sqlite", db)
    with ProfileStore(db) as store:
        store.set_meta("time_identity", {"model": MLP, "activation_checkpointing": True})
    with Sources.open(db, time_profile=str(sharded / "t.json"), model=MLP) as sources:
        with pytest.raises(UsageError, match="measured with activation checkpointing") as caught:
            plan_throughput(sources, Cluster.parse("1x2"), global_batch_size=32, recompute_db=sharded / "r.sqlite")
    assert "without --activation-checkpointing" in caught.value.fix


def test_a_question_asked_again_reads_its_stage_peaks_and_matrices_from_the_cache(sharded, tmp_path, monkeypatch):
    """workflows/table_cache.py ``feasibility_memo``: the stage peaks and matrices of a throughput search are kept
    in one file beside the memory search's; asked again, the search gives the same answer and predicts only the plans
    it answers with, and a damaged file is not trusted: the answer is computed again and the file rewritten."""
    cluster = Cluster.parse("1x2", device_memory=50_000)
    predicted: list[Plan] = []
    original = MemoryPredictor.predict
    monkeypatch.setattr(MemoryPredictor, "predict", lambda self, plan: predicted.append(plan) or original(self, plan))

    def answer(cache):  # type: ignore[no-untyped-def]
        predicted.clear()
        found = _extended(sharded, cluster, 512, zero=True, recompute_db=str(sharded / "r.sqlite"), table_cache=cache)
        return [(c.label, c.seconds, c.peak) for c in found.candidates], len(predicted)

    plain, cold = answer(None)
    assert answer(tmp_path) == (plain, cold)  # the first time with a cache: computed, then kept
    [kept] = tmp_path.glob("*.npz")
    rows, warm = answer(tmp_path)
    assert rows == plain and warm < cold / 4, (warm, cold)
    kept.write_bytes(b"not a zip file")
    assert answer(tmp_path) == (plain, cold)
    assert answer(tmp_path)[1] == warm
