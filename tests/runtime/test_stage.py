"""Building one stage (runtime/stage.py): its layers with the model's deterministic weights, activation
checkpointing that recomputes and changes no number, and a tensor-parallel stage gathered back into exactly the
unsplit stage's weights and gradients (gloo, in the shared test pool)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from gloo import WORLD, GlooPool, tensor_parallel_group
from torch import nn

from hybridplan.models.base import build_layers
from hybridplan.models.zoo import get_model
from hybridplan.plan import StagePlan
from hybridplan.runtime.stage import CheckpointedSequential, build_stage_module, unsplit_state

MLP = "tests.cli.user_models:mlp"  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)
CPU = torch.device("cpu")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_stage_holds_the_models_layers_with_their_weights():
    model = get_model(MLP)
    stage = build_stage_module(model, StagePlan.of(1, 5, [0]), seed=3, device=CPU, tp=None)
    assert type(stage) is nn.Sequential and len(stage) == 4
    reference = nn.Sequential(*build_layers(model, 1, 5, seed=3))
    assert _same(stage.state_dict(), reference.state_dict())
    checkpointed = build_stage_module(model, StagePlan.of(1, 5, [0]), seed=3, device=CPU, tp=None, checkpointing=True)
    assert isinstance(checkpointed, CheckpointedSequential) and _same(checkpointed.state_dict(), reference.state_dict())


class _Counted(nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


def test_checkpointing_recomputes_each_layer_and_gives_the_same_numbers():
    torch.manual_seed(0)
    layers = [_Counted(4, 4), nn.Tanh(), _Counted(4, 2)]
    plain, checkpointed = nn.Sequential(*layers), CheckpointedSequential(*layers)
    x = torch.randn(3, 4)
    _Counted.calls = 0
    plain(x).sum().backward()
    assert _Counted.calls == 2  # one forward per Linear
    grads = [p.grad.clone() for p in plain.parameters()]
    plain.zero_grad()
    _Counted.calls = 0
    out = checkpointed(x)
    out.sum().backward()
    assert _Counted.calls == 4  # and again in the backward pass
    assert torch.equal(out, plain(x)) and all(torch.equal(g, p.grad) for g, p in zip(grads, checkpointed.parameters()))


def test_unsplit_state_names_parameters_by_their_layer_in_the_model():
    model = get_model(MLP)
    stage = build_stage_module(model, StagePlan.of(2, 5, [0]), seed=0, device=CPU, tp=None)
    weights, grads = unsplit_state(stage, 2)
    assert sorted(weights) == ["2.bias", "2.weight", "4.bias", "4.weight"] and grads == {}
    assert torch.equal(weights["4.weight"], stage[2].weight)
    stage(torch.randn(3, 32)).sum().backward()
    _, grads = unsplit_state(stage, 2)
    assert sorted(grads) == sorted(weights) and torch.equal(grads["2.bias"], stage[0].bias.grad)


def _tensor_parallel_stage(rank: int, world: int) -> dict[str, Any]:
    """Layers [0, 3) of the MLP split over a tensor group of 2, trained one step's backward, gathered back."""
    tp = tensor_parallel_group(rank, world, 2)
    model = get_model(MLP)
    stage = build_stage_module(model, StagePlan.of(0, 3, [0, 1], tensor_degree=2), seed=5, device=CPU, tp=tp)
    reference = nn.Sequential(*build_layers(model, 0, 3, seed=5))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    stage(x).sum().backward()
    reference(x).sum().backward()
    weights, grads = unsplit_state(stage, 0)
    ref_weights, ref_grads = unsplit_state(reference, 0)
    return {"keys": (sorted(weights), sorted(grads)) == (sorted(ref_weights), sorted(ref_grads)),
            "weights": all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights),
            "grads": max(float((grads[k] - ref_grads[k]).abs().max()) for k in ref_grads)}


@pytest.mark.distributed
def test_a_tensor_parallel_stage_gathers_back_into_the_unsplit_stage(gloo_pool: Callable[[int], GlooPool]) -> None:
    for report in gloo_pool(WORLD).run(_tensor_parallel_stage):
        assert report["keys"] and report["weights"]  # each layer built whole from its seed, then sharded
        assert report["grads"] < 1e-5  # float32 sums over shards in another order


def test_each_layer_is_handed_on_before_the_next_is_built():
    """[Note: a layer is sharded before the next is built]: ``each_layer`` sees every layer, in order, while the
    layers after it are not built yet; the weights are those of the stage built at once."""
    model = get_model(MLP)
    seen: list[tuple[int, int]] = []
    built = []
    real = build_layers

    def counting(m: Any, start: int, stop: int, seed: int) -> list[nn.Module]:
        built.append(start)
        return real(m, start, stop, seed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hybridplan.runtime.stage.build_layers", counting)
        stage = build_stage_module(model, StagePlan.of(1, 5, [0]), seed=3, device=CPU, tp=None,
                                   each_layer=lambda layer: seen.append((len(built), len(list(layer.parameters())))))
    assert [n for n, _ in seen] == [1, 2, 3, 4] and [p for _, p in seen] == [0, 2, 0, 2]  # ReLU, Linear, ...
    whole = build_layers(model, 1, 5, 3)
    assert all(torch.equal(a, b) for a, b in zip(stage.parameters(), nn.Sequential(*whole).parameters(), strict=True))


def test_a_device_of_the_iterations_peak_builds_a_sharded_stage():
    """gpt-tiny's ten layers as one data 2 x tensor 4 ZeRO-1 stage in bf16 (simulated, global batch 4): its
    iteration peaks at the bytes asked of the device below, and a device of exactly that many bytes builds and
    trains it. Built all at once, the whole fp32 layers needed 1,677,824 bytes of device first (456,768 more)."""
    from hybridplan.plan import Cluster, Plan
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.sim import simulate_stage

    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2, "stages": [
        {"layers": [0, 10], "parallelism": "data+tensor", "degree": 8, "tensor_degree": 4, "zero": 1,
         "devices": list(range(8))}]})

    def run(memory: str | None) -> Any:
        return simulate_stage(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x8", device_memory=memory),
                                        backend="sim", precision="bf16"), 0)

    peak = max(run(None).iteration_peaks)
    assert max(run(str(peak)).iteration_peaks) == peak
