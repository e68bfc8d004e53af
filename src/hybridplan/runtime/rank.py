"""What one rank does, however it was started: build its stage, train it, report what it measured.

Three starters run :func:`run_rank` in a default process group they set up: a local process spawned by
the launcher (runtime/worker.py), a process started by torchrun (runtime/torchrun.py), and a simulated
device in the launcher's own process (runtime/sim.py, fake process group and fake tensors). What a rank
returns is a :class:`~hybridplan.runtime.result.RankReport`; what it ends with when it fails is a
:class:`~hybridplan.runtime.result.RankFailure` (:func:`rank_failure`).
"""

from __future__ import annotations

import gc
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from hybridplan import collectives
from hybridplan.models.boundaries import BoundarySpec, boundary_specs
from hybridplan.models.tensor_parallel import TensorParallelGroup
from hybridplan.models.zoo import resolve_model
from hybridplan.plan import Plan, StagePlan
from hybridplan.runtime.config import DeviceType, RunConfig
from hybridplan.runtime.executor import IterationRecord, StageExecutor, barrier
from hybridplan.runtime.gpu_memory import LIBRARY_BYTES, CudaDeviceModel, communicators_of, estimate_overhead_bytes
from hybridplan.runtime.heap import heap_frozen
from hybridplan.runtime.layer_timer import LayerTimer
from hybridplan.runtime.memory import DeviceOutOfMemory, StorageTracker
from hybridplan.runtime.meters import CudaMemoryMeter, NullMeter
from hybridplan.runtime.grad_buffers import Fp32GradBuffers
from hybridplan.runtime.precision import NoParameters, build_optimizer, compute_dtype, loss_scale_of
from hybridplan.runtime.sharding import shard_layer, shard_stage, zero1_optimizer
from hybridplan.runtime.result import RankFailure, RankReport
from hybridplan.runtime.stage import build_stage_module, unsplit_state

__all__ = ["run_rank", "make_meter", "stage_meshes", "StageMeshes", "rank_failure", "process_group_backend", "process_group_device"]

Meter = CudaMemoryMeter | StorageTracker | NullMeter
"""A rank's memory meter (runtime/memory.py)."""


def process_group_backend(device_type: DeviceType, *, share_gpu: bool = False) -> str:
    """The torch.distributed backend of real ranks on ``device_type``: NCCL on GPUs, gloo on CPUs, and gloo
    when ranks share a GPU (``RunConfig.share_gpu``: NCCL refuses two ranks on one GPU, runtime/shared_gpu.py)."""
    return "nccl" if device_type == "cuda" and not share_gpu else "gloo"


def process_group_device(device: torch.device, *, share_gpu: bool = False) -> torch.device | None:
    """The ``device_id`` to give ``init_process_group``: the rank's GPU on CUDA (NCCL then binds its
    communicators to it instead of warning that it is "Guessing device ID"), None on a CPU or when ranks share
    a GPU (both gloo, which takes no device)."""
    return device if device.type == "cuda" and not share_gpu else None


def make_meter(cfg: RunConfig, device: torch.device, capacity: int | None, *, simulated: bool, rank: int = 0) -> Meter:
    """The memory meter of ``rank``: the CUDA allocator's counters on a real GPU, else the exact storage
    tracker, in GPU terms (a simulated CUDA device: its caching allocator, workspaces and memory outside
    the allocator, runtime/gpu_memory.py) when a simulated rank stands for a CUDA device. On CUDA the
    capacity is the device's whole memory."""
    if not cfg.track_memory:
        return NullMeter()
    if device.type == "cuda":
        return CudaMemoryMeter(device, capacity, outside_bytes=estimate_overhead_bytes(cfg.plan, rank, set(LIBRARY_BYTES)))
    if simulated and cfg.device_type == "cuda":
        return StorageTracker(device=CudaDeviceModel(capacity, communicators=len(communicators_of(cfg.plan, rank)),
                                                     gpu=cfg.cluster.devices[rank].gpu))
    return StorageTracker(capacity)


def run_rank(
    rank: int,
    cfg: RunConfig,
    *,
    device: torch.device,
    specs: list[BoundarySpec] | None = None,
    simulated: bool = False,
    skip_repeats: bool = True,
) -> RankReport:
    """Train ``cfg`` as ``rank`` in an initialised default process group; return this rank's report.

    ``specs`` are the model's boundary shapes (:func:`~hybridplan.models.boundaries.boundary_specs`); the
    local launcher computes them once for all ranks, since the first meta-device forward of a process
    costs about a second.

    ``simulated``: the process group is the fake one and a ``FakeTensorMode`` is active (runtime/sim.py).
    The same code runs; only what needs real data or a separate process differs: losses are not
    reported, weights are not saved, the cyclic garbage collector's frozen set is released after the run
    (the simulator runs many ranks in one process), and a rank standing for a CUDA device is measured in
    GPU terms with an estimated overhead (runtime/gpu_memory.py), and, with ``skip_repeats``, blocks of
    actions that repeat the device's state are not traced (runtime/repeats.py [Note: skipping repeated blocks]).
    """
    model = resolve_model(cfg.model)
    plan = cfg.plan
    stage_index = plan.stage_of_device(rank)
    stage = plan.stages[stage_index]
    index_in_stage = stage.devices.index(rank)
    tp_group, dp_group = _stage_groups(plan, stage_index, index_in_stage)
    tp, meshes = None, StageMeshes(None, None, None)
    if tp_group is not None or stage.zero >= 2:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # the mesh reads its rank table; a no-op outside a simulation
            meshes = stage_meshes(stage, tp_group, dp_group, device.type)
        if tp_group is not None:
            tp = TensorParallelGroup(tp_group, meshes.tensor, index_in_stage % stage.tensor_degree, stage.tensor_degree,
                                     reduce_in_place=stage.recompute != "selective")
    # the loss on vocabulary shards: a tensor-parallel stage holding the model's last layer (RunConfig.loss)
    split_loss = cfg.loss == "vocab-parallel" and tp is not None and stage.stop == model.num_layers
    checkpointing = "full" if cfg.activation_checkpointing else stage.recompute if stage.recompute != "none" else False
    collectives.stage_through_host(cfg.share_gpu)  # gloo on a shared GPU: runtime/shared_gpu.py

    meter = make_meter(cfg, device, cfg.cluster.memory_of(rank), simulated=simulated, rank=rank)
    specs = specs if specs is not None else boundary_specs(model, stop=stage.stop)
    with meter:
        with meter.in_phase("parameters"):
            # a ZeRO-2/3 stage's layers become FSDP units as they are built ([Note: a layer is sharded before the
            # next is built] in runtime/stage.py)
            each_layer = (partial(shard_layer, zero=stage.zero, dp_mesh=meshes.data, precision=cfg.precision,
                                  reduce=cfg.fsdp_reduce)
                          if stage.zero >= 2 else None)
            module = build_stage_module(
                model, stage, seed=cfg.seed, device=device, tp=tp, checkpointing=checkpointing, each_layer=each_layer,
                split_loss=split_loss
            )
            if stage.zero >= 2:
                shard_stage(module, stage.zero, meshes.data, settle_for=meter if device.type == "cpu" else None,
                            precision=cfg.precision, loss_scale=loss_scale_of(cfg.precision, cfg.loss_scale),
                            reduce=cfg.fsdp_reduce)
                if meshes.rank_table is not None:
                    meter.forget(meshes.rank_table)
            if stage.zero == 1:
                optimizer = zero1_optimizer(module, dp_group, learning_rate=cfg.learning_rate,
                                            weight_decay=cfg.weight_decay, foreach=cfg.device_type == "cuda",
                                            precision=cfg.precision, loss_scale=cfg.loss_scale, adamw=cfg.adamw,
                                            partition=cfg.zero1)
            else:
                optimizer = build_optimizer(
                    module,
                    precision="fp32" if stage.zero >= 2 else cfg.precision,  # FSDP's shards are the fp32 masters
                    learning_rate=cfg.learning_rate,
                    weight_decay=cfg.weight_decay,
                    loss_scale=cfg.loss_scale,
                    device_type=cfg.device_type,
                    adamw=cfg.adamw,
                )
            if cfg.grad_accumulation == "fp32-buffer" and not isinstance(optimizer, NoParameters):
                optimizer = Fp32GradBuffers(optimizer, [p for p in module.parameters() if p.requires_grad], meter)
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
            # selective: only blocks are checkpointed (runtime/stage.py), so the last layer's output is released
            # without looking only when that layer is a block
            checkpointed=bool(checkpointing) and (checkpointing != "selective" or 0 < stage.stop - 1 < model.num_layers - 1),
            staged=cfg.share_gpu,
            vocab_parallel=tp if split_loss else None,
            skip_repeats=simulated and skip_repeats,
        )
        timer = LayerTimer(module, device, optimizer) if cfg.layer_timing else None
        # Objects alive now live for the whole run: freezing them keeps the per-iteration full
        # collection (runtime/executor.py) from rescanning every module and tensor (0.15 s each).
        gc.collect()
        freeze = not simulated or not heap_frozen()  # never release someone else's frozen set (runtime/heap.py)
        if freeze:
            gc.freeze()
        records: list[IterationRecord] = []
        layer_seconds: list[dict[str, list[list[float]]]] = []
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
    barrier()
    tracked = cfg.track_memory
    # On a shared GPU, memory outside the allocator is every rank's together: not this device's. A simulated
    # CUDA device's is its model's (runtime/gpu_memory.py).
    overhead = meter.overhead_bytes() if tracked and not cfg.share_gpu else None
    return RankReport(
        rank=rank,
        stage=stage_index,
        rank_in_stage=index_in_stage,
        node=cfg.cluster.node_of(rank),
        in_flight=executor.in_flight,
        iteration_peaks=[r.peak for r in records] if tracked else [],
        reserved_peaks=[r.reserved_peak for r in records if r.reserved_peak is not None] if tracked else [],
        static=[r.static for r in records] if tracked else [],
        data=[r.data for r in records] if tracked else [],
        breakdowns=[r.peak_breakdown for r in records] if tracked else [],
        seconds=[r.seconds for r in records],
        # a real rank's loss is never None (only a fake tensor's is: runtime/executor.py)
        losses=[] if simulated else [r.loss for r in records if r.loss is not None],
        timeline=records[-1].timeline if tracked else [],
        overhead_bytes=overhead,
        layer_seconds=layer_seconds,
        workspaces=records[-1].workspaces if tracked and records else None,
    )


class StageMeshes(NamedTuple):
    """The device meshes of one rank of a stage (:func:`stage_meshes`)."""

    tensor: Any
    """The tensor group's 1-D mesh (the DTensor shards' placements), or None."""
    data: Any
    """The data group's 1-D mesh for FSDP (ZeRO-2/3), or None."""
    rank_table: torch.Tensor | None
    """The 2-D mesh's table of ranks when the two are dimensions of one mesh, else None: FSDP2 reads it
    while it shards (host bookkeeping, which the rank's memory meter must not count)."""


def stage_meshes(stage: StagePlan, tp_group: Any, dp_group: Any, device_type: str) -> StageMeshes:
    """The ``DeviceMesh`` es of this rank's tensor group and, for ZeRO-2/3, data group.

    Made from the groups :func:`_stage_groups` created (``DeviceMesh.from_group``: no new collective). A
    data x tensor stage sharded by FSDP gets one 2-D ``("data", "tensor")`` mesh over the stage's devices
    (tensor-fastest, as the plan lists them) and the two are its dimensions: FSDP2 shards a tensor-parallel
    DTensor parameter over the data dimension only when both meshes come from the same root mesh (it
    concatenates them into the parameter's 2-D placement; PyTorch's FSDP + TP composition, as torchtitan
    builds its ``dp_shard`` x ``tp`` mesh).
    """
    from torch.distributed.device_mesh import DeviceMesh

    fsdp = stage.zero >= 2  # Plan.validate: a ZeRO stage has a data group
    if tp_group is not None and fsdp:
        table = torch.tensor(stage.devices, dtype=torch.int).view(stage.data_degree, stage.tensor_degree)
        mesh = DeviceMesh.from_group([dp_group, tp_group], device_type, table, mesh_dim_names=("data", "tensor"))
        return StageMeshes(mesh["tensor"], mesh["data"], table)
    tp_mesh = DeviceMesh.from_group(tp_group, device_type) if tp_group is not None else None
    return StageMeshes(tp_mesh, DeviceMesh.from_group(dp_group, device_type) if fsdp else None, None)


def _stage_groups(plan: Plan, stage_index: int, index_in_stage: int) -> tuple[Any, Any]:
    """This rank's tensor-parallel group and data-parallel group (None where the stage has no such degree).

    Every rank creates every stage's groups, in the same order (``new_group`` is collective): per stage, the
    tensor group of each replica (devices tensor-fastest: ``tensor_group(r)``), then the data group of each
    tensor rank (``data_group(k)``: the k-th device of every replica, whose gradients are summed).
    """
    mine: tuple[Any, Any] = (None, None)
    for i, s in enumerate(plan.stages):
        tensor = [dist.new_group(list(s.tensor_group(r))) for r in range(s.data_degree)] if s.tensor_degree > 1 else []
        data = [dist.new_group(list(s.data_group(k))) for k in range(s.tensor_degree)] if s.data_degree > 1 else []
        if i == stage_index:
            replica, k = divmod(index_in_stage, s.tensor_degree)
            mine = (tensor[replica] if tensor else None, data[k] if data else None)
    return mine


def rank_failure(rank: int, exc: BaseException) -> RankFailure:
    """The report of ``rank`` failing with ``exc``: "oom" for running out of device memory (the CPU
    tracker's :class:`~hybridplan.runtime.memory.DeviceOutOfMemory` or torch's CUDA OutOfMemoryError),
    else "failed"."""
    oom = isinstance(exc, DeviceOutOfMemory) or type(exc).__name__ == "OutOfMemoryError"
    return RankFailure(
        status="oom" if oom else "failed",
        rank=rank,
        reason=f"device {rank}: {type(exc).__name__}: {exc}".strip(),
        time=time.time(),
        traceback="".join(traceback.format_exception(exc))[-4000:],
    )
