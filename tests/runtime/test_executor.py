"""The executor (runtime/executor.py) runs every plan as the same math as one device: same losses, same gradients
(real processes, gloo; the check is ``assert_same_training`` of tests/runtime/util.py)."""

from __future__ import annotations

import pytest

from tests.runtime.util import assert_same_training, make_plan

pytestmark = pytest.mark.distributed


def test_gpt_issue_example_1f1b():
    """The plan of the issue: tensor x2 -> pipeline-only -> data x1."""
    plan = make_plan("1f1b", 32, 8, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3])])
    assert_same_training("gpt-tiny", plan, "1x4")


def test_gpt_mixed_8_devices_gpipe():
    """tensor x2 -> data x2 -> data x4: re-splitting replicated to sharded and between shard counts."""
    plan = make_plan("gpipe", 16, 4, [(0, 2, "tensor", [0, 1]), (2, 5, "data", [2, 3]), (5, 10, "data", [4, 5, 6, 7])])
    assert_same_training("gpt-tiny", plan, "2x4")


def test_gpt_data_to_tensor_1f1b():
    """data x2 -> tensor x2: sharded to replicated forward, and the full gradient back to both shards."""
    plan = make_plan("1f1b", 16, 4, [(0, 4, "data", [0, 1]), (4, 10, "tensor", [2, 3])])
    assert_same_training("gpt-tiny", plan, "1x4")


@pytest.mark.parametrize(
    "schedule, stages",
    [
        ("1f1b", [(0, 3, "tensor", [0, 1]), (3, 7, "data", [2, 3])]),
        ("gpipe", [(0, 2, "data", [0, 1]), (2, 5, "none", [2]), (5, 7, "tensor", [3, 4])]),
    ],
)
def test_conv_mixed(schedule, stages):
    """Wide-ResNet (convolutions, GroupNorm) with mixed stage kinds and degrees, both schedules."""
    cluster = "1x4" if max(d for *_, devs in stages for d in devs) < 4 else "1x5"
    assert_same_training("wresnet-tiny", make_plan(schedule, 16, 4, stages), cluster)


@pytest.mark.parametrize("world, waits", [(1, 0), (2, 1)])
def test_a_world_of_one_rank_does_not_synchronise(monkeypatch, world, waits):
    """Under NCCL the first barrier creates a communicator (562 MiB on an H100, ../shared/notes/gpu-h100-facts.md):
    a one-device plan has no one to wait for, so it must not call it."""
    import torch.distributed as dist

    from hybridplan.runtime.executor import barrier
    from hybridplan.runtime.sim import fake_process_group

    calls: list[int] = []
    with fake_process_group(0, world):
        monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append(1))
        barrier()
    assert len(calls) == waits
