"""The Megatron-style rules one by one: divisibility problems, DTensor shards, and equivalence on gloo."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gloo import WORLD, GlooPool, assert_tensor_parallel_matches, check_tensor_parallel, tensor_parallel_group
from torch import nn

from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    CopyInput,
    GatherOutput,
    ReduceOutput,
    RowParallel,
    ShardParams,
    TensorParallelPlan,
    VocabParallelEmbedding,
    full_parameter,
    is_sharded_parameter,
)


class RawMLP(nn.Module):
    """Two bare weight tensors (like MoE experts): split by ShardParams inside a CopyInput/ReduceOutput region."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(width, hidden) / width**0.5)
        self.w2 = nn.Parameter(torch.randn(hidden, width) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.w1) @ self.w2


class ConvPair(nn.Module):
    """Column-parallel conv, ReLU, row-parallel conv with a bias (added once, after the all-reduce)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


class ConvNorm(nn.Module):
    """Conv + GroupNorm over its sharded channels (whole groups per rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


_TOKEN_LAYERS: list[tuple[str, Any, TensorParallelPlan | None]] = [
    ("embed", lambda: nn.Embedding(16, 12), TensorParallelPlan([("", VocabParallelEmbedding())])),
    ("column", lambda: nn.Linear(12, 12), TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput())])),
    (
        "mlp",
        lambda: nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 12)),
        TensorParallelPlan([("0", ColumnParallel()), ("2", RowParallel())]),
    ),
    (
        "raw",
        lambda: RawMLP(12, 24),
        TensorParallelPlan([("", CopyInput()), ("", ShardParams({"w1": 1, "w2": 0})), ("", ReduceOutput())]),
    ),
    ("norm", lambda: nn.LayerNorm(12), None),
]
_IMAGE_LAYERS: list[tuple[str, Any, TensorParallelPlan | None]] = [
    (
        "convnorm",
        ConvNorm,
        TensorParallelPlan(
            [
                ("conv", ColumnParallel()),
                ("norm", ShardParams({"weight": 0, "bias": 0}, divide=("num_groups",))),
                ("norm", GatherOutput(dim=1)),
            ]
        ),
    ),
    ("convpair", ConvPair, TensorParallelPlan([("a", ColumnParallel()), ("b", RowParallel())])),
    ("flatten", lambda: nn.Flatten(), TensorParallelPlan([])),
    ("head", lambda: nn.Linear(8 * 8 * 8, 4), TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput())])),
]


class ToyModel(LayeredModel):
    """A layered model made of one example layer per rule (picklable: layers are looked up by name)."""

    def __init__(self, kind: str) -> None:
        self.name = kind
        self.kind = kind

    @property
    def _layers(self) -> list[tuple[str, Any, TensorParallelPlan | None]]:
        return _TOKEN_LAYERS if self.kind == "tokens" else _IMAGE_LAYERS

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def layer_name(self, index: int) -> str:
        return self._layers[index][0]

    def build_layer(self, index: int) -> nn.Module:
        return self._layers[index][1]()

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        return self._layers[index][2]

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "tokens":
            return torch.randint(0, 16, (num_samples, 5), generator=generator), torch.zeros(num_samples, 5)
        return torch.randn(num_samples, 3, 8, 8, generator=generator), torch.zeros(num_samples, 4)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)


# ---------------------------------------------------------------------------------------------- problems
def test_rules_report_non_divisible_sizes() -> None:
    assert ColumnParallel().problem(nn.Linear(4, 6), 4) == "output size of Linear 6 is not divisible by degree 4"
    assert ColumnParallel().problem(nn.Linear(4, 8), 4) is None
    assert RowParallel().problem(nn.Conv2d(6, 4, 1), 4) == "input size of Conv2d 6 is not divisible by degree 4"
    assert ShardParams({"w2": 1}).problem(RawMLP(5, 4), 2) == "dimension 1 of w2 5 is not divisible by degree 2"
    assert ShardParams(divide=("num_groups",)).problem(nn.GroupNorm(6, 12), 4) == (
        "num_groups 6 is not divisible by degree 4"
    )
    assert VocabParallelEmbedding().problem(nn.Embedding(10, 4), 4) == "vocabulary size 10 is not divisible by degree 4"


def test_plan_problem_names_the_submodule() -> None:
    plan = TensorParallelPlan([("0", ColumnParallel()), ("2", RowParallel())])
    layer = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
    assert plan.problem(layer, 2) is None
    assert plan.problem(layer, 4) == "0: output size of Linear 6 is not divisible by degree 4"
    whole = TensorParallelPlan([("", ColumnParallel())])
    assert whole.problem(nn.Linear(2, 3), 2) == "layer: output size of Linear 3 is not divisible by degree 2"


def test_model_problem_for_a_layer_without_a_split() -> None:
    model = ToyModel("tokens")
    assert model.tensor_parallel_problem(4, 2) == "this layer has no tensor-parallel split"
    assert model.tensor_parallel_problem(3, 4) is None
    assert model.tensor_parallel_problem(3, 5) == "layer: dimension 1 of w1 24 is not divisible by degree 5"


# ---------------------------------------------------------------------------------------------- processes
def _fail_on_rank(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        raise ValueError(f"boom on rank {rank}")
    return rank


@pytest.mark.distributed
def test_failures_in_children_reach_the_parent(tmp_path: Path) -> None:
    pool = GlooPool(2, tmp_path)
    try:
        assert pool.run(_fail_on_rank, -1) == [0, 1]
        with pytest.raises(AssertionError, match="(?s)rank 1 raised:.*ValueError: boom on rank 1"):
            pool.run(_fail_on_rank, 1)
    finally:
        pool.close()


def _shard_layout(rank: int, world: int, degree: int) -> dict[str, Any]:
    """Apply column and row rules to Linear(6, 8) / Linear(8, 6) and report how the parameters are held."""
    from torch.distributed.tensor import DTensor, Shard

    tp = tensor_parallel_group(rank, world, degree)
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
    original = {k: v.clone() for k, v in layer.state_dict().items()}
    TensorParallelPlan([("0", ColumnParallel()), ("2", RowParallel())]).apply(layer, tp)
    col_w = layer.get_parameter("0.parametrizations.weight.original")
    row_w = layer.get_parameter("2.parametrizations.weight.original")
    row_bias = layer.get_parameter("2.tp_bias")
    local_shapes = [tuple(getattr(layer[i], "weight").shape) for i in (0, 2)]  # through the parametrization
    return {
        "dtensors": [isinstance(p, DTensor) for p in (col_w, row_w)],
        "placements": [getattr(col_w, "placements") == (Shard(0),), getattr(row_w, "placements") == (Shard(1),)],
        "local shapes": local_shapes,
        "sharded flags": [is_sharded_parameter(col_w), is_sharded_parameter(row_bias)],
        # full_parameter gathers (a collective): the full weights come back exactly.
        "gathered": [
            torch.equal(full_parameter(col_w), original["0.weight"]),
            torch.equal(full_parameter(row_w), original["2.weight"]),
            torch.equal(full_parameter(row_bias), original["2.bias"]),
        ],
    }


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_parameters_are_dtensor_shards(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    for report in gloo_pool(WORLD).run(_shard_layout, degree):
        assert report["dtensors"] == [True, True]
        assert report["placements"] == [True, True]
        assert report["local shapes"] == [(8 // degree, 6), (6, 8 // degree)]
        assert report["sharded flags"] == [True, False]
        assert report["gathered"] == [True, True, True]


@pytest.mark.distributed
@pytest.mark.parametrize("degree", [2, 4])
def test_every_rule_matches_the_unsplit_layer(gloo_pool: Callable[[int], GlooPool], degree: int) -> None:
    cases = [(ToyModel("tokens"), [0, 1, 2, 3]), (ToyModel("images"), [0, 1, 2, 3])]
    results = gloo_pool(WORLD).run(check_tensor_parallel, cases, degree)
    assert_tensor_parallel_matches(results)
    first = results[0]
    assert first["tokens raw sharded"] == 2 and first["images convpair sharded"] == 3  # a.weight, a.bias, b.weight
    assert "images convpair b.bias grad" in first  # RowParallel's bias, added once after the reduction
