"""Per-layer forward and backward times from hooks (runtime/layer_timer.py); the model slices it times in chunks:
tests/models/test_slice.py."""

from __future__ import annotations

import time

import torch
from torch import nn

from hybridplan.runtime.layer_timer import LayerTimer
from hybridplan.runtime.stage import CheckpointedSequential

FORWARD_S, BACKWARD_S = 0.03, 0.05
"""Sleeps of the slow layer: long enough to stand out of a loaded machine's noise (the other layers take
microseconds)."""


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        time.sleep(BACKWARD_S)
        return grad


class Slow(nn.Module):
    """Sleeps in its forward and in its backward (and saves a tensor for it: under activation checkpointing,
    unpacking it in the backward is what recomputes the forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FORWARD_S)
        return torch.tanh(_SlowBackward.apply(x))


def _rows(module: nn.Sequential, microbatches: int = 2) -> dict:
    timer = LayerTimer(module, torch.device("cpu"))
    for _ in range(microbatches):
        module(torch.randn(4, 8, requires_grad=True)).sum().backward()
    return timer.take()


def test_time_lands_on_the_layer_that_spends_it():
    record = _rows(nn.Sequential(nn.Linear(8, 8), Slow(), nn.Tanh()))
    assert len(record["forward"]) == len(record["backward"]) == 2
    for fwd, bwd in zip(record["forward"], record["backward"]):
        assert fwd[1] >= FORWARD_S and max(fwd[0], fwd[2]) < FORWARD_S
        assert bwd[1] >= BACKWARD_S and max(bwd[0], bwd[2]) < BACKWARD_S


def test_recomputation_is_backward_time_not_forward():
    record = _rows(CheckpointedSequential(nn.Linear(8, 8), Slow(), nn.Tanh()), microbatches=1)
    (fwd,), (bwd,) = record["forward"], record["backward"]
    assert FORWARD_S <= fwd[1] < 2 * FORWARD_S  # counted once, not again when recomputed
    assert bwd[1] >= FORWARD_S + BACKWARD_S


def test_take_clears():
    timer = LayerTimer(nn.Sequential(nn.Linear(8, 8)), torch.device("cpu"))
    timer.module(torch.randn(2, 8)).sum().backward()
    assert len(timer.take()["forward"]) == 1 and timer.take() == {"forward": [], "backward": [], "step": []}


class _SlowStep(torch.optim.Optimizer):
    """Plain SGD whose step sleeps: the timer must see at least that long. It derives from ``Optimizer`` itself,
    not from ``SGD``: torch wraps ``step`` with the step hooks in every class it instantiates, so a subclass
    calling an already wrapped ``SGD.step`` would fire the hooks twice per step (it did when another test had
    made an ``SGD`` first)."""

    def __init__(self, params, lr: float):  # type: ignore[no-untyped-def]
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        time.sleep(FORWARD_S)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_optimizer_step_is_timed_once_per_step():
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    optimizer = _SlowStep(module.parameters(), lr=0.1)
    timer = LayerTimer(module, torch.device("cpu"), optimizer)
    for _ in range(2):
        module(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    steps = timer.take()["step"]
    assert len(steps) == 2 and all(len(row) == 1 and row[0] >= FORWARD_S for row in steps)
    assert timer.take()["step"] == []
