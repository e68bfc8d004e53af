"""Every plan trains the same math as one device: same losses, same gradients (real processes, gloo)."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.util import make_plan, run_with_state, single_device

pytestmark = pytest.mark.distributed

_REFERENCES: dict = {}


def reference(model: str, plan):
    # 2BW trains other math (stale weights); GPipe, 1F1B and PipeDream-Flush on one device share a reference.
    key = (model, plan.global_batch_size, plan.num_microbatches, plan.schedule == "2bw")
    if key not in _REFERENCES:
        _REFERENCES[key] = run_with_state(model, single_device(plan), "1x1")
    return _REFERENCES[key]


def assert_same_training(model: str, plan, cluster: str) -> None:
    ref, ref_w, ref_g = reference(model, plan)
    got, w, g = run_with_state(model, plan, cluster)
    assert len(got.losses) == len(ref.losses) == 3
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b), (got.losses, ref.losses)
    assert w.keys() == ref_w.keys() and g.keys() == ref_g.keys()
    # Gradients of the last iteration (after two updates, so they also reflect the weights). Some are
    # mathematically zero (the attention key bias: softmax ignores a per-query constant) and hold only
    # rounding noise, hence the floor relative to the largest gradient.
    scale = max(t.norm().item() for t in ref_g.values())
    for k in ref_g:
        err = (g[k] - ref_g[k]).norm().item()
        assert err <= 1e-4 * ref_g[k].norm().item() + 1e-6 * scale, (k, err, ref_g[k].norm().item())
    total = torch.cat([ref_g[k].flatten() for k in sorted(ref_g)])
    diff = torch.cat([(g[k] - ref_g[k]).flatten() for k in sorted(ref_g)])
    assert diff.norm() <= 1e-5 * total.norm()


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
