"""VGG11 zoo: mCAP's 30 layers, torchvision's parameter count, determinism, tensor parallelism."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from gloo import (
    WORLD,
    GlooPool,
    assert_builds_deterministic,
    assert_make_batch_deterministic,
    assert_samples_independent,
    assert_tensor_parallel_matches,
    check_tensor_parallel,
    meta_parameter_count,
    run_chain,
    run_chain_fake,
    tensor_parallel_layers,
)
from torch import nn

from hybridplan.models import get_model
from hybridplan.models.tensor_parallel import TensorParallelPlan

# torchvision vgg11: features (conv/ReLU pairs with 5 max-pools), avgpool, flatten, classifier.
_C, _R, _P = nn.Conv2d, nn.ReLU, nn.MaxPool2d
TORCHVISION_ORDER = [
    _C, _R, _P, _C, _R, _P, _C, _R, _C, _R, _P, _C, _R, _C, _R, _P, _C, _R, _C, _R, _P,
    nn.AdaptiveAvgPool2d, nn.Flatten,
    nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear,
]  # fmt: skip


@pytest.mark.parametrize("name", ["vgg11", "vgg11-tiny"])
def test_thirty_layers_in_torchvision_order(name: str) -> None:
    model = get_model(name)
    assert model.num_layers == 30
    with torch.device("meta"):
        layers = [model.build_layer(i) for i in range(30)]
    assert [type(layer) for layer in layers] == TORCHVISION_ORDER
    assert all(layer.p == 0.0 for layer in layers if isinstance(layer, nn.Dropout))
    assert not any(getattr(layer, "inplace", False) for layer in layers)
    names = [model.layer_name(i) for i in range(30)]
    assert names[:3] == ["conv0", "relu0", "pool0"] and names[21:24] == ["avgpool", "flatten", "fc0"]
    assert names[-1] == "fc2" and len(set(names)) == 30


def test_vgg11_parameter_count_is_torchvision() -> None:
    assert meta_parameter_count(get_model("vgg11")) == 132_863_336  # torchvision vgg11 "num_params"


def test_builds_are_deterministic() -> None:
    assert_builds_deterministic(get_model("vgg11-tiny"), layers=[0, 1, 2, 21, 23, 29])


def test_make_batch_is_deterministic() -> None:
    x, y = assert_make_batch_deterministic(get_model("vgg11-tiny"))
    assert x.shape == (3, 3, 32, 32) and y.max() < 10


def test_training_step_runs() -> None:
    out, _ = run_chain(get_model("vgg11-tiny"), 2)
    assert out.shape == (2, 10)


def test_samples_are_independent() -> None:
    assert_samples_independent(get_model("vgg11-tiny"), num_samples=4, split=1)


def test_runs_under_fake_tensors() -> None:
    assert run_chain_fake(get_model("vgg11-tiny"), 2) == (2, 10)


def test_paper_size_runs_under_fake_tensors() -> None:
    assert run_chain_fake(get_model("vgg11"), 1) == (1, 1000)


def test_tensor_parallel_plans() -> None:
    model = get_model("vgg11-tiny")
    for i in range(30):
        plan = model.tensor_parallel_plan(i)
        assert isinstance(plan, TensorParallelPlan)
        if model.layer_name(i).startswith(("conv", "fc")):
            assert plan.rules
        else:
            assert plan.rules == [] and model.tensor_parallel_problem(i, 3) is None
    assert "output size of Conv2d 4 is not divisible by degree 8" in model.tensor_parallel_problem(0, 8)
    assert "output size of Linear 10 is not divisible by degree 4" in model.tensor_parallel_problem(29, 4)


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_tensor_parallel_matches_unsplit(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    model = get_model("vgg11-tiny")
    layers = tensor_parallel_layers(model, degree)
    assert layers == list(range(30 if degree == 2 else 29))  # 10 classes do not split 4 ways
    results = gloo_pool(WORLD).run(check_tensor_parallel, [(model, layers)], degree)
    assert_tensor_parallel_matches(results)
    assert results[0]["vgg11-tiny conv0 sharded"] == 2 and results[0]["vgg11-tiny relu0 sharded"] == 0
