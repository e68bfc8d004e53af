"""Progress lines of the long-running searches (issue 9, item 6: "Long silence")."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from tests.search.search_reference import stages_of

from hybridplan.errors import PlanError, UsageError
from hybridplan.plan.cluster import Cluster
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable
from hybridplan.search import (
    fewest_devices,
    solve_bayesian,
    solve_exact,
    solve_exhaustive,
)
from hybridplan.search.memory.objective import SearchResult, StageTable
from hybridplan.search.time.pipedream_2bw import plan_pipedream_2bw
from hybridplan.search.progress import Progress
from hybridplan.search.memory.configs import stage_configs
from hybridplan.search.memory.packing import MeshPacking
from hybridplan.search.memory.space import PlanSpace
from hybridplan.search.time.stage_cuts import amp_layer_assignment
from hybridplan.search.memory.synthetic import AdditiveStageModel, TableStageModel
from hybridplan.search.time.throughput import ThroughputSearchResult, search_throughput


class FakeClock:
    """Seconds that advance only when the test says so (or by ``tick`` on every read)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick, self.reads = 100.0, tick, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now


def every_line(lines: list[str]) -> Progress:
    """A progress that writes every update at once: deterministic, whatever the machine's speed."""
    return Progress(lines.append, min_interval_s=0.0, quiet_for_s=0.0)


# --- the helper ---------------------------------------------------------------------------------------------


def test_quiet_at_first_then_at_most_one_line_per_interval() -> None:
    clock, lines = FakeClock(), list[str]()
    p = Progress(lines.append, min_interval_s=1.0, quiet_for_s=2.0, clock=clock)
    p.update("a")
    clock.now += 1.9
    p.update("b")
    assert lines == []  # a search that ends within the quiet time prints nothing
    clock.now += 0.1
    p.update("c")
    assert lines == ["c, 2.0 s"]
    clock.now += 0.5
    p.update("d")
    clock.now += 0.49
    p.update("e")
    assert lines == ["c, 2.0 s"]
    clock.now += 0.01
    p.update("f")
    assert lines == ["c, 2.0 s", "f, 3.0 s"]
    assert p.lines == 2


def test_due_says_whether_a_line_would_be_written() -> None:
    clock, lines = FakeClock(), list[str]()
    p = Progress(lines.append, min_interval_s=1.0, quiet_for_s=2.0, clock=clock)
    assert not p.due()
    clock.now += 2.0
    assert p.due()
    p.update("one")
    assert not p.due()
    clock.now += 1.0
    assert p.due() and lines == ["one, 2.0 s"]


def test_no_callback_is_silent_and_cheap() -> None:
    clock = FakeClock()
    p = Progress(None, min_interval_s=0.0, quiet_for_s=0.0, clock=clock)
    p.update("x")
    p.within("outer").update("x")
    assert not p.enabled and not p.due() and p.lines == 0
    assert clock.reads == 0


def test_nested_views_prefix_their_context_and_share_the_rate_limit() -> None:
    clock, lines = FakeClock(), list[str]()
    outer = Progress(lines.append, min_interval_s=1.0, quiet_for_s=0.0, clock=clock)
    inner = outer.within("fewest devices, trying 1x2 (2 of 4)").within("exact search")
    inner.update("pass 1/3")
    outer.update("too soon")  # the inner line used up this second
    clock.now += 1.0
    outer.update("fewest devices: trying 2x1 (3 of 4)")
    assert lines == ["fewest devices, trying 1x2 (2 of 4): exact search: pass 1/3, 0.0 s",
                     "fewest devices: trying 2x1 (3 of 4), 1.0 s"]
    assert inner.lines == outer.lines == 2


def test_of_keeps_a_progress_and_wraps_a_plain_callback() -> None:
    lines: list[str] = []
    mine = every_line(lines)
    assert Progress.of(mine) is mine
    wrapped = Progress.of(lines.append)
    assert wrapped is not mine and wrapped.enabled
    assert not wrapped.due()  # the default limits: quiet for the first 2 s
    assert not Progress.of(None).enabled


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1"])
def test_bad_intervals_are_refused_with_the_value(bad: object) -> None:
    with pytest.raises(UsageError, match="min_interval_s must be a finite number of seconds") as info:
        Progress(print, min_interval_s=bad)  # type: ignore[arg-type]
    assert repr(bad) in info.value.message and info.value.fix


# --- the searches ------------------------------------------------------------------------------------------

MODEL = AdditiveStageModel.transformer(12, horizon=2, seed=3)
SPACE = PlanSpace(12, 2, 4)
MODEL_6 = AdditiveStageModel.transformer(6, horizon=2, seed=1)


def _same(a: SearchResult, b: SearchResult) -> bool:
    return stages_of(a) == stages_of(b) and a.device_values == b.device_values and a.visited == b.visited


def test_exact_search_reports_its_table_and_three_passes_and_finds_the_same_plan() -> None:
    lines: list[str] = []
    result = solve_exact(MODEL, SPACE, progress=every_line(lines))
    assert _same(result, solve_exact(MODEL, SPACE))
    assert any(line.startswith("exact search: stage table: config 1/5 (none x1)") for line in lines)
    for p in (1, 2, 3):
        assert any(re.match(rf"exact search: pass {p}/3 \(.*\), layer \d+/12, \d+\.\d s$", line) for line in lines)
    assert any("pass 3/3 (best plan), layer 12/12" in line for line in lines)


def test_exhaustive_search_reports_plans_scored_and_finds_the_same_plan() -> None:
    lines: list[str] = []
    space = PlanSpace(6, 1, 4)
    result = solve_exhaustive(MODEL_6, space, progress=every_line(lines))
    assert _same(result, solve_exhaustive(MODEL_6, space))
    assert any(re.match(r"exhaustive search: [\d,]+ plans scored, [\d,]+ stage configs pruned, best peak ", line)
               for line in lines)


def test_bayesian_search_reports_each_evaluation_and_finds_the_same_plan() -> None:
    lines: list[str] = []
    result = solve_bayesian(MODEL, SPACE, budget=12, seed=4, progress=every_line(lines))
    assert _same(result, solve_bayesian(MODEL, SPACE, budget=12, seed=4))
    evaluations = [line for line in lines if line.startswith("bayesian search: evaluation")]
    assert [line.split(",")[0] for line in evaluations] == [f"bayesian search: evaluation {i}/12" for i in range(1, 13)]


def test_fewest_devices_names_each_shape_and_nests_the_exact_search() -> None:
    lines: list[str] = []
    model = AdditiveStageModel.transformer(16, horizon=4, seed=2)
    capacity = solve_exact(model, PlanSpace(16, 2, 4)).peak * 1.3
    found = fewest_devices(model, Cluster.uniform(2, 4), 16, capacity=capacity, progress=every_line(lines))
    quiet = fewest_devices(model, Cluster.uniform(2, 4), 16, capacity=capacity)
    assert found.tried == quiet.tried and _same(found.result, quiet.result)
    assert lines[0].startswith("fewest devices: trying 1x1 (1 of 8), ")
    shapes = [line.split(",")[0] for line in lines if line.startswith("fewest devices: trying")]
    assert len(shapes) == len(found.tried)
    assert any(line.startswith("fewest devices, trying 1x1 (1 of 8): exact search: pass 3/3") for line in lines)


def test_stage_table_asked_stage_by_stage_reports_configs_and_layers() -> None:
    lines: list[str] = []
    model = TableStageModel.random(8, 4, horizon=2, seed=0)  # no stage_memory_matrix: L^2 questions per config
    space = PlanSpace(8, 1, 4)
    table = StageTable(model, space, progress=every_line(lines))
    assert (table.values == StageTable(model, space).values).all()
    assert "stage table: config 5/5 (tensor x4), layer 8/8" in [line.rsplit(",", 1)[0] for line in lines]


def test_mesh_packing_reports_states_expanded() -> None:
    lines: list[str] = []
    degrees = [c.degree for c in stage_configs(12)]
    pk = MeshPacking(3, 12, degrees, progress=every_line(lines))
    assert lines and all(line.startswith("mesh packing 3x12: ") for line in lines)
    assert (pk.next == MeshPacking(3, 12, degrees).next).all()


def test_a_slow_search_reports_about_once_a_second_after_two_quiet_seconds() -> None:
    # Made slow on purpose: every clock read advances 100 ms, so the search "takes" seconds (~50 reads).
    clock, lines = FakeClock(tick=0.1), list[str]()
    solve_exact(MODEL, SPACE, progress=Progress(lines.append, clock=clock))  # the default limits
    elapsed = [float(line.rsplit(", ", 1)[1].removesuffix(" s")) for line in lines]
    assert len(lines) >= 2, f"{clock.now - 100.0:.1f} fake seconds but {lines}"
    assert elapsed[0] >= 2.0
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(elapsed))


def test_a_quick_search_with_the_default_limits_prints_nothing() -> None:
    lines: list[str] = []
    solve_exact(MODEL, SPACE, progress=lines.append)  # well under the 2 quiet seconds
    assert lines == []


def test_no_callback_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    solve_exact(MODEL, SPACE, progress=None)
    solve_exhaustive(MODEL_6, PlanSpace(6, 1, 4))
    solve_bayesian(MODEL, SPACE, budget=3)
    out = capsys.readouterr()
    assert out.out == out.err == ""


# --- the other "mesh too big" messages suggest fewer devices, never more ----------------------------------


def test_a_throughput_search_with_no_strategy_suggests_fewer_devices() -> None:
    with pytest.raises(UsageError, match="no strategy to evaluate") as info:
        _ = ThroughputSearchResult((), "time", 0, 0, 0.0).best
    assert "fewer devices" in (info.value.fix or "") and "more devices" not in (info.value.fix or "")
    with pytest.raises(UsageError, match="no feasible plan"):  # all rejected by memory: more memory helps
        _ = ThroughputSearchResult((), "time", 5, 5, 0.0).best


def test_cutting_more_stages_than_layers_suggests_at_most_one_stage_per_layer() -> None:
    with pytest.raises(PlanError, match="cannot cut 2 layers into 3 non-empty stages") as info:
        amp_layer_assignment([np.ones(2)] * 3, [np.zeros(2)] * 2, num_microbatches=2)
    assert "at most 2 stages" in (info.value.fix or "") and "fewer devices" in (info.value.fix or "")


def test_throughput_searches_report_their_strategies_and_find_the_same_plans() -> None:
    profile = TimeProfile(model="toy", layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1e3,
                                                              parameter_bytes=1e6) for i in range(4)),
                          timings=(TimingTable(device_type="cpu", tensor_degree=1, micro_batch_size=1,
                                               forward_s=(1e-3,) * 4, backward_s=(2e-3,) * 4),))
    cluster = Cluster.uniform(1, 4)
    lines: list[str] = []
    amp = search_throughput(profile, cluster, 8, placement="anneal", anneal_iterations=5, progress=every_line(lines))
    quiet = search_throughput(profile, cluster, 8, placement="anneal", anneal_iterations=5)
    assert [c.plan for c in amp.candidates] == [c.plan for c in quiet.candidates]
    assert any(re.match(r"throughput search: strategy \d+/\d+ \(pp \d+, dp \d+, tp \d+, micro-batch size \d+\)", line)
               for line in lines)
    assert any(line.startswith("throughput search: annealing the placement of candidate 1/") for line in lines)
    lines.clear()
    two = plan_pipedream_2bw(profile, cluster, 8, progress=every_line(lines))
    assert [c.plan for c in two] == [c.plan for c in plan_pipedream_2bw(profile, cluster, 8)]
    assert any(line.startswith("pipedream-2bw search: depth 4 of at most 4") for line in lines)


@pytest.mark.parametrize("solver", [solve_exact, solve_exhaustive])
def test_ctrl_c_inside_a_search_reaches_the_caller(solver) -> None:
    """Nothing in a search swallows KeyboardInterrupt: the command line turns it into exit code 130."""
    calls = []

    def interrupt(line: str) -> None:
        calls.append(line)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        solver(MODEL, SPACE, progress=Progress(interrupt, min_interval_s=0.0, quiet_for_s=0.0))
    assert len(calls) == 3
