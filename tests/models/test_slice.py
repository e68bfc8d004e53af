"""Layers ``[start, stop)`` of a model as a model of its own (models/slice.py): the inputs, targets and loss of a
slice, its layers the model's, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from hybridplan.errors import ModelError
from hybridplan.models.slice import ModelSlice
from hybridplan.models.zoo import get_model


def test_model_slice():
    model = get_model("gpt-tiny")
    middle, tail = ModelSlice(model, 3, 7), ModelSlice(model, 7, 10)
    x, y = middle.make_batch(4, torch.Generator().manual_seed(0))
    assert x.dtype == torch.float32 and x.shape[0] == 4 and y.shape == (4,)
    layer = middle.build_layer(0)
    out = layer(x)
    assert out.requires_grad and middle.loss(out, y).dim() == 0
    x, y = tail.make_batch(4, torch.Generator().manual_seed(0))
    ref_x, ref_y = model.make_batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(y, ref_y) and x.dtype == torch.float32  # the model's targets, for its loss
    assert middle.tensor_parallel_problem(0, 2) is None and middle.sample_granularity == 1
    with pytest.raises(ModelError, match="not a non-empty range"):
        ModelSlice(model, 5, 5)


def test_a_slice_names_and_builds_the_models_layers():
    model = get_model("tests.cli.user_models:mlp")  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)
    part = ModelSlice(model, 2, 5)
    assert part.num_layers == 3 and part.name == f"{model.name}[2:5]"
    assert [part.layer_name(i) for i in range(3)] == [model.layer_name(i) for i in range(2, 5)]
    first = part.build_layer(0)
    assert isinstance(first, torch.nn.Linear) and (first.in_features, first.out_features) == (32, 32)
    assert part.config()["layers"] == [2, 5]


def test_a_slice_inside_the_model_gets_random_inputs_of_its_boundary_and_a_mean_loss():
    model = get_model("tests.cli.user_models:mlp")
    part = ModelSlice(model, 1, 3)  # ReLU, Linear(32, 32): receives the 32 features of layer 0, ends inside
    x, y = part.make_batch(4, torch.Generator().manual_seed(0))
    assert x.shape == (4, 32) and x.dtype == torch.float32 and y.shape == (4,)
    again, _ = part.make_batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)  # the generator fixes the inputs
    out = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    assert part.loss(out, y[:2]).item() == 3.0  # the mean of the output: (1 + 2 + 3 + 6) / 4


def _received(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input ``layer``'s forward sees (after the slice's own pre-hook), back-propagated through."""
    seen = []
    layer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    layer(x).sum().backward()
    return seen[0]


def test_the_first_layer_of_an_inner_slice_computes_its_input_gradient():
    model = get_model("tests.cli.user_models:mlp")
    inner = _received(ModelSlice(model, 2, 5).build_layer(0), torch.randn(3, 32))  # no gradient asked for, as received
    assert inner.requires_grad and inner.grad is not None and inner.grad.shape == (3, 32)
    first = _received(ModelSlice(model, 0, 5).build_layer(0), torch.randn(3, 16))  # the model's input is data
    assert not first.requires_grad and first.grad is None


@pytest.mark.parametrize("start, stop", [(-1, 2), (3, 3), (4, 2), (0, 6)])
def test_empty_or_out_of_range_slices_are_refused(start, stop):
    with pytest.raises(ModelError, match=r"not a non-empty range of .*'s 5 layers"):
        ModelSlice(get_model("tests.cli.user_models:mlp"), start, stop)
