"""Rank reports, their JSON round trips, and how ``aggregate`` makes the run result (runtime/result.py)."""

from __future__ import annotations

import json
import pickle

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.result import (
    EXIT_FAILED,
    EXIT_LAUNCHER_GONE,
    EXIT_OK,
    EXIT_OOM,
    RankFailure,
    RankReport,
    RunResult,
    aggregate,
    failed_result,
    report_from_dict,
    root_cause,
)
from tests.runtime.util import make_plan

PLAN = make_plan("1f1b", 8, 2, [(0, 5, "tensor", [0, 1]), (5, 10, "data", [2, 3])])


def cfg(**kw) -> RunConfig:
    return RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x4"), iterations=3, **kw)


def report(rank: int, *, peaks: list[int], seconds: list[float], losses: list[float], **kw) -> RankReport:
    stage = 0 if rank < 2 else 1
    fields = dict(
        rank=rank, stage=stage, rank_in_stage=rank % 2, node=0, in_flight=2 - stage, iteration_peaks=peaks,
        static=[10, 20, 20], data=[1, 1, 1], breakdowns=[{"parameters": p, "step": 0} for p in peaks],
        seconds=seconds, losses=losses, timeline=[{"action": "F0", "before": 0, "peak": 1, "after": 1}],
        overhead_bytes=None, layer_seconds=[],
    )  # fmt: skip
    return RankReport(**{**fields, **kw})


def four_ranks() -> list[RankReport]:
    return [
        report(0, peaks=[100, 150, 140], seconds=[2.0, 1.0, 1.0], losses=[0.0, 0.0, 0.0]),
        report(1, peaks=[100, 150, 140], seconds=[2.0, 1.5, 0.5], losses=[0.0, 0.0, 0.0]),
        report(2, peaks=[90, 95, 99], seconds=[2.0, 1.0, 1.0], losses=[1.0, 0.75, 0.5]),
        report(3, peaks=[90, 95, 99], seconds=[2.0, 1.0, 3.0], losses=[2.0, 1.25, 1.5]),
    ]


def test_exit_codes():
    assert (EXIT_OK, EXIT_FAILED, EXIT_OOM, EXIT_LAUNCHER_GONE) == (0, 1, 3, 4)


def test_a_finished_report_round_trips_through_json_and_pickle():
    rep = four_ranks()[2]
    data = rep.to_dict()
    assert data["status"] == "ok" and list(data)[1:] == [
        "rank", "stage", "rank_in_stage", "node", "in_flight", "iteration_peaks", "static", "data", "breakdowns",
        "seconds", "losses", "timeline", "overhead_bytes", "layer_seconds", "reserved_peaks", "workspaces",
    ]  # fmt: skip
    assert RankReport.from_dict(json.loads(json.dumps(data))) == rep
    assert report_from_dict(json.loads(json.dumps(data))) == rep
    assert pickle.loads(pickle.dumps(rep)) == rep  # simulated reports stay in process; real ones travel as JSON
    with pytest.raises(ValueError, match="not a finished rank's report"):
        RankReport.from_dict({**data, "extra": 1})


def test_a_failure_report_round_trips_and_knows_its_exit_code():
    oom = RankFailure(status="oom", rank=2, reason="device 2: DeviceOutOfMemory: out of memory", time=5.0, traceback="tb")
    assert oom.to_dict() == {"status": "oom", "rank": 2, "reason": oom.reason, "time": 5.0, "traceback": "tb"}
    assert report_from_dict(json.loads(json.dumps(oom.to_dict()))) == oom
    assert oom.exit_code == EXIT_OOM
    assert RankFailure(status="failed", rank=0, reason="r", time=0.0, traceback="").exit_code == EXIT_FAILED
    with pytest.raises(ValueError, match="status 'weird' of a failed rank is not one of \\['oom', 'failed'\\]"):
        report_from_dict({"status": "weird", "rank": 0, "reason": "r", "time": 0.0, "traceback": ""})
    with pytest.raises(ValueError, match="not a failed rank's report"):
        report_from_dict({"status": "failed", "rank": 0})


def test_aggregate_sums_the_data_parallel_losses_and_takes_the_measured_peaks():
    result = aggregate(cfg(), four_ranks(), wall_seconds=7.0)
    assert result.ok and result.reason is None and result.wall_seconds == 7.0
    assert result.losses == [3.0, 2.0, 2.0]  # the last stage's replicas' shares, summed
    assert result.iteration_seconds == pytest.approx((1.5 + 3.0) / 2)  # slowest rank, measured iterations
    first, last = result.devices[0], result.devices[3]
    assert (first.peak_memory_bytes, last.peak_memory_bytes) == (150, 99)  # the highest measured iteration
    assert first.peak_breakdown == {"parameters": 150}  # the peak's breakdown, zero categories dropped
    assert (first.static_memory_bytes, first.data_bytes, first.in_flight) == (20, 1, 2)
    assert [(d.device, d.stage, d.rank_in_stage) for d in result.devices] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert result.config == cfg().describe() and result.plan == PLAN.to_dict()
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))).to_dict() == result.to_dict()


def test_a_shared_gpu_run_marks_its_times_not_representative():
    plain = aggregate(cfg(), four_ranks(), wall_seconds=7.0)
    shared = aggregate(cfg(share_gpu=True), four_ranks(), wall_seconds=7.0)
    assert plain.iteration_seconds_representative and not shared.iteration_seconds_representative
    assert shared.iteration_seconds == plain.iteration_seconds and shared.config["share_gpu"]
    assert "NOT representative" in shared.summary() and "MODE: several ranks share one GPU" in shared.summary()
    assert "representative" not in plain.summary() and "MODE" not in plain.summary()
    data = json.loads(json.dumps(shared.to_dict()))
    assert data["iteration_seconds_representative"] is False
    assert not RunResult.from_dict(data).iteration_seconds_representative
    del data["iteration_seconds_representative"]  # a result written before the mode existed
    assert RunResult.from_dict(data).iteration_seconds_representative
    assert not failed_result(cfg(share_gpu=True), "failed", "x", 1.0).iteration_seconds_representative


def test_aggregate_of_a_simulated_or_untracked_run():
    ranks = [report(r, peaks=[], seconds=[0.1] * 3, losses=[], static=[], data=[], breakdowns=[]) for r in range(4)]
    result = aggregate(cfg(backend="sim"), ranks, wall_seconds=1.0)
    assert result.ok and result.losses == [] and result.iteration_seconds is None
    assert all(d.peak_memory_bytes is None and d.peak_breakdown == {} and d.static_memory_bytes is None
               for d in result.devices)  # fmt: skip


def test_failed_result_has_no_devices():
    result = failed_result(cfg(), "oom", "device 2 (stage 1): out of memory", 3.5)
    assert (result.status, result.reason, result.wall_seconds) == ("oom", "device 2 (stage 1): out of memory", 3.5)
    assert result.devices == [] and result.losses == [] and result.iteration_seconds is None and not result.ok


# ---------------------------------------------------------------------------------------------- root cause
EXAMPLE = make_plan("1f1b", 32, 8, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3])])


def _failure(rank: int, status: str, reason: str, at: float) -> RankFailure:
    return RankFailure(status=status, rank=rank, reason=f"device {rank}: {reason}", time=at, traceback="")


def _cause(reports, failed, codes=None):
    config = RunConfig(model="gpt-tiny", plan=EXAMPLE, cluster=Cluster.parse("1x4"))
    codes = codes or [1, 1, 1, 1]
    how = lambda r: (f"was killed by signal {-codes[r]}" if codes[r] < 0 else f"exited with code {codes[r]}", codes[r])  # noqa: E731
    return root_cause(config, reports, 1.5, failed=failed, crashed=how)


def test_root_cause_prefers_out_of_memory_then_a_crash_then_the_earliest_real_failure():
    lost = _failure(0, "failed", "RuntimeError: Connection closed by peer", at=1.0)
    boom = _failure(3, "failed", "RuntimeError: boom", at=2.0)
    oom = _failure(2, "oom", "DeviceOutOfMemory: out of memory", at=3.0)
    result = _cause([lost, None, oom, boom], failed=[0, 1, 2, 3])
    assert (result.status, result.reason) == ("oom", "device 2 (stage 1): DeviceOutOfMemory: out of memory")
    assert result.devices == [] and result.wall_seconds == 1.5
    crashed = _cause([lost, None, None, boom], failed=[0, 1, 3], codes=[1, -9, 0, 1])
    assert crashed.reason == "device 1 (stage 0) was killed by signal 9 without a report"
    assert _cause([None] * 4, failed=[2], codes=[0, 0, EXIT_OOM, 0]).status == "oom"  # died before writing it
    earliest = _cause([lost, None, None, boom], failed=[0, 3])
    assert (earliest.status, earliest.reason) == ("failed", "device 3 (stage 2): RuntimeError: boom")
    only_lost = _cause([lost, None, None, None], failed=[0])
    assert only_lost.reason == "device 0 (stage 0): RuntimeError: Connection closed by peer"
