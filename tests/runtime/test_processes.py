"""The real-process backend (runtime/processes.py): results, memory behaviour, failures (their root cause: tests/runtime/test_result.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import PlanError
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.runtime.processes import _read_report
from hybridplan.runtime.result import RankReport
from tests.runtime.faulty_models import FaultyGPT
from tests.runtime.util import alive, make_plan

distributed = pytest.mark.distributed

EXAMPLE = make_plan("1f1b", 32, 8, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3])])


def run(plan, cluster="1x4", model="gpt-tiny", **kw):
    pids: list[int] = []
    result = launch(RunConfig(model=model, plan=plan, cluster=Cluster.parse(cluster, device_memory=kw.pop("memory", None)), **kw),
                    on_start=pids.extend)
    return result, pids


@distributed
def test_example_runs_and_peaks_repeat_exactly():
    first, pids = run(EXAMPLE)
    second, _ = run(EXAMPLE)
    assert first.ok and second.ok
    assert len(first.losses) == 3 and all(loss > 0 for loss in first.losses)
    assert first.iteration_seconds > 0
    assert [(d.device, d.stage) for d in first.devices] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [d.peak_memory_bytes for d in first.devices] == [d.peak_memory_bytes for d in second.devices]
    assert [d.timeline for d in first.devices] == [d.timeline for d in second.devices]
    for d in first.devices:  # after the warm-up, every iteration peaks at the same byte
        assert d.iteration_peaks[1] == d.iteration_peaks[2] >= d.iteration_peaks[0]
        assert d.peak_memory_bytes > d.static_memory_bytes > 0
        assert sum(d.peak_breakdown.values()) == d.peak_memory_bytes
    # the two tensor-parallel ranks hold the same shards' sizes: same peak
    assert first.devices[0].peak_memory_bytes == first.devices[1].peak_memory_bytes
    assert not any(alive(p) for p in pids)


@distributed
def test_1f1b_first_stage_holds_more_activations_than_gpipe_order_implies():
    stages = [(0, 3, "none", [0]), (3, 5, "none", [1]), (5, 7, "none", [2]), (7, 10, "none", [3])]
    one, _ = run(make_plan("1f1b", 32, 8, stages), iterations=2)
    gpipe, _ = run(make_plan("gpipe", 32, 8, stages), iterations=2)
    act1 = [d.peak_breakdown["activations"] for d in one.devices]
    actg = [d.peak_breakdown["activations"] for d in gpipe.devices]
    assert [d.in_flight for d in one.devices] == [4, 3, 2, 1]
    assert [d.in_flight for d in gpipe.devices] == [8, 8, 8, 8]
    assert act1[0] > act1[3]  # first stage above last, as 1F1B implies
    # Stages 1 and 2 hold identical layers (two blocks), so their activation peak is k * A + T for k
    # micro-batches in flight, A the bytes one micro-batch keeps and T the transient of the op at the peak.
    per_microbatch = act1[1] - act1[2]  # 3 in flight minus 2 in flight
    assert per_microbatch > 0
    assert actg[1] == actg[2]  # GPipe: position does not matter
    assert actg[1] - act1[2] == 6 * per_microbatch  # 8 in flight minus 2 in flight
    assert "gradients" not in gpipe.devices[1].peak_breakdown  # GPipe peaks before the first backward


@distributed
def test_too_small_memory_is_oom_quickly():
    result, pids = run(EXAMPLE, memory="1MiB", timeout_s=120)
    assert result.status == "oom"
    assert "out of memory" in result.reason and "capacity 1048576 bytes" in result.reason
    assert result.wall_seconds < 60  # ended by the failing rank, not by the 120 s timeout
    assert not any(alive(p) for p in pids)


@distributed
@pytest.mark.parametrize(
    "how, status, message",
    [
        ("raise", "failed", "device 2 (stage 1): RuntimeError: boom in the faulty layer"),
        ("exit", "failed", "device 2 (stage 1) exited with code 7 without a report"),
    ],
)
def test_failing_rank_ends_the_run(how, status, message):
    result, pids = run(EXAMPLE, model=FaultyGPT(layer=5, how=how), timeout_s=120)
    assert result.status == status
    assert message in result.reason
    assert result.wall_seconds < 60
    assert len(pids) == 4 and not any(alive(p) for p in pids)


@distributed
def test_hanging_rank_times_out():
    result, pids = run(EXAMPLE, model=FaultyGPT(layer=8, how="hang"), timeout_s=8)
    assert result.status == "failed" and "timed out after 8 s" in result.reason
    assert not any(alive(p) for p in pids)


def test_invalid_plan_starts_nothing():
    pids: list[int] = []
    with pytest.raises(PlanError, match="does not exist on cluster 1x3"):
        launch(RunConfig(model="gpt-tiny", plan=EXAMPLE, cluster=Cluster.parse("1x3")), on_start=pids.extend)
    assert pids == []


@distributed
def test_stage_without_parameters_trains():
    """A stage of only parameterless layers (ReLU) has nothing to update, but must run and back-propagate."""
    from tests.cli.user_models import mlp  # noqa: F401  (the model is named below for the spawned ranks)

    plan = make_plan("1f1b", 8, 2, [(0, 1, "none", [0]), (1, 2, "none", [1]), (2, 5, "none", [2])])
    result, _ = run(plan, cluster="1x3", model="tests.cli.user_models:mlp")
    assert result.ok, result.reason
    relu = result.devices[1]
    assert relu.static_memory_bytes == 0 and relu.peak_memory_bytes > 0
    assert "parameters" not in relu.peak_breakdown


@distributed
def test_uniform_hybrid_plan_on_8_devices():
    """Four stages, each tensor-parallel over 2 devices (a uniform hybrid plan, like AMP's pp=4 x tp=2)."""
    plan = make_plan("1f1b", 16, 4, [(0, 3, "tensor", [0, 1]), (3, 5, "tensor", [2, 3]), (5, 7, "tensor", [4, 5]),
                                     (7, 10, "tensor", [6, 7])])
    result, pids = run(plan, cluster="2x4", iterations=2)
    assert result.ok, result.reason
    peaks = [d.peak_memory_bytes for d in result.devices]
    assert all(peaks[i] == peaks[i + 1] for i in range(0, 8, 2))  # the two ranks of a stage hold the same
    assert [d.in_flight for d in result.devices[::2]] == [4, 3, 2, 1]
    assert not any(alive(p) for p in pids)


def test_report_files_are_read_back_typed(tmp_path):
    ok = RankReport(rank=0, stage=0, rank_in_stage=0, node=0, in_flight=1, iteration_peaks=[5], static=[1], data=[0],
                    breakdowns=[{"parameters": 1}], seconds=[0.1], losses=[2.0], timeline=[], overhead_bytes=None,
                    layer_seconds=[])  # fmt: skip
    (tmp_path / "ok.json").write_text(json.dumps(ok.to_dict()))
    (tmp_path / "bad.json").write_text('{"status": "ok", "rank": 0')
    (tmp_path / "odd.json").write_text('{"status": "weird", "rank": 0}')
    assert _read_report(tmp_path / "ok.json") == ok
    assert _read_report(tmp_path / "bad.json") is None  # cut short
    assert _read_report(tmp_path / "odd.json") is None
    assert _read_report(tmp_path / "missing.json") is None  # still running, or died first
