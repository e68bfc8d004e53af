"""[Note: resizes outside ops] (runtime/resize_watch.py): the tracker re-measures gathered parameters only after
FSDP2 resized a storage. Checked two ways: FSDP2's sources resize nowhere but in the watched functions, and a
simulated ZeRO-2/3 stage counts the same bytes, in CUDA terms event by event, whether the tracker re-measures
after a watched resize only or before every op as it did."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hybridplan.plan import Cluster, Plan
from hybridplan.runtime import resize_watch
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.sim import simulate_stage


def test_fsdp2_resizes_storages_only_in_the_watched_functions() -> None:
    import torch.distributed.fsdp._fully_shard as fully_shard

    found = []
    for source in sorted(Path(fully_shard.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and node.attr == "resize_":
                    found.append((source.name, function.name))
    assert found and {name for _, name in found} <= set(resize_watch.RESIZING_FUNCTIONS), found


@pytest.mark.parametrize("zero", [2, 3])
def test_the_watched_tracker_counts_what_re_measuring_before_every_op_counts(
        zero: int, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 3], "parallelism": "data", "degree": 2, "devices": [0, 1], "zero": zero},
        {"layers": [3, 10], "parallelism": "none", "degree": 1, "devices": [2]}]})
    cfg = RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x3"), backend="sim", device_type="cuda",
                    precision="bf16")
    watched = simulate_stage(cfg, 0)
    assert resize_watch.watching() and resize_watch.resizes() > 0
    import hybridplan.runtime.memory as memory

    monkeypatch.setattr(memory, "watching", lambda: False)  # the tracker then re-measures before every op
    every_op = simulate_stage(cfg, 0)
    fields = ("static", "iteration_peaks", "breakdowns", "reserved_peaks", "timeline")
    assert [getattr(watched, f) for f in fields] == [getattr(every_op, f) for f in fields]
