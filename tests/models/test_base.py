"""The layered-model protocol (models/base.py): deterministic per-layer seeds that do not disturb the caller's RNG,
layers built the same wherever a stage starts, and the defaults a model inherits."""

from __future__ import annotations

import torch
from torch import nn

from hybridplan.models.base import LayeredModel, build_layers, layer_seed, seeded


class Toy(LayeredModel):
    """Linear(4, 3) then Linear(3, 2): 4*3 + 3 + 3*2 + 2 = 23 parameters."""

    name = "toy"

    @property
    def num_layers(self) -> int:
        return 2

    def layer_name(self, index: int) -> str:
        return f"fc{index}"

    def build_layer(self, index: int) -> nn.Module:
        return nn.Linear(4, 3) if index == 0 else nn.Linear(3, 2)

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(num_samples, 4, generator=generator), torch.zeros(num_samples, 2)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output - target) ** 2).mean()


def test_layer_seeds_differ_by_layer_and_by_seed():
    seeds = {(s, layer): layer_seed(s, layer) for s in range(4) for layer in range(64)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(0 <= v < 2**63 - 1 for v in seeds.values())


def test_seeded_draws_from_the_seed_and_restores_the_callers_rng():
    torch.manual_seed(123)
    expected_after = torch.rand(3)  # the caller's next draw, had nothing happened in between
    torch.manual_seed(123)
    with seeded(7):
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected_after)
    torch.manual_seed(7)
    assert torch.equal(inside, torch.rand(3))


def test_a_layer_is_the_same_wherever_its_stage_starts():
    model = Toy()
    whole = build_layers(model, 0, 2, seed=5)
    alone = build_layers(model, 1, 2, seed=5)
    assert len(whole) == 2 and len(alone) == 1
    assert all(torch.equal(a, b) for a, b in zip(whole[1].state_dict().values(), alone[0].state_dict().values()))
    other = build_layers(model, 1, 2, seed=6)[0]
    assert not torch.equal(other.weight, alone[0].weight)


def test_the_defaults_a_model_inherits():
    model = Toy()
    assert model.sample_granularity == 1
    assert model.tensor_parallel_plan(0) is None
    assert model.tensor_parallel_problem(0, 2) == "this layer has no tensor-parallel split"
    assert model.config() == {"name": "toy"} and model.describe() == "toy: 2 layers"
    assert model.parameter_count() == 23
