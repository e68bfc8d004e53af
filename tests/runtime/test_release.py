"""Dropping a sent stage output's values while keeping its autograd edge (runtime/release.py): what is released,
what is kept, and that the backward pass through the kept edge still gives the input its gradient."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import get_gradient_edge

from hybridplan.runtime.release import is_fake, release_output, same_storage


class _Meter:
    """Records the tensors it is told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[torch.Tensor] = []

    def forget(self, t: torch.Tensor) -> None:
        self.forgotten.append(t)


def test_fake_tensors_and_shared_storages_are_told_apart():
    t = torch.zeros(4)
    assert not is_fake(t)
    with FakeTensorMode() as mode:
        assert is_fake(mode.from_tensor(t))
    assert same_storage(t, t[1:]) and same_storage(t, t.view(2, 2))
    assert not same_storage(t, t.clone())


def test_a_released_output_keeps_its_edge_and_the_input_gets_its_gradient():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    grad = torch.randn(4, 2)
    x_ref = torch.randn(4, 3, requires_grad=True)
    layer(x_ref).backward(grad)  # the reference: nothing released
    x = x_ref.detach().clone().requires_grad_()
    y = layer(x)  # Linear saves its input and weight, not its output
    edge, meter = get_gradient_edge(y), _Meter()
    release_output(y, x, meter)
    assert y.numel() == 0 and y.grad_fn is not None  # the values are gone, the edge is not
    assert len(meter.forgotten) == 1 and meter.forgotten[0].shape == (4, 2)
    torch.autograd.backward([edge], grad_tensors=[grad])
    assert torch.equal(x.grad, x_ref.grad)


def test_outputs_something_still_needs_are_kept():
    x = torch.randn(4, 3, requires_grad=True)
    meter = _Meter()
    y = torch.sigmoid(x * 2)  # sigmoid's backward reads its own output
    release_output(y, x, meter)
    assert y.shape == (4, 3)
    view = (x * 2)[1:]  # a view: its base holds the values
    release_output(view, x, meter)
    assert view.shape == (3, 3)
    release_output(x, x, meter)  # an identity stage returns its input
    plain = torch.randn(2)  # no autograd history
    release_output(plain, x, meter)
    assert x.shape == (4, 3) and plain.shape == (2,) and meter.forgotten == []


def test_under_checkpointing_the_output_is_released_without_looking():
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.sigmoid(x * 2)
    meter = _Meter()
    release_output(y, x, meter, checkpointed=True)  # a checkpointed region's saved tensors are placeholders
    assert y.numel() == 0 and len(meter.forgotten) == 1
