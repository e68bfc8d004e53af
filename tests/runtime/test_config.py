"""Run configurations (runtime/config.py): settings checked on construction, the plan checked against the
model, and the JSON form torchrun reads."""

from __future__ import annotations

import pytest

from hybridplan.errors import PlanError, UsageError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import (
    BACKENDS,
    DEVICE_TYPES,
    RunConfig,
    config_from_json,
    config_to_json,
    validate_config,
)
from tests.runtime.util import make_plan

EXAMPLE = make_plan("1f1b", 16, 4, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3, 4])])


def config(**kw) -> RunConfig:
    return RunConfig(**{"model": "gpt-tiny", "plan": EXAMPLE, "cluster": Cluster.parse("1x5"), **kw})


@pytest.mark.parametrize(
    "field, value, message, choices",
    [
        ("backend", "gpu", "backend 'gpu' is not supported", "['real', 'sim']"),
        ("device_type", "tpu", "device type 'tpu' is not supported", "['cpu', 'cuda']"),
        ("precision", "fp8", "precision 'fp8' is not supported", "['fp32', 'bf16', 'fp16']"),
        ("zero1", "rows", "ZeRO-1 partition 'rows' is not supported", "['tensors', 'flat']"),
    ],
)
def test_closed_settings_are_checked_on_construction(field, value, message, choices):
    with pytest.raises(UsageError, match=message) as caught:
        config(**{field: value})
    assert caught.value.fix == f"use one of {choices}"


def test_settings_that_do_not_go_together_are_refused():
    with pytest.raises(UsageError, match="loss_scale 64.0 was given for precision 'bf16'"):
        config(precision="bf16", loss_scale=64.0)
    with pytest.raises(UsageError, match="--iterations must be at least 1, got 0"):
        config(iterations=0)
    with pytest.raises(UsageError, match="layer timing needs real devices, but the backend is 'sim'"):
        config(backend="sim", layer_timing=True)
    with pytest.raises(UsageError, match="simulated devices share nothing"):
        config(backend="sim", share_gpu=True)
    assert BACKENDS == ("real", "sim") and DEVICE_TYPES == ("cpu", "cuda")
    assert config(precision="fp16", loss_scale=64.0, backend="sim").loss_scale == 64.0


def test_validate_config_checks_the_plan_against_model_and_cluster():
    validate_config(config())
    with pytest.raises(PlanError, match="does not exist on cluster 1x3"):
        validate_config(config(cluster=Cluster.parse("1x3")))
    short = make_plan("1f1b", 16, 4, [(0, 3, "none", [0]), (3, 7, "none", [1])])  # gpt-tiny has 10 layers
    with pytest.raises(PlanError):
        validate_config(config(plan=short))


def test_json_form_round_trips():
    cfg = config(precision="fp16", loss_scale=64.0, activation_checkpointing=True, backend="sim")
    assert config_from_json(config_to_json(cfg)) == cfg
    text = config_to_json(config()).replace('"backend": "real"', '"backend": "gpu"')
    with pytest.raises(UsageError, match="backend 'gpu' is not supported"):  # a file is checked like a call
        config_from_json(text)
    with pytest.raises(ValueError, match="only a named model"):
        config_to_json(config(model=get_model("gpt-tiny")))


def test_zero_on_data_and_data_x_tensor_stages_is_accepted_and_with_2bw_refused():
    plan = make_plan("1f1b", 16, 4, [(0, 5, "data", [0, 1]), (5, 10, "none", [2])])
    zero = Plan.from_dict({**plan.to_dict(), "stages": [{**plan.to_dict()["stages"][0], "zero": 1},
                                                        plan.to_dict()["stages"][1]]})
    validate_config(RunConfig(model="gpt-tiny", plan=zero, cluster=Cluster.parse("1x3")))  # runs: test_sharding.py
    both = {**plan.to_dict(), "stages": [
        {"layers": [0, 10], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "devices": [0, 1, 2, 3],
         "zero": 2}]}
    validate_config(RunConfig(model="gpt-tiny", plan=Plan.from_dict(both), cluster=Cluster.parse("1x4")))
    with pytest.raises(UsageError, match="stage 0 .* asks for ZeRO-2 sharding with PipeDream-2BW"):
        validate_config(RunConfig(model="gpt-tiny", plan=Plan.from_dict({**both, "schedule": "2bw"}),
                                  cluster=Cluster.parse("1x4")))


def test_a_cuda_capacity_must_hold_at_least_the_cuda_context():
    """On CUDA the capacity is the whole device; the context alone took 618.8 MiB on an H100."""
    from hybridplan.runtime.config import RunConfig

    plan = make_plan("1f1b", 8, 2, [(0, 10, "none", [0])])
    with pytest.raises(UsageError, match="cannot even hold a CUDA context"):
        RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x1", device_memory="600MiB"), device_type="cuda")
    RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x1", device_memory="600MiB"))  # a CPU: tensors only
    RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x1", device_memory="620MiB"), device_type="cuda")
