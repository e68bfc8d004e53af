"""``RunConfig.loss = "vocab-parallel"``: a tensor-parallel last stage computes its loss on its vocabulary shards
(models/tensor_parallel.py ``vocab_parallel_cross_entropy``), as Megatron-LM and torchtitan do. It trains as one
device does (real processes, gloo), the simulated devices count it as it runs, and each tensor rank holds less
than with the logits gathered."""

from __future__ import annotations

import pytest

from hybridplan.errors import UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.runtime.config import RunConfig, validate_config
from hybridplan.runtime.launch import launch
from hybridplan.runtime.sim import simulate_stage
from tests.runtime.util import assert_same_training

pytestmark = pytest.mark.distributed

PLAN = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
    {"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0]},
    {"layers": [5, 10], "parallelism": "tensor", "degree": 2, "devices": [1, 2]}]})
"""gpt-tiny: a device, then a tensor x2 stage holding the head (vocabulary 128: 64 per rank)."""


def test_the_loss_on_vocabulary_shards_trains_as_one_device_and_is_simulated_as_it_runs() -> None:
    real = assert_same_training("gpt-tiny", PLAN, "1x3", loss="vocab-parallel")
    sim = launch(RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x3"), iterations=3, backend="sim",
                           loss="vocab-parallel"))
    assert sim.ok, sim.reason
    assert [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in sim.devices] == \
        [(d.static_memory_bytes, d.iteration_peaks, d.peak_breakdown) for d in real.devices]
    gathered = simulate_stage(RunConfig(model="gpt-tiny", plan=PLAN, cluster=Cluster.parse("1x3")), 1)  # a tensor rank
    assert sim.devices[1].static_memory_bytes == gathered.static[-1]
    assert sim.devices[1].iteration_peaks[-1] < gathered.iteration_peaks[-1]


def test_a_loss_that_is_not_a_token_cross_entropy_is_refused_before_any_process() -> None:
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
        {"layers": [0, 7], "parallelism": "tensor", "degree": 2, "devices": [0, 1]}]})
    with pytest.raises(UsageError, match="not a token cross entropy over a vocabulary"):
        validate_config(RunConfig(model="wresnet-tiny", plan=plan, cluster=Cluster.parse("1x2"), loss="vocab-parallel"))
