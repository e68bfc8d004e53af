"""Per-layer forward and backward seconds of a stage, from hooks (``RunConfig.layer_timing``).

The time model needs every layer's forward and backward time (profiling/time_profile.py); the runtime
measures them while it trains, with the stage's real schedule, communication and precision:

- forward: a pre-hook and a post-hook on every layer time its call;
- backward: a hook on every layer's output tensor fires when the gradient with respect to that output
  is complete, which is when the layer's backward starts; layer ``i``'s backward ends where layer
  ``i - 1``'s starts, and the first layer's when the autograd pass ends (a callback queued on the
  autograd engine, as DistributedDataParallel queues its final reduction). A layer whose output carries
  no gradient (an integer output) gets 0 and its time counts to the layer above it.

- the optimizer step: ``torch.optim.Optimizer``'s own step pre- and post-hooks time every ``step()`` (the
  time model composes it per parameter: predict/stage_compute.py). Only the update itself: the data-parallel
  gradient all-reduce before it is not included.

Under activation checkpointing the recomputed forward runs inside the backward pass: it is not counted
as a forward, and its time is part of the layer's backward, as it is in training.

On CUDA every stamp synchronises the device first (kernels run asynchronously), which serialises the
stage a little: the usual price of per-layer GPU profiling (torchgpipe's ``profile_times`` synchronises
around every layer too). CPU timings need no synchronisation but are noisy, and CPU times say little about
a GPU's: profile on the device you plan for.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
from torch import nn

__all__ = ["LayerTimer"]


class LayerTimer:
    """Hooks on a stage's layers that record per-micro-batch, per-layer seconds.

    Args:
        module: the stage's ``nn.Sequential`` (its children are the layers).
        device: where the stage runs (a CUDA device is synchronised at every stamp).
        optimizer: the stage's optimizer, whose ``step()`` is timed too (None: not timed).

    Example:
        >>> timer = LayerTimer(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), torch.device("cpu"))
        >>> timer.module(torch.randn(2, 4)).sum().backward()
        >>> record = timer.take()
        >>> len(record["forward"]), len(record["forward"][0]), len(record["backward"][0]), record["step"]
        (1, 2, 2, [])
    """

    def __init__(self, module: nn.Sequential, device: torch.device, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.module = module
        self.num_layers = len(module)
        self._cuda = device if device.type == "cuda" else None
        self._forward: list[list[float]] = []
        self._backward: list[list[float]] = []
        self._started: float = 0.0
        self._marks: dict[int, float] | None = None
        self._step: list[list[float]] = []
        self._step_started = 0.0
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._before_step)
            optimizer.register_step_post_hook(self._after_step)
        for i, layer in enumerate(module):
            layer.register_forward_pre_hook(partial(self._before_forward, i))
            layer.register_forward_hook(partial(self._after_forward, i))

    def _now(self) -> float:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        return time.perf_counter()

    # ------------------------------------------------------------------ forward
    def _before_forward(self, index: int, module: nn.Module, args: Any) -> None:
        if self._marks is not None:  # a recomputation inside the backward pass
            return
        if index == 0:
            self._forward.append([0.0] * self.num_layers)
        self._started = self._now()

    def _after_forward(self, index: int, module: nn.Module, args: Any, output: Any) -> None:
        if self._marks is not None or not self._forward:
            return
        self._forward[-1][index] = self._now() - self._started
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(partial(self._gradient_ready, index))

    # ------------------------------------------------------------------ backward
    def _gradient_ready(self, index: int, grad: torch.Tensor) -> None:
        now = self._now()
        if self._marks is None:
            self._marks = {}
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        self._marks[index] = now

    def _backward_done(self) -> None:
        end = self._now()
        marks, self._marks = self._marks or {}, None
        row = [0.0] * self.num_layers
        for index in sorted(marks):  # backward runs from the last layer to the first
            row[index] = end - marks[index]
            end = marks[index]
        self._backward.append(row)

    # ------------------------------------------------------------------ optimizer step
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._step_started = self._now()

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._step.append([self._now() - self._step_started])

    def take(self) -> dict[str, list[list[float]]]:
        """The records since the last call: ``{"forward": [...], "backward": [...], "step": [...]}``: one row
        of per-layer seconds per micro-batch, in execution order, and one ``[seconds]`` row per optimizer step."""
        out = {"forward": self._forward, "backward": self._backward, "step": self._step}
        self._forward, self._backward, self._step = [], [], []
        return out
