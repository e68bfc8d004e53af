"""PipeDream-Flush and PipeDream-2BW in the runtime (real processes on gloo, and simulated devices).

- "flush" is 1F1B under its paper's name: the same losses and the same memory, to the byte;
- "2bw" trains ``W(t+1) = W(t) - nu * grad f(W(t-1))`` (seed 003): a mixed multi-stage plan (tensor, pipeline,
  data stages) trains exactly as one device does under 2BW; one device's 2BW run matches the update written
  out by hand; the first iteration equals 1F1B's (no older version yet) and later ones differ;
- 2BW's memory is 1F1B's plus one copy of the stage's parameters in the compute dtype ("weight_stash"),
  with mixed precision and DTensor shards, identical on simulated devices.
"""

from __future__ import annotations

import pytest
import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.models.base import build_layers
from hybridplan.models.zoo import get_model
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.executor import data_seed
from hybridplan.runtime.launch import launch
from hybridplan.profiling.stash_sizes import layer_stash_bytes
from tests.runtime.util import assert_same_training, make_plan, reference, single_device

pytestmark = pytest.mark.distributed

MIXED = [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3, 4])]
"""gpt-tiny on 1x5: tensor x2 (DTensor shards), a pipeline-only stage, data x2."""

_RUNS: dict = {}


def _run(schedule: str, **options):
    key = (schedule, tuple(sorted(options.items())))
    if key not in _RUNS:
        cfg = RunConfig(model="gpt-tiny", plan=make_plan(schedule, 16, 4, MIXED), cluster=Cluster.parse("1x5"),
                        iterations=3, **options)
        _RUNS[key] = launch(cfg)
        assert _RUNS[key].ok, _RUNS[key].reason
    return _RUNS[key]


def _memory(result):
    return [(d.iteration_peaks, d.static_memory_bytes, d.data_bytes, d.peak_breakdown, d.timeline) for d in result.devices]


def test_flush_is_1f1b_to_the_byte():
    one, flush = _run("1f1b", precision="bf16"), _run("flush", precision="bf16")
    assert flush.losses == one.losses
    assert _memory(flush) == _memory(one)


def test_2bw_memory_is_1f1b_plus_the_stash_and_simulated_devices_agree():
    one, two = _run("1f1b", precision="bf16"), _run("2bw", precision="bf16")
    model = get_model("gpt-tiny")
    none = layer_stash_bytes(model, "none", 1, precision="bf16")
    tensor = layer_stash_bytes(model, "tensor", 2, precision="bf16")
    stash = [sum(tensor[0:3])] * 2 + [sum(none[3:7])] + [sum(none[7:10])] * 2
    for a, b, s in zip(one.devices, two.devices, stash):
        assert b.peak_breakdown["weight_stash"] == s
        assert b.static_memory_bytes - a.static_memory_bytes == s
        assert [q - p for p, q in zip(a.iteration_peaks, b.iteration_peaks)] == [s] * 3
        # the stash is the only difference, at every action
        assert [{k: e[k] + s for k in ("before", "peak", "after")} | {"action": e["action"]} for e in a.timeline] == b.timeline
    sim = launch(RunConfig(model="gpt-tiny", plan=make_plan("2bw", 16, 4, MIXED), cluster=Cluster.parse("1x5"),
                           iterations=3, precision="bf16", backend="sim"))
    assert sim.ok, sim.reason
    assert _memory(sim) == _memory(two)
    # no staleness in the first iteration; later ones compute on the previous weights
    assert two.losses[0] == one.losses[0] and two.losses[1:] != one.losses[1:]


def test_2bw_mixed_plan_trains_like_one_device():
    assert_same_training("gpt-tiny", make_plan("2bw", 16, 4, MIXED), "1x5")


def test_2bw_on_one_device_is_the_update_of_the_paper():
    """W(t+1) = W(t) - AdamW(grad f(W(t-1))), written out by hand with torch's AdamW, against the runtime."""
    plan = make_plan("2bw", 16, 4, MIXED)
    got, weights, grads = reference("gpt-tiny", plan)
    flush, _, _ = reference("gpt-tiny", make_plan("1f1b", 16, 4, MIXED))
    model = get_model("gpt-tiny")
    module = torch.nn.Sequential(*build_layers(model, 0, model.num_layers, seed=0))
    params = list(module.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False)
    older = [p.detach().clone() for p in params]  # W(-1) = W(0)
    losses = []
    for it in range(3):
        inputs, targets = model.make_batch(16, torch.Generator().manual_seed(data_seed(0, it)))
        newest = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, w in zip(params, older):
                p.copy_(w)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(4):
            loss = model.loss(module(inputs[4 * j : 4 * j + 4]), targets[4 * j : 4 * j + 4]) / 4
            loss.backward()
            total += float(loss.detach())
        losses.append(total)
        with torch.no_grad():
            for p, w in zip(params, newest):
                p.copy_(w)
        older = newest
        optimizer.step()
    assert got.losses == pytest.approx(losses, rel=1e-6)
    assert flush.losses[0] == got.losses[0] and flush.losses[1] != got.losses[1]
    named = dict(module.named_parameters())
    # As in assert_same_training (tests/runtime/util.py): some gradients are mathematically zero (the attention
    # key bias) and hold only rounding noise, which AdamW normalises into full-size steps: their weights are left out.
    scale = max(g.norm().item() for g in grads.values())
    for key, g in grads.items():
        assert (g - named[key].grad).norm() <= 1e-4 * g.norm() + 1e-6 * scale, key
        if g.norm() > 1e-6 * scale:
            assert torch.allclose(weights[key], named[key].detach(), rtol=1e-5, atol=1e-7), key
    assert single_device(plan).schedule == "2bw"
