"""User models: from_sequential on an MLP and a conv net, shapes, losses, seeded rebuilds, pickling, loading, TP."""

from __future__ import annotations

import pickle
import textwrap
from collections.abc import Callable
from pathlib import Path

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
    run_chain,
    run_chain_fake,
    tensor_parallel_layers,
)
from torch import nn

from hybridplan.errors import ModelError
from hybridplan.models import build_layers, get_model
from hybridplan.models.user import SequentialModel, from_sequential


class Scale(nn.Module):
    """A module with a parameter and no reset_parameters (its values must survive rebuilding)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.arange(width, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 8))


def conv_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
        nn.GroupNorm(4, 8), nn.Flatten(), nn.Linear(8 * 4 * 4, 12),
    )  # fmt: skip


def test_mlp_infers_shapes_and_classes() -> None:
    model = from_sequential(mlp(), name="mlp")
    assert isinstance(model, SequentialModel) and model.num_layers == 5
    assert model.input_shape == (12,) and model.output_shape == (8,) and model.num_classes == 8
    assert [model.layer_name(i) for i in range(5)] == ["0.linear", "1.relu", "2.linear", "3.tanh", "4.linear"]
    x, y = assert_make_batch_deterministic(model)
    assert x.shape == (3, 12) and y.shape == (3,) and y.max() < 8
    out, _ = run_chain(model, 4)
    assert out.shape == (4, 8)
    assert_samples_independent(model)
    assert model.parameter_count() == sum(p.numel() for p in mlp().parameters())
    assert "mlp" in model.describe() and model.config()["layers"][0] == "Linear"


def test_conv_net_needs_an_input_shape() -> None:
    with pytest.raises(ModelError, match=r"nn.Conv2d\(3, ...\): the image size is unknown"):
        from_sequential(conv_net(), name="cnn")
    model = from_sequential(conv_net(), name="cnn", input_shape=(3, 8, 8), num_classes=10)
    assert model.output_shape == (12,) and model.num_classes == 10
    x, y = model.make_batch(2, torch.Generator().manual_seed(0))
    assert x.shape == (2, 3, 8, 8) and y.max() < 10
    run_chain(model, 2)
    assert run_chain_fake(model, 2) == (2, 12)


def test_embedding_model_draws_token_ids() -> None:
    seq = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50))
    with pytest.raises(ModelError, match="input_shape=\\(seq_len,\\)"):
        from_sequential(seq, name="lm")
    model = from_sequential(seq, name="lm", input_shape=(7,))
    x, y = model.make_batch(3, torch.Generator().manual_seed(0))
    assert x.dtype == torch.long and x.shape == (3, 7) and 0 <= x.min() and x.max() < 50
    assert y.shape == (3, 7)  # one class per token: classes on the last output dimension
    run_chain(model, 3)


def test_mse_loss() -> None:
    model = from_sequential(mlp(), name="regress", loss="mse")
    x, y = model.make_batch(3, torch.Generator().manual_seed(0))
    assert y.shape == (3, 8) and y.is_floating_point()
    run_chain(model, 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss": "hinge"}, "unknown loss 'hinge'"),
        ({"num_classes": 9}, "num_classes 9 is outside \\[1, 8\\]"),
        ({"loss": "mse", "num_classes": 3}, "num_classes 3 given with loss 'mse'"),
        ({"input_shape": (13,)}, "fails on an input of shape \\[13\\]"),
        ({"input_dtype": torch.long}, "integer input_dtype"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        from_sequential(mlp(), name="mlp", **kwargs)


def test_bad_models() -> None:
    with pytest.raises(ModelError, match="no children"):
        from_sequential(nn.Sequential(), name="empty")
    with pytest.raises(ModelError, match="starts with ReLU"):
        from_sequential(nn.Sequential(nn.ReLU(), nn.Linear(3, 3)), name="relu-first")


def test_rebuilt_weights_depend_only_on_the_seed() -> None:
    a = from_sequential(mlp(), name="mlp")
    b = from_sequential(mlp(), name="mlp")  # other initial weights: the RNG moved on
    assert_builds_deterministic(a)
    for la, lb in zip(build_layers(a, 0, 5, seed=3), build_layers(b, 0, 5, seed=3)):
        for (_, pa), (_, pb) in zip(la.named_parameters(), lb.named_parameters()):
            assert torch.equal(pa, pb)
    assert not torch.equal(build_layers(a, 0, 1, seed=3)[0].weight, a.seq[0].weight)  # re-initialised


def test_parameters_without_reset_keep_their_values() -> None:
    model = from_sequential(nn.Sequential(nn.Linear(4, 4), Scale(4)), name="scaled")
    (layer,) = build_layers(model, 1, 2, seed=0)
    assert torch.equal(layer.scale, torch.arange(4.0)) and layer.scale is not model.seq[1].scale
    with torch.device("meta"):
        assert model.build_layer(1).scale.device.type == "meta"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # layers are made like constructors make them: default dtype
    try:
        assert model.build_layer(0).weight.dtype == model.build_layer(1).scale.dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_pickle_round_trip() -> None:
    model = from_sequential(conv_net(), name="cnn", input_shape=(3, 8, 8))
    again = pickle.loads(pickle.dumps(model))
    assert again.config() == model.config()
    for la, lb in zip(build_layers(model, 0, 7, seed=1), build_layers(again, 0, 7, seed=1)):
        assert all(torch.equal(pa, pb) for pa, pb in zip(la.parameters(), lb.parameters()))


def test_tensor_parallel_plans() -> None:
    model = from_sequential(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), Scale(6), nn.Linear(6, 3)), name="m")
    assert [bool(model.tensor_parallel_plan(i) and model.tensor_parallel_plan(i).rules) for i in (0, 1, 3)] == [
        True,
        False,
        True,
    ]
    assert model.tensor_parallel_plan(1).rules == [] and model.tensor_parallel_plan(2) is None
    assert model.tensor_parallel_problem(2, 2) == "this layer has no tensor-parallel split"
    assert "output size of Linear 3 is not divisible by degree 2" in model.tensor_parallel_problem(3, 2)


def _write_module(directory: Path, name: str) -> None:
    (directory / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from torch import nn
            from hybridplan.models.user import from_sequential

            def plain():
                return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 4))

            def wrapped():
                seq = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
                return from_sequential(seq, name="wrapped", input_shape=(3, 6, 6))

            def wrong():
                return 42
            """
        )
    )


def test_get_model_loads_module_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_module(tmp_path, "hybridplan_test_user_models")
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = get_model("hybridplan_test_user_models:plain")
    assert plain.name == "hybridplan_test_user_models:plain" and plain.output_shape == (4,)
    run_chain(plain, 2)
    wrapped = get_model("hybridplan_test_user_models:wrapped")
    assert wrapped.name == "wrapped" and wrapped.output_shape == (5,)
    with pytest.raises(ModelError, match="returned int"):
        get_model("hybridplan_test_user_models:wrong")
    with pytest.raises(ModelError, match="cannot import module"):
        get_model("hybridplan_no_such_module:plain")


@pytest.mark.distributed
def test_tensor_parallel_matches_unsplit(gloo_pool: Callable[[int], GlooPool]) -> None:
    mlp_model = from_sequential(mlp(), name="mlp")
    cnn = from_sequential(conv_net(), name="cnn", input_shape=(3, 8, 8))
    cases = [(m, tensor_parallel_layers(m, 2)) for m in (mlp_model, cnn)]
    assert cases[0][1] == [0, 1, 2, 3, 4] and cases[1][1] == [0, 1, 2, 3, 5, 6]  # GroupNorm: not splittable
    results = gloo_pool(WORLD).run(check_tensor_parallel, cases, 2)
    assert_tensor_parallel_matches(results)
    assert results[0]["cnn 0.conv2d sharded"] == 2
