"""A contiguous range of a model's layers, as a model of its own (for timing layers in chunks).

``hybridplan profile --time`` (profiling/timing.py) times layers by training them as one pipeline stage.
A model too large for the devices of one stage, or whose layers cannot all be split at a tensor degree,
is timed in chunks of consecutive layers: :class:`ModelSlice` makes layers ``[start, stop)`` of a model a
:class:`LayeredModel` that the runtime trains like any other. What differs from the layers inside the
whole model, and why it does not matter for their times:

- inputs: a slice that starts inside the model gets random inputs of the shape and dtype its first layer
  receives there (models/boundaries.py ``boundary_specs``); a layer's time does not depend on the values
  (data-dependent layers such as a GShard MoE's router may vary slightly);
- the first layer's input requires a gradient when it is floating point, as a stage's received input
  does, so the first layer's backward computes its input gradient as it would inside the model;
- the loss: a slice that stops inside the model has none; the mean of its output stands in (its backward
  is one fill of the output's gradient);
- the weights: layer ``i`` of the slice is seeded as layer ``i`` of a model (models/base.py), not as
  layer ``start + i``: other values, the same shapes and work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.boundaries import boundary_specs
from hybridplan.models.tensor_parallel import TensorParallelPlan

__all__ = ["ModelSlice"]


def _input_requires_grad(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: a floating input becomes a leaf that requires grad (as a received activation)."""
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.is_floating_point() and not x.requires_grad and torch.is_grad_enabled():
        return (x.detach().requires_grad_(), *args[1:])
    return None


class ModelSlice(LayeredModel):
    """Layers ``[start, stop)`` of ``model`` (module docstring).

    Args:
        model: the whole model.
        start: first layer of the slice.
        stop: one past its last layer.

    Raises:
        ModelError: for an empty or out-of-range slice.

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> part = ModelSlice(get_model("gpt-tiny"), 3, 7)
        >>> part.num_layers, part.layer_name(0), part.name
        (4, 'block2', 'gpt-tiny[3:7]')
    """

    def __init__(self, model: LayeredModel, start: int, stop: int) -> None:
        if not 0 <= start < stop <= model.num_layers:
            raise ModelError(
                f"layers [{start}, {stop}) are not a non-empty range of {model.name}'s {model.num_layers} layers",
                fix=f"use 0 <= start < stop <= {model.num_layers}",
            )
        self.model = model
        self.start = start
        self.stop = stop
        self.name = f"{model.name}[{start}:{stop}]"
        self._input_spec = boundary_specs(model, stop=start)[start]

    @property
    def num_layers(self) -> int:
        return self.stop - self.start

    @property
    def sample_granularity(self) -> int:
        return self.model.sample_granularity

    def layer_name(self, index: int) -> str:
        return self.model.layer_name(self.start + index)

    def build_layer(self, index: int) -> nn.Module:
        layer = self.model.build_layer(self.start + index)
        if index == 0 and self.start > 0:
            layer.register_forward_pre_hook(_input_requires_grad)
        return layer

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        return self.model.tensor_parallel_plan(self.start + index)

    def tensor_parallel_problem(self, index: int, degree: int) -> str | None:
        return self.model.tensor_parallel_problem(self.start + index, degree)

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.model.make_batch(num_samples, generator)
        if self.start > 0:
            spec = self._input_spec
            shape = (num_samples, *spec.sample_shape)
            if spec.dtype.is_floating_point:
                inputs = torch.randn(shape, generator=generator, dtype=spec.dtype)
            else:
                inputs = torch.zeros(shape, dtype=spec.dtype)
        if self.stop < self.model.num_layers:
            targets = torch.zeros(num_samples)
        return inputs, targets

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.stop == self.model.num_layers:
            return self.model.loss(output, target)
        return output.float().mean()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model.config(), "layers": [self.start, self.stop]}
