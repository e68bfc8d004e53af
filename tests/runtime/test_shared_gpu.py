"""Several ranks on one GPU (runtime/shared_gpu.py), tested on CPU, where the mode stages every point-to-point
transfer through a host buffer all the same: the staged transfers deliver the right rows and are invisible to the
exact tracker (gloo pool); plans in the mode train as one device does and measure every rank's peak to the byte as
the unstaged runtime does (real processes); when the launcher turns the mode on, and what the output says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from gloo import GlooPool

from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.runtime.memory import StorageTracker
from hybridplan.runtime.result import SHARED_GPU_NOTE, RunResult
from hybridplan.runtime.shared_gpu import isend, needs_shared_gpu, receive_into, with_shared_gpu_if_needed
from tests.runtime.util import assert_same_training, make_plan

ROWS, WIDTH = 6, 5


def _transfers(rank: int, world: int, staged: bool) -> dict[str, Any]:
    """Ranks 0 and 1 each send 3 rows to rank 2 (rows 0-2 and 3-5 of its buffer), under an exact tracker."""
    tracker = StorageTracker()
    got: list[float] = []
    kept: Any = None
    with tracker:
        if rank in (0, 1):
            piece = torch.full((ROWS // 2, WIDTH), float(rank + 1))  # one allocation
            work, kept = isend(piece, 2, tag=7, staged=staged)
            work.wait()
        elif rank == 2:
            buf = torch.empty(ROWS, WIDTH)
            receive_into(buf, [(0, ROWS // 2, 0), (ROWS // 2, ROWS, 1)], tag=7, staged=staged)
            got = buf.flatten().tolist()
    host_copy = isinstance(kept, tuple) and kept[1].untyped_storage().data_ptr() != kept[0].untyped_storage().data_ptr()
    return {"got": got, "tracked": tracker.peak, "host copy": host_copy}


@pytest.mark.distributed
def test_staged_transfers_deliver_the_rows_and_count_no_host_buffer(gloo_pool: Callable[[int], GlooPool]) -> None:
    expected = [1.0] * (ROWS // 2 * WIDTH) + [2.0] * (ROWS // 2 * WIDTH)  # rank 0's rows, then rank 1's
    piece_bytes, buf_bytes = ROWS // 2 * WIDTH * 4, ROWS * WIDTH * 4
    for staged in (False, True):
        reports = gloo_pool(4).run(_transfers, staged)
        assert reports[2]["got"] == expected
        # only the program's tensors: the sent rows on a sender, the receive buffer on the receiver
        assert [r["tracked"] for r in reports] == [piece_bytes, piece_bytes, buf_bytes, 0]
        assert [r["host copy"] for r in reports[:2]] == [staged, staged]  # gloo read a host copy only when staged


# ---------------------------------------------------------------------------------------------- whole runs
def _memory(plan: Plan, cluster: str, **kw: Any) -> list[tuple[Any, ...]]:
    """Every device's peak, static bytes and per-action levels of a 3-iteration run (as assert_same_training's)."""
    result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=3, **kw))
    assert result.ok, result.reason
    return _levels(result)


def _levels(result: RunResult) -> list[tuple[Any, ...]]:
    return [(d.device, d.peak_memory_bytes, d.static_memory_bytes, d.timeline) for d in result.devices]


def _assert_marked(result: RunResult) -> None:
    assert result.config["share_gpu"] and not result.iteration_seconds_representative
    assert "NOT representative" in result.summary() and SHARED_GPU_NOTE in result.summary()


@pytest.mark.distributed
def test_four_stages_train_as_one_device_with_the_unstaged_peaks() -> None:
    plan = make_plan("1f1b", 16, 4, [(0, 3, "none", [0]), (3, 5, "none", [1]), (5, 8, "none", [2]), (8, 10, "none", [3])])
    shared = assert_same_training("gpt-tiny", plan, "1x4", share_gpu=True)
    _assert_marked(shared)
    # Every rank's levels to the byte: a tracker that counted the host staging buffers would add the sent and
    # received rows (measured with the staging made visible, batch 8 in 4 micro-batches: +16 to +24 KiB per stage).
    assert _levels(shared) == _memory(plan, "1x4")


@pytest.mark.distributed
def test_data_then_tensor_stage_trains_as_one_device_with_the_simulated_peaks() -> None:
    """data x2 -> tensor x2: sharded rows merge through host buffers; the tensor-parallel all-reduces and the
    data-parallel gradient sum run on gloo; peaks equal the simulator's (which equals the unstaged runtime,
    tests/runtime/test_sim_agreement.py)."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    shared = assert_same_training("gpt-tiny", plan, "1x4", share_gpu=True)
    _assert_marked(shared)
    assert [row[:3] for row in _levels(shared)] == [row[:3] for row in _memory(plan, "1x4", backend="sim")]


@pytest.mark.distributed
def test_data_parallel_plan_trains_as_one_device() -> None:
    """One data x4 stage: no transfer to stage, only collectives; the mode changes neither math nor memory."""
    plan = make_plan("1f1b", 16, 4, [(0, 10, "data", [0, 1, 2, 3])])
    shared = assert_same_training("gpt-tiny", plan, "1x4", share_gpu=True)
    _assert_marked(shared)
    assert [row[:3] for row in _levels(shared)] == [row[:3] for row in _memory(plan, "1x4", backend="sim")]


# ---------------------------------------------------------------------------------------------- when the mode is on
def test_mode_is_needed_only_with_fewer_gpus_than_ranks() -> None:
    assert [needs_shared_gpu(4, g) for g in (0, 1, 3, 4, 8)] == [False, True, True, False, False]


def _cfg(**kw: Any) -> RunConfig:
    plan = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])
    return RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x2"), **kw)


def test_launcher_turns_the_mode_on_loudly_for_more_ranks_than_gpus() -> None:
    said: list[str] = []
    cuda = _cfg(device_type="cuda")
    on = with_shared_gpu_if_needed(cuda, gpus=1, say=said.append)
    assert on.share_gpu and on == RunConfig(**{**vars(cuda), "share_gpu": True})
    assert len(said) == 1 and "SHARED-GPU MODE IS ON" in said[0] and "2 ranks and 1 GPU is visible" in said[0]
    # enough GPUs, no GPU at all, a CPU run, simulated devices, or the mode already asked for: unchanged, silent
    for cfg, gpus in ((cuda, 2), (cuda, 0), (_cfg(), 1), (_cfg(device_type="cuda", backend="sim"), 1), (on, 1)):
        assert with_shared_gpu_if_needed(cfg, gpus=gpus, say=said.append) is cfg
    assert len(said) == 1
