"""Simulated devices: run a plan's per-device work on fake tensors in this process and count its memory.

Each simulated device runs exactly what a real rank runs (runtime/rank.py ``run_rank``: the same stage
building, tensor-parallel sharding, optimizer, :class:`~hybridplan.runtime.executor.StageExecutor` and
:class:`~hybridplan.runtime.memory.StorageTracker`), with two substitutions:

- the process group is torch's fake one (``dist.init_process_group("fake", store=FakeStore(), ...)``):
  collectives and point-to-point operations return at once and leave their buffers as they are;
- every tensor is a ``FakeTensor`` (``FakeTensorMode``): it has a shape, a dtype and a storage of the
  right size, but no data, so a device of any size is simulated in the memory of its metadata
  (measured: benchmarks/sim_speed).

The storage tracker counts the fake storages as it counts real ones, so a simulated device's peaks,
breakdowns and per-action timeline equal the real CPU runtime's (tests/runtime/test_sim_agreement.py).
What needs values is skipped: there are no losses, and times are not measured (``iteration_seconds`` is
None; a report's ``seconds`` are the simulation's own wall times). For ``device_type="cuda"`` the tracker
counts in GPU terms: each device is a model of a CUDA device (runtime/gpu_memory.py) whose tensor peak,
reserved peak and memory outside the allocator are reported, and whose capacity is its whole memory.

[Note: simulating one device per stage] Devices of one stage do provably identical work in memory
terms, so :func:`simulate` runs the first device of each stage and copies its report to the others
(renaming rank, index in stage and node, and re-counting the NCCL communicators in the memory a
CUDA device holds outside its allocator, which depend on the device's peers): the replicas of a data-parallel stage hold equal-sized row shards of every
micro-batch (a plan's data-parallel degree divides its micro-batch size) and equal copies of the
parameters; the ranks of a tensor-parallel stage hold equal-sized shards (a split is valid only if the
degree divides the dimension) and all rows; every rank of a stage runs the same action list; a
receive allocates one buffer of the rank's rows however many peers fill it, and a send allocates
nothing (it sends views of the detached output). ``simulate(..., distinct_only=False)`` simulates
every device instead (the tests check both agree). A ZeRO-sharded stage is the exception: ZeRO-1 gives each
replica the optimizer state of whole parameters (an uneven share), and FSDP's last shard of a dimension that
``d`` does not divide is shorter (runtime/sharding.py); so one device is simulated per distinct share, which the
parameters' shapes tell ([Note: equal ZeRO shares] in runtime/zero_shares.py): one per replica under ZeRO-1, and
under ZeRO-2/3 one for the whole stage where ``d`` divides every dimension it shards.

Example::

    from hybridplan.runtime.sim import simulate, simulate_stage
    result = simulate(RunConfig(model="gpt3-1.3b", plan=plan, cluster=cluster, backend="sim"))
    report = simulate_stage(cfg, stage_index=0)       # one device of stage 0: a RankReport, as run_rank's
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from hybridplan.errors import UsageError
from hybridplan.models.boundaries import BoundarySpec, boundary_specs
from hybridplan.models.zoo import resolve_model
from hybridplan.runtime.config import RunConfig, validate_config
from hybridplan.runtime.fake_group import fake_process_group
from hybridplan.runtime.gpu_memory import NCCL_COMMUNICATOR_BYTES, communicators_of
from hybridplan.runtime.heap import frozen_heap
from hybridplan.runtime.memory import DeviceOutOfMemory
from hybridplan.runtime.rank import run_rank
from hybridplan.runtime.result import RankReport, RunResult, aggregate, failed_result
from hybridplan.runtime.zero_shares import zero_representatives

__all__ = ["simulate", "simulate_stage", "fake_process_group", "frozen_heap"]


def _simulated_tensor_mode() -> Any:
    """A ``FakeTensorMode`` in which host bookkeeping held in real tensors stays real.

    In a simulation every tensor of the model is fake; the only real tensors are the rank tables of device
    meshes, made outside the fake mode (runtime/rank.py). A plain ``FakeTensorMode`` refuses any operation
    on them, and FSDP2 computes on them inside ``fully_shard`` when it composes a tensor-parallel
    parameter's 2-D mesh (``DeviceMesh._concatenate`` reads the mesh's rank layout). An operation whose
    tensors are all real therefore runs for real, as it does on a real rank (where the memory tracker
    sees the same small host tensors); everything else is faked as before. Lifting a constant
    (``torch.tensor``) still makes a fake tensor.
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
    from torch.utils._pytree import tree_leaves

    class SimulatedTensorMode(FakeTensorMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if args and isinstance(args[0], FakeTensor):  # nearly every op: faked, no need to flatten the arguments
                return super().__torch_dispatch__(func, types, args, kwargs)
            tensors = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
            if tensors and func not in self.lift_fns and not any(isinstance(t, FakeTensor) for t in tensors):
                with unset_fake_temporarily():
                    return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

    return SimulatedTensorMode()


def simulate_stage(
    cfg: RunConfig,
    stage_index: int,
    *,
    iterations: int = 2,
    specs: list[BoundarySpec] | None = None,
    rank: int | None = None,
    skip_repeats: bool = True,
) -> RankReport:
    """Simulate one device of stage ``stage_index`` of ``cfg.plan``; return its report.

    The report is a real rank's (runtime/rank.py ``run_rank``), except: ``seconds`` are the simulation's
    wall time per iteration, not a device time; ``losses`` are empty; ``overhead_bytes`` is the GPU
    memory a modelled CUDA device holds outside its allocator for ``device_type="cuda"``, else None; ``layer_seconds`` are empty (layer timing needs real
    devices). The first iteration is the warm-up (the optimizer state appears in its step), so
    ``iterations`` must be at least 2 for a steady-state peak. The plan is not validated here (a
    profiling campaign calls this many times): use :func:`~hybridplan.runtime.config.validate_config`
    first for plans from users.

    Args:
        cfg: the run (its ``backend`` is not consulted; ``cfg.iterations`` is replaced by ``iterations``).
        stage_index: which stage.
        iterations: iterations to simulate.
        specs: the model's boundary specs (:func:`~hybridplan.models.boundaries.boundary_specs`), if known.
        rank: which device of the stage (default: its first; all do the same work in memory terms).
        skip_repeats: do not trace blocks of actions that repeat the device's state (runtime/repeats.py
            [Note: skipping repeated blocks]: the report is the same to the byte); False traces every action.

    Raises:
        UsageError: for a stage index out of range, a rank not in the stage, or fewer than 1 iteration.
        DeviceOutOfMemory: if the device's capacity is exceeded (as a real rank would run out).
    """
    plan = cfg.plan
    if not 0 <= stage_index < plan.num_stages:
        raise UsageError(
            f"stage index {stage_index} is out of range for a plan of {plan.num_stages} stages",
            fix=f"use 0 to {plan.num_stages - 1}",
        )
    if iterations < 1:
        raise UsageError(f"iterations must be at least 1, got {iterations}", fix="use 2 (warm-up + measured)")
    devices = plan.stages[stage_index].devices
    if rank is None:
        rank = devices[0]
    elif rank not in devices:
        raise UsageError(f"device {rank} is not in stage {stage_index} (devices {list(devices)})")
    run_cfg = replace(cfg, iterations=iterations, save_weights_dir=None)
    with frozen_heap(), fake_process_group(rank, plan.num_devices), _simulated_tensor_mode(), warnings.catch_warnings():
        # FSDP2 warns that a wrapped embedding returns a view, in case the caller edits it in place; no layer does
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        return run_rank(rank, run_cfg, device=torch.device("cpu"), specs=specs, simulated=True,
                        skip_repeats=skip_repeats)


def simulate(
    cfg: RunConfig,
    *,
    on_event: Callable[[str], None] | None = None,
    distinct_only: bool = True,
    same_as: Mapping[int, int] | None = None,
) -> RunResult:
    """Simulate every device of ``cfg.plan`` (``launch`` calls this for ``backend="sim"``).

    Devices are simulated one after the other in this process; with ``distinct_only`` one device per
    stage (see [Note: simulating one device per stage]) and, in a ZeRO stage, one per device of ``same_as``'s
    values: ``same_as[r]`` names a device of r's stage that holds r's shares to the byte (default: from the
    parameters' shapes, runtime/zero_shares.py ``zero_representatives``: a ZeRO-2/3 stage of a model whose
    dimensions its data degree divides is one device); a ZeRO device it does not name is simulated. A device whose tensors exceed its capacity
    ends the simulation with status "oom", as it ends a real run; any other exception gives "failed".

    Returns:
        The result, in the real runtime's form, with ``iteration_seconds`` None and no losses.
    """
    validate_config(cfg)
    say = on_event or (lambda _msg: None)
    plan = cfg.plan
    specs = boundary_specs(resolve_model(cfg.model))
    started = time.perf_counter()
    if distinct_only and same_as is None and any(stage.zero for stage in plan.stages):
        same_as = zero_representatives(cfg.model, plan)
    reports: dict[int, RankReport] = {}
    for index, stage in enumerate(plan.stages):
        if not distinct_only:
            ranks = list(stage.devices)
        elif not stage.zero:
            ranks = list(stage.devices[:1])
        else:
            ranks = sorted({(same_as or {}).get(r, r) for r in stage.devices})
        for rank in ranks:
            t0 = time.perf_counter()
            try:
                report = simulate_stage(cfg, index, iterations=cfg.iterations, specs=specs, rank=rank)
            except DeviceOutOfMemory as e:
                reason = f"device {rank} (stage {index}): {type(e).__name__}: {e}"
                return failed_result(cfg, "oom", reason, time.perf_counter() - started)
            except UsageError:
                raise
            except Exception as e:  # a failing device fails the run, as in the real runtime
                reason = f"device {rank} (stage {index}): {type(e).__name__}: {e}"
                return failed_result(cfg, "failed", reason, time.perf_counter() - started)
            say(f"simulated device {rank} (stage {index}) in {time.perf_counter() - t0:.1f} s")
            reports[rank] = _as_rank(cfg, report, rank)
        for rank in stage.devices:
            if rank not in reports:
                source = (same_as or {}).get(rank, rank) if stage.zero else stage.devices[0]
                reports[rank] = _as_rank(cfg, reports[source], rank)
    ordered = [reports[rank] for rank in range(plan.num_devices)]
    for rep in ordered:  # a copied CUDA device may join more communicators than the one simulated
        capacity = cfg.cluster.memory_of(rep.rank)
        if capacity is not None and rep.reserved_peaks and rep.overhead_bytes is not None:
            total = max(rep.reserved_peaks) + rep.overhead_bytes
            if total > capacity:
                reason = (f"device {rep.rank} (stage {rep.stage}): DeviceOutOfMemory: {total} bytes of device memory"
                          f" in use at the peak (reserved + outside the allocator), capacity {capacity} bytes")
                return failed_result(cfg, "oom", reason, time.perf_counter() - started)
    return aggregate(cfg, ordered, wall_seconds=time.perf_counter() - started)


def _as_rank(cfg: RunConfig, report: RankReport, rank: int) -> RankReport:
    """``report`` of a device of the same stage, as ``rank``'s (see [Note: simulating one device per stage])."""
    plan = cfg.plan
    stage = plan.stages[plan.stage_of_device(rank)]
    overhead = report.overhead_bytes
    if overhead is not None:  # a simulated CUDA device: the same libraries, its own communicators
        joined = len(communicators_of(plan, rank)) - len(communicators_of(plan, report.rank))
        overhead += joined * NCCL_COMMUNICATOR_BYTES
    return replace(
        report, rank=rank, rank_in_stage=stage.devices.index(rank), node=cfg.cluster.node_of(rank), overhead_bytes=overhead
    )

