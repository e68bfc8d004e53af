"""DeepSpeed configs, checked by DeepSpeed itself in a subprocess: ``DeepSpeedConfig`` (batch arithmetic, ZeRO)
with the data-parallel world size its pipeline engine gives it, and ``PipelineModule`` built for every pipeline
rank under torch's fake process group, partitioned by the exported ``parts`` (the subclass of docs/export.md):
each rank must hold exactly its stage's layers.

DeepSpeed compiles a shared-memory all-reduce kernel for CPU process groups when its communication starts; it is
irrelevant to partitioning and is switched off in the subprocess (``build_shm_op`` returns None).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybridplan.workflows.export import export_plan
from tests.workflows.export.plans import GPT_TINY, uniform

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install '.[engines]')")

CHECK = r"""
import json, sys
import torch
import torch.distributed as tdist
from torch.testing._internal.distributed.fake_pg import FakeStore
import importlib
# the submodule itself: the name deepspeed.comm.torch is torch (deepspeed/comm re-exports it)
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
import deepspeed.comm as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

config = json.load(open(sys.argv[1]))
module = config["hybridplan"]["pipeline_module"]
pp, dp = module["topology"]["num_pp"], module["topology"]["num_dp"]


class Grid:  # what PipelineEngine passes as mpu: the data-parallel world size
    def get_data_parallel_world_size(self):
        return dp


out = {"ranks": []}


class PlannedPipelineModule(PipelineModule):  # docs/export.md
    def __init__(self, *args, parts, **kwargs):
        self.planned_parts = list(parts)
        super().__init__(*args, **kwargs)

    def _partition_layers(self, method="uniform"):
        self.parts = list(self.planned_parts)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


layers = [LayerSpec(torch.nn.Linear, 4, 4) for _ in module["layers"]]
for rank in range(pp * dp):
    tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=pp * dp)
    dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
    if rank == 0:  # DeepSpeedConfig reads the world from the process group (mpu: the data-parallel part)
        ds = DeepSpeedConfig(config, mpu=Grid())
        out.update({"train_batch_size": ds.train_batch_size, "micro": ds.train_micro_batch_size_per_gpu,
                    "accumulation": ds.gradient_accumulation_steps, "zero": ds.zero_optimization_stage,
                    "interval": ds.pipeline["activation_checkpoint_interval"]})
    m = PlannedPipelineModule(layers=layers, topology=PipeDataParallelTopology(num_pp=pp, num_dp=dp),
                              parts=module["parts"], loss_fn=torch.nn.MSELoss(),
                              activation_checkpoint_interval=module["activation_checkpoint_interval"])
    out["ranks"].append([rank, m.stage_id, m._local_start, m._local_stop, len(m.forward_funcs)])
    tdist.destroy_process_group()
print("RESULT " + json.dumps(out))
"""


def _check(tmp_path, plan) -> dict:
    path = tmp_path / "ds.json"
    path.write_text(export_plan(plan, "deepspeed", GPT_TINY).text)
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    env = {**os.environ, "LOCAL_RANK": "0", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    assert not (tmp_path / "ext").exists(), "DeepSpeed compiled an extension (minutes): its switch-off failed"
    return json.loads(lines[-1][len("RESULT "):])


def test_pipeline_of_data_replicas(tmp_path):
    plan = uniform([0, 3, 7, 10], d=2, zero=1, recompute="full")
    out = _check(tmp_path, plan)
    # 32 samples, 8 micro-batches of 4 split over 2 replicas: 2 per GPU, 8 accumulation steps, 2 x 8 x 2 = 32
    assert (out["train_batch_size"], out["micro"], out["accumulation"], out["zero"], out["interval"]) == (32, 2, 8, 1, 1)
    # ranks pipe-major (PipeDataParallelTopology): stage k on ranks 2k, 2k+1, holding the plan's layers
    assert out["ranks"] == [[0, 0, 0, 3, 3], [1, 0, 0, 3, 3], [2, 1, 3, 7, 4], [3, 1, 3, 7, 4],
                            [4, 2, 7, 10, 3], [5, 2, 7, 10, 3]]


def test_the_check_can_fail(tmp_path):
    """A config whose batch does not add up is refused by DeepSpeed."""
    plan = uniform([0, 5, 10], d=2)
    path = tmp_path / "ds.json"
    config = json.loads(export_plan(plan, "deepspeed", GPT_TINY).text)
    config["train_micro_batch_size_per_gpu"] = 3
    path.write_text(json.dumps(config))
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True,
                          env={**os.environ, "LOCAL_RANK": "0", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")},
                          timeout=300)
    assert done.returncode != 0 and "train_batch_size is not equal" in done.stderr
