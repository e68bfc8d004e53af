"""The tensors that cross a model's layer boundaries (models/boundaries.py), found on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.boundaries import BoundarySpec, boundary_specs
from hybridplan.models.slice import ModelSlice
from hybridplan.models.zoo import get_model


def test_gpt_boundaries_are_token_ids_then_hidden_states_then_logits():
    model = get_model("gpt-tiny")
    specs = boundary_specs(model)
    assert len(specs) == model.num_layers + 1
    assert specs[0] == BoundarySpec((16,), torch.int64)
    assert {s for s in specs[1:-1]} == {BoundarySpec((16, 64), torch.float32)}  # every block keeps the shape
    assert specs[-1].sample_shape[0] == 16 and specs[-1].dtype == torch.float32
    assert boundary_specs(model, stop=3) == specs[:4]


def test_a_slice_starting_inside_the_model_takes_its_boundary():
    whole = boundary_specs(get_model("gpt-tiny"))
    part = ModelSlice(get_model("gpt-tiny"), 3, 7)
    assert boundary_specs(part) == whole[3:8]


class _Layers(LayeredModel):
    """Two given layers on 4-feature samples: what a user model may get wrong."""

    name = "bad"

    def __init__(self, second: nn.Module) -> None:
        self.second = second

    @property
    def num_layers(self) -> int:
        return 2

    def layer_name(self, index: int) -> str:
        return f"layer{index}"

    def build_layer(self, index: int) -> nn.Module:
        return nn.Linear(4, 3) if index == 0 else self.second

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(num_samples, 4, generator=generator), torch.zeros(num_samples)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.sum()


class _Scalar(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def test_a_layer_that_breaks_the_contract_is_named():
    with pytest.raises(ModelError, match=r"layer 1 \(layer1\) of bad returned Tensor with no batch dimension"):
        boundary_specs(_Layers(_Scalar()))
    with pytest.raises(ModelError, match=r"layer 1 \(layer1\) of bad failed on a meta-device batch of shape \(1, 3\)"):
        boundary_specs(_Layers(nn.Linear(5, 2)))
