"""Helpers for tests that launch real runs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.launch import launch
from hybridplan.runtime.result import RunResult


def make_plan(schedule: str, batch: int, micro: int, stages: list[tuple[int, int, str, list[int]]]) -> Plan:
    return Plan.from_dict(
        {
            "schedule": schedule,
            "global_batch_size": batch,
            "num_microbatches": micro,
            "stages": [
                {"layers": [a, b], "parallelism": kind, "degree": len(devs), "devices": devs} for a, b, kind, devs in stages
            ],
        }
    )


def run_with_state(model: Any, plan: Plan, cluster: str, iterations: int = 3, **kw: Any) -> tuple[RunResult, dict, dict]:
    """Run and collect the full weights and last gradients of every layer."""
    with tempfile.TemporaryDirectory() as d:
        result = launch(
            RunConfig(model=model, plan=plan, cluster=Cluster.parse(cluster), iterations=iterations, save_weights_dir=d, **kw)
        )
        assert result.ok, result.reason
        weights: dict[str, torch.Tensor] = {}
        grads: dict[str, torch.Tensor] = {}
        for f in sorted(Path(d).glob("stage*.pt")):
            state = torch.load(f)
            weights.update(state["weights"])
            grads.update(state["grads"])
    return result, weights, grads


def single_device(plan: Plan) -> Plan:
    """The reference: every layer on one device, same batch and micro-batches."""
    return make_plan(plan.schedule, plan.global_batch_size, plan.num_microbatches, [(0, plan.num_layers, "none", [0])])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
