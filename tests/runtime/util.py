"""Helpers for tests that launch real runs, and the check that a plan trains as one device does."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.runtime.config import RunConfig, config_to_json
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


_REFERENCES: dict = {}


def reference(model: str, plan: Plan) -> tuple[RunResult, dict, dict]:
    """The run of ``plan``'s batch on one device (cached), with its weights and last gradients."""
    # 2BW trains other math (stale weights); GPipe, 1F1B and PipeDream-Flush on one device share a reference.
    key = (model, plan.global_batch_size, plan.num_microbatches, plan.schedule == "2bw")
    if key not in _REFERENCES:
        _REFERENCES[key] = run_with_state(model, single_device(plan), "1x1")
    return _REFERENCES[key]


def assert_same_training(model: str, plan: Plan, cluster: str, **kw: Any) -> RunResult:
    """``plan`` on ``cluster`` (with the further RunConfig fields ``kw``) trains as one device does: the same
    losses and last gradients (weights and gradients of the same layers). Returns the run's result."""
    ref, ref_w, ref_g = reference(model, plan)
    got, w, g = run_with_state(model, plan, cluster, **kw)
    assert len(got.losses) == len(ref.losses) == 3
    for a, b in zip(got.losses, ref.losses):
        assert abs(a - b) <= 1e-5 * abs(b), (got.losses, ref.losses)
    assert w.keys() == ref_w.keys() and g.keys() == ref_g.keys()
    # Gradients of the last iteration (after two updates, so they also reflect the weights). Some are
    # mathematically zero (the attention key bias: softmax ignores a per-query constant) and hold only
    # rounding noise, hence the floor relative to the largest gradient.
    scale = max(t.norm().item() for t in ref_g.values())
    for k in ref_g:
        err = (g[k] - ref_g[k]).norm().item()
        assert err <= 1e-4 * ref_g[k].norm().item() + 1e-6 * scale, (k, err, ref_g[k].norm().item())
    total = torch.cat([ref_g[k].flatten() for k in sorted(ref_g)])
    diff = torch.cat([(g[k] - ref_g[k]).flatten() for k in sorted(ref_g)])
    assert diff.norm() <= 1e-5 * total.norm()
    return got


def sim_config(tmp_path: Path) -> Path:
    """A run configuration file of gpt-tiny on 1x2 simulated devices (two stages of five layers)."""
    plan = make_plan("1f1b", 8, 2, [(0, 5, "none", [0]), (5, 10, "none", [1])])
    path = tmp_path / "run.json"
    path.write_text(config_to_json(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x2"), backend="sim")))
    return path


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from /proc, or None if it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the name before ')' may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


Process = tuple[int, int]
"""A process as (pid, start time in clock ticks since boot): the pair is never reused."""


def descendants(root: int) -> list[Process]:
    """Every living descendant of ``root``, at any depth."""
    parents: dict[int, list[Process]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := proc_stat(int(entry))) is not None and st[0] != "Z":
            parents.setdefault(st[1], []).append((int(entry), st[2]))
    found: list[Process] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def running(proc: Process) -> bool:
    st = proc_stat(proc[0])
    return st is not None and st[2] == proc[1] and st[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:100]
    except OSError:
        return "?"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous of a multi-node test)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
