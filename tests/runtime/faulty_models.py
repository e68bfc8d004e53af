"""Models that fail on purpose, for the launcher's failure tests (imported by the spawned ranks)."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from hybridplan.models.gpt import GPT, GPT_CONFIGS


class _Fail(nn.Module):
    def __init__(self, inner: nn.Module, how: str) -> None:
        super().__init__()
        self.inner = inner
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "meta":  # the launcher's shape pass: behave
            return self.inner(x)
        if self.how == "raise":
            raise RuntimeError("boom in the faulty layer")
        if self.how == "exit":
            os._exit(7)
        if self.how == "hang":
            time.sleep(3600)
        return self.inner(x)


class FaultyGPT(GPT):
    """gpt-tiny whose layer ``layer`` raises, exits the process, or hangs in its forward."""

    def __init__(self, layer: int, how: str) -> None:
        super().__init__("gpt-tiny-faulty", GPT_CONFIGS["gpt-tiny"])
        self.faulty_layer = layer
        self.how = how

    def build_layer(self, index: int) -> nn.Module:
        layer = super().build_layer(index)
        return _Fail(layer, self.how) if index == self.faulty_layer else layer

    def tensor_parallel_plan(self, index: int):
        return None if index == self.faulty_layer else super().tensor_parallel_plan(index)


def hanging_gpt() -> FaultyGPT:
    """gpt-tiny whose middle layer hangs: a run that lasts until it is killed (``--model
    tests.runtime.faulty_models:hanging_gpt``, with the repository on PYTHONPATH)."""
    return FaultyGPT(5, "hang")
