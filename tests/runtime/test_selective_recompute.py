"""A stage's ``"recompute": "selective"``: torchtitan's per-operation policy on the blocks (runtime/checkpointing.py).
What the policy keeps, in a Llama block as torchtitan's rule says; that a plan recomputing so trains as one device
does (real processes, gloo); that the simulated devices count it as the runtime does; and where its memory falls."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hybridplan.models import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.runtime import checkpointing
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.runtime.stage import CheckpointedSequential
from tests.runtime.util import assert_same_training

pytest.importorskip("transformers")


def test_a_llama_block_keeps_its_odd_matrix_products_and_its_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama block's forward runs seven matrix products (q, k, v and o projections; gate, up and down): the policy
    keeps the 1st, 3rd, 5th and 7th (q, v, gate, down) and the attention kernel's output, and recomputes the rest;
    a second block's products are counted afresh."""
    decisions: list[tuple[str, str]] = []
    real = checkpointing.create_selective_checkpoint_contexts

    def spying(policy: Any) -> Any:
        def spy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            decision = policy(ctx, func, *args, **kwargs)
            decisions.append((str(func), decision.name))
            return decision
        return real(spy)

    monkeypatch.setattr(checkpointing, "create_selective_checkpoint_contexts", spying)
    model = get_model("hf:llama-tiny")
    x = torch.randn(2, model.seq_len, model.raw_config["hidden_size"], requires_grad=True)
    CheckpointedSequential(model.build_layer(1), model.build_layer(2), selective=[True, True])(x).sum().backward()
    products = [d for op, d in decisions if op == "aten.mm.default"]
    assert products == (["MUST_SAVE", "PREFER_RECOMPUTE"] * 3 + ["MUST_SAVE"]) * 2, products
    assert [d for op, d in decisions if "scaled_dot_product" in op] == ["MUST_SAVE"] * 2
    assert {d for op, d in decisions if op != "aten.mm.default" and "scaled_dot_product" not in op} == {"PREFER_RECOMPUTE"}


def _plan(stages: list[dict[str, Any]]) -> Plan:
    return Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": stages})


@pytest.mark.parametrize("second, cluster", [
    ({"parallelism": "none", "degree": 1, "devices": [1]}, "1x2"),
    ({"parallelism": "tensor", "degree": 2, "devices": [1, 2]}, "1x3"),
], ids=["pipeline", "tensor"])
def test_a_selective_plan_trains_the_same_and_is_simulated_as_it_runs(second: dict[str, Any], cluster: str) -> None:
    """Two stages recomputing selectively: the first ends with a block (its output released without looking,
    runtime/release.py), the second with the head (not checkpointed); the simulated devices count every byte as the
    real run. (With FSDP, torchtitan's way, in bf16: tests/runtime/test_engines.py.)

    Tensor-parallel: gpt-tiny's row-parallel projections have no bias (it is added after ``g``), so their products
    are the ones the policy counts and keeps; ``g`` sums a copy of them there (``TensorParallelGroup.reduce_in_place``):
    summed in place, the kept product changed under the recompute and the loss drifted 4e-5 from one device's."""
    plan = _plan([{"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0], "recompute": "selective"},
                  {"layers": [5, 10], "recompute": "selective", **second}])
    real = assert_same_training("gpt-tiny", plan, cluster)
    sim = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse(cluster), iterations=3, backend="sim"))
    assert sim.ok, sim.reason
    for r, f in zip(real.devices, sim.devices, strict=True):
        assert (f.static_memory_bytes, f.iteration_peaks, f.peak_breakdown) == \
            (r.static_memory_bytes, r.iteration_peaks, r.peak_breakdown)


def test_selective_recompute_holds_less_than_none_and_more_than_full() -> None:
    peaks = {}
    for recompute in ("none", "selective", "full"):
        plan = _plan([{"layers": [0, 4], "parallelism": "none", "degree": 1, "devices": [0], "recompute": recompute}])
        run = launch(RunConfig(model="hf:llama-tiny", plan=plan, cluster=Cluster.parse("1x1"), iterations=1,
                               backend="sim"))
        assert run.ok, run.reason
        peaks[recompute] = run.devices[0].peak_memory_bytes
    assert peaks["none"] > peaks["selective"] > peaks["full"], peaks
