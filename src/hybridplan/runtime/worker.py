"""The process of one device: join the process group, build the stage, train, report.

Started by :mod:`hybridplan.runtime.launch` (one local process per device), or by torchrun on several
machines::

    torchrun --nnodes 2 --nproc-per-node 4 ... -m hybridplan.runtime.worker --config run.json --out result.json

where ``run.json`` is written by ``hybridplan run --write-config``. Under torchrun, rank 0 gathers every
rank's report and writes the result.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import TensorParallelGroup
from hybridplan.models.zoo import get_model
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.executor import BoundarySpec, StageExecutor
from hybridplan.runtime.gpu_memory import cuda_block_bytes, estimate_overhead_bytes
from hybridplan.runtime.layer_timer import LayerTimer
from hybridplan.runtime.lifeline import tie_to_launcher
from hybridplan.runtime.memory import CudaMemoryMeter, DeviceOutOfMemory, NullMeter, StorageTracker
from hybridplan.runtime.precision import build_optimizer, compute_dtype, loss_scale_of
from hybridplan.runtime.stage import boundary_specs, build_stage_module, unsplit_state

__all__ = ["run_rank", "spawn_entry", "resolve_model", "make_meter"]

EXIT_OK, EXIT_FAILED, EXIT_OOM = 0, 1, 3


def resolve_model(model: str | LayeredModel) -> LayeredModel:
    """A model object from a zoo name, ``module:function``, or an object."""
    return get_model(model) if isinstance(model, str) else model


def _backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def make_meter(cfg: RunConfig, device: torch.device, capacity: int | None, *, simulated: bool) -> Any:
    """The memory meter of a rank: the CUDA allocator's counters on a real GPU, else the exact storage
    tracker, in GPU terms (allocation rounding) when a simulated rank stands for a CUDA device."""
    if not cfg.track_memory:
        return NullMeter()
    if device.type == "cuda":
        return CudaMemoryMeter(device, capacity)
    gpu_terms = simulated and cfg.device_type == "cuda"
    return StorageTracker(capacity, rounding=cuda_block_bytes if gpu_terms else None)


def run_rank(
    rank: int,
    cfg: RunConfig,
    *,
    device: torch.device,
    specs: list[BoundarySpec] | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    """Train ``cfg`` as ``rank`` in an initialised default process group; return this rank's report.

    ``specs`` are the model's boundary shapes (:func:`boundary_specs`); the local launcher computes them
    once for all ranks, since the first meta-device forward of a process costs about a second.

    ``simulated``: the process group is the fake one and a ``FakeTensorMode`` is active (runtime/sim.py).
    The same code runs; only what needs real data or a separate process differs: losses are not
    reported, weights are not saved, the cyclic garbage collector's frozen set is released after the run
    (the simulator runs many ranks in one process), and a rank standing for a CUDA device is measured in
    GPU terms with an estimated overhead (runtime/gpu_memory.py).
    """
    model = resolve_model(cfg.model)
    plan = cfg.plan
    # Every rank creates every stage's group, in the same order (new_group is collective).
    groups = [dist.new_group(list(s.devices)) if s.degree > 1 else None for s in plan.stages]
    stage_index = plan.stage_of_device(rank)
    stage = plan.stages[stage_index]
    index_in_stage = stage.devices.index(rank)
    group = groups[stage_index]
    tp = dp_group = None
    if group is not None and stage.parallelism == "tensor":
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed.device_mesh import DeviceMesh

        with unset_fake_temporarily():  # the mesh reads its rank table; a no-op outside a simulation
            mesh = DeviceMesh.from_group(group, device.type)
        tp = TensorParallelGroup(group, mesh, index_in_stage, stage.degree)
    elif group is not None:
        dp_group = group

    meter = make_meter(cfg, device, cfg.cluster.memory_of(rank), simulated=simulated)
    specs = specs if specs is not None else boundary_specs(model, stop=stage.stop)
    with meter:
        with meter.in_phase("parameters"):
            module = build_stage_module(
                model, stage, seed=cfg.seed, device=device, tp=tp, checkpointing=cfg.activation_checkpointing
            )
            optimizer = build_optimizer(
                module,
                precision=cfg.precision,
                learning_rate=cfg.learning_rate,
                weight_decay=cfg.weight_decay,
                loss_scale=cfg.loss_scale,
                device_type=cfg.device_type,
            )
        executor = StageExecutor(
            model=model,
            plan=plan,
            rank=rank,
            module=module,
            optimizer=optimizer,
            meter=meter,
            device=device,
            dp_group=dp_group,
            input_spec=specs[stage.start] if stage_index > 0 else None,
            output_spec=specs[stage.stop] if stage_index < plan.num_stages - 1 else None,
            seed=cfg.seed,
            record_timeline=cfg.record_timeline,
            dtype=compute_dtype(cfg.precision),
            loss_scale=loss_scale_of(cfg.precision, cfg.loss_scale),
            checkpointed=cfg.activation_checkpointing,
        )
        timer = LayerTimer(module, device) if cfg.layer_timing else None
        # Objects alive now live for the whole run: freezing them keeps the per-iteration full
        # collection (runtime/executor.py) from rescanning every module and tensor (0.15 s each).
        gc.collect()
        freeze = not simulated or gc.get_freeze_count() == 0  # never release someone else's frozen set
        if freeze:
            gc.freeze()
        records, layer_seconds = [], []
        try:
            for it in range(cfg.iterations):
                records.append(executor.run_iteration(it))
                if timer is not None:
                    layer_seconds.append(timer.take())
        finally:
            if simulated and freeze:
                gc.unfreeze()
    if cfg.save_weights_dir is not None and not simulated:
        weights, grads = unsplit_state(module, stage.start)
        if index_in_stage == 0:
            torch.save({"weights": weights, "grads": grads}, Path(cfg.save_weights_dir) / f"stage{stage_index}.pt")
    dist.barrier()
    tracked = cfg.track_memory
    overhead = meter.overhead_bytes() if tracked else None
    if simulated and tracked and cfg.device_type == "cuda":
        overhead = estimate_overhead_bytes(plan, rank)
    return {
        "status": "ok",
        "rank": rank,
        "stage": stage_index,
        "rank_in_stage": index_in_stage,
        "node": cfg.cluster.node_of(rank),
        "in_flight": executor.in_flight,
        "iteration_peaks": [r.peak for r in records] if tracked else [],
        "static": [r.static for r in records] if tracked else [],
        "data": [r.data for r in records] if tracked else [],
        "breakdowns": [r.peak_breakdown for r in records] if tracked else [],
        "seconds": [r.seconds for r in records],
        "losses": [] if simulated else [r.loss for r in records],
        "timeline": records[-1].timeline if tracked else [],
        "overhead_bytes": overhead,
        "layer_seconds": layer_seconds,
    }


def _failure(rank: int, exc: BaseException) -> tuple[dict[str, Any], int]:
    oom = isinstance(exc, DeviceOutOfMemory) or type(exc).__name__ == "OutOfMemoryError"
    where = f"device {rank}"
    report = {
        "status": "oom" if oom else "failed",
        "rank": rank,
        "reason": f"{where}: {type(exc).__name__}: {exc}".strip(),
        "time": time.time(),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
    return report, EXIT_OOM if oom else EXIT_FAILED


def spawn_entry(
    rank: int,
    world: int,
    cfg: RunConfig,
    store_port: int,
    report_dir: str,
    launcher_pid: int,
    specs: list[BoundarySpec] | None = None,
) -> None:
    """Entry point of a locally spawned rank: never returns (exits with 0, 1 failed, or 3 out of memory).

    The rank ends at once (code 4) if process ``launcher_pid`` dies (runtime/lifeline.py): its parent is
    the forkserver, which would otherwise keep it running.
    """
    tie_to_launcher(launcher_pid)
    torch.set_num_threads(1)
    path = Path(report_dir) / f"rank{rank}.json"
    try:
        store = dist.TCPStore("127.0.0.1", store_port, world + 1, is_master=False, timeout=timedelta(seconds=cfg.timeout_s))
        if cfg.device_type == "cuda":
            torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
        device = torch.device(cfg.device_type, rank % max(1, torch.cuda.device_count())) if cfg.device_type == "cuda" else torch.device("cpu")
        dist.init_process_group(_backend(cfg.device_type), store=store, rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
        report = run_rank(rank, cfg, device=device, specs=specs)
        code = EXIT_OK
    except BaseException as exc:  # every failure must reach the launcher as a report
        report, code = _failure(rank, exc)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: peers may be gone and gloo's destructors can block


def _torchrun_main(argv: list[str] | None = None) -> int:
    from hybridplan.runtime.launch import aggregate
    from hybridplan.runtime.config import config_from_json

    parser = argparse.ArgumentParser(prog="python -m hybridplan.runtime.worker")
    parser.add_argument("--config", required=True, help="run configuration written by 'hybridplan run --write-config'")
    parser.add_argument("--out", required=True, help="result JSON (written by rank 0)")
    args = parser.parse_args(argv)
    cfg = config_from_json(Path(args.config).read_text())
    if cfg.backend != "real":
        parser.error(f"{args.config} asks for backend {cfg.backend!r}; torchrun runs real devices only"
                     " (simulate with hybridplan.runtime.launch.launch, in one process)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(1)
    device = torch.device("cuda", local) if cfg.device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(_backend(cfg.device_type), timeout=timedelta(seconds=cfg.timeout_s))
    try:
        report = run_rank(rank, cfg, device=device)
    except BaseException as exc:
        report, code = _failure(rank, exc)
        if rank == 0:
            Path(args.out).write_text(json.dumps({"status": report["status"], "reason": report["reason"]}))
        raise
    reports: list[Any] = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        aggregate(cfg, reports, wall_seconds=None).save(args.out)
    dist.barrier()  # every rank has finished the gather before any rank's sockets close
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip destroy_process_group and interpreter teardown: on CPU, gloo's background threads
    # occasionally abort the process ("terminate called without an active exception") while
    # being torn down, which torchrun reports as a failed rank after a successful run.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_torchrun_main())
