"""A one-shot memory estimate: the per-device peak of a plan (or of the best few plans) from simulated devices,
without a profiling campaign.

``hybridplan estimate-memory`` answers "will it fit?" in seconds for a small model and in minutes for a paper-size
one. Each DISTINCT stage of the plans is simulated once on fake tensors (runtime/sim.py: the rank's real work,
every storage counted, no memory needed), through :class:`~hybridplan.workflows.stage_cache.StageCache` ([Note: what
a simulated stage's memory depends on]); a plan with ZeRO-sharded stages, whose replicas hold different shares, is
simulated whole. With ``device_type="cuda"`` the peaks are counted in CUDA allocator blocks and each device gets
the estimated memory outside its tensors (runtime/gpu_memory.py ``estimate_overhead_bytes``: the CUDA context, its
NCCL communicators and every library's kernels - cuBLAS, attention, cuDNN - as the predictor counts them: at most
18 MiB above what a stage that never loads attention or cuDNN kernels holds).

How it differs from a measured profile (``hybridplan profile`` then ``predict`` or ``validate``, the way to
certainty): the simulator counts the tensors hybridplan's runtime allocates, exactly (byte-identical to the real
CPU runtime on the tiny models, tests/runtime/test_sim_agreement.py), but on a GPU the allocator's fragmentation and
cached blocks, the CUDA context, NCCL's buffers and library workspaces are modelled or estimated
(runtime/gpu_memory.py), not measured; and the estimate is for hybridplan's runtime, or for it holding memory as
the ``engine`` a plan is exported to does where the runtime can (runtime/engines.py: Megatron-LM's fp32 gradient
buffers), not for the engine's own code.

Without a plan, the candidates are the uniform grids AMP searches (search/time/throughput.py
``enumerate_degrees``: every ``pipeline x data x tensor`` of the mesh, tensor groups inside a node) with equal
layer counts per stage (search/baselines.py ``equal_layers``), placed as Megatron-LM does; the ones the model
cannot run (tensor-parallel support, sample granularity) are skipped, and the ``top`` with the lowest peak are
returned.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridplan.errors import PlanError, UsageError
from hybridplan.plan import Cluster, Plan
from hybridplan.plan.schedule import Schedule
from hybridplan.units import format_bytes
from hybridplan.workflows.validate import DeviceMemory

__all__ = ["DeviceEstimate", "PlanEstimate", "candidate_plans", "engine_candidates", "estimate_plans",
           "DIFFERS_FROM_PROFILE"]

DIFFERS_FROM_PROFILE = (
    "simulated on fake tensors: the exact tensor bytes of hybridplan's runtime, without a profile; on GPUs the "
    "allocator's fragmentation, the CUDA context and NCCL buffers are modelled, not measured. For certainty: "
    "'hybridplan profile' then 'hybridplan validate'."
)


@dataclass(frozen=True)
class DeviceEstimate:
    """One device: its stage, its simulated peak (tensor bytes; CUDA blocks for cuda) and, for cuda, the caching
    allocator's reserved peak and the memory it uses outside the allocator."""

    device: int
    stage: int
    peak_memory_bytes: int
    overhead_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    """CUDA: the allocator's reserved peak in the simulation (runtime/cuda_allocator.py)."""

    @property
    def total_bytes(self) -> int:
        """What must fit the device: on CUDA the reserved peak plus the memory outside the allocator."""
        held = self.peak_memory_bytes if self.reserved_peak_bytes is None else self.reserved_peak_bytes
        return held + (self.overhead_bytes or 0)


@dataclass(frozen=True)
class PlanEstimate:
    """A plan and its devices' estimates."""

    plan: Plan
    devices: tuple[DeviceEstimate, ...]

    @property
    def peak_memory_bytes(self) -> int:
        return max(d.peak_memory_bytes for d in self.devices)

    def fits(self, cluster: Cluster) -> bool:
        """Every device's peak plus overhead within its capacity (True where a capacity is not known)."""
        return all((cap := cluster.memory_of(d.device)) is None or d.total_bytes <= cap for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "peak_memory_bytes": self.peak_memory_bytes,
                "devices": [{"device": d.device, "stage": d.stage, "peak_memory_bytes": d.peak_memory_bytes,
                             "reserved_peak_bytes": d.reserved_peak_bytes, "overhead_bytes": d.overhead_bytes,
                             "total_bytes": d.total_bytes} for d in self.devices]}

    def table(self, cluster: Cluster) -> str:
        lines = [self.plan.describe(), f"{'device':>6} {'stage':>5} {'peak':>12} {'reserved':>12} {'+overhead':>12}"
                                       f" {'capacity':>12}"]
        for d in self.devices:
            cap = cluster.memory_of(d.device)
            over = "  over capacity" if cap is not None and d.total_bytes > cap else ""
            extra = "-" if d.overhead_bytes is None else format_bytes(d.overhead_bytes)
            reserved = "-" if d.reserved_peak_bytes is None else format_bytes(d.reserved_peak_bytes)
            lines.append(f"{d.device:>6} {d.stage:>5} {format_bytes(d.peak_memory_bytes):>12} {reserved:>12} {extra:>12}"
                         f" {format_bytes(cap):>12}{over}")
        lines.append(f"estimated plan peak: {format_bytes(self.peak_memory_bytes)}")
        return "\n".join(lines)


def candidate_plans(model: str, cluster: Cluster, *, global_batch_size: int, num_microbatches: int,
                    schedule: Schedule = "1f1b") -> list[Plan]:
    """The uniform grids of the module docstring that the model can run on ``cluster``.

    Raises:
        PlanError: if none can (naming why the last one could not).
    """
    from hybridplan.models.zoo import resolve_model
    from hybridplan.search.baselines import equal_layers
    from hybridplan.search.time.rank_placement import megatron_placement
    from hybridplan.search.time.throughput import divisors, enumerate_degrees

    m = resolve_model(model)
    if global_batch_size % num_microbatches:
        raise PlanError(f"global batch {global_batch_size} does not split into {num_microbatches} equal micro-batches",
                        fix="choose --num-microbatches dividing --global-batch-size")
    microbatch = global_batch_size // num_microbatches
    out: list[Plan] = []
    problem = "no mesh shape"
    for pp, dp, tp in enumerate_degrees(cluster.num_devices, m.num_layers, divisors(cluster.devices_per_node),
                                        plan_expressible=False):
        if microbatch % dp:
            problem = f"data degree {dp} does not divide the micro-batch of {microbatch}"
            continue
        try:
            plan = Plan.uniform(boundaries=equal_layers(m.num_layers, pp), data_degree=dp, tensor_degree=tp,
                                micro_batch_size=microbatch // dp, global_batch_size=global_batch_size,
                                devices=megatron_placement(cluster, pp, dp, tp), schedule=schedule)
            plan.validate(model=m, cluster=cluster)
        except PlanError as e:
            problem = e.message
            continue
        out.append(plan)
    if not out:
        raise PlanError(f"no uniform plan of {m.name} runs on {cluster.shape}: {problem}",
                        fix="change the batch or micro-batch count, or the cluster")
    return out


def engine_candidates(engine: str, plans: list[Plan], *, precision: str,
                      model: Any = None) -> tuple[list[Plan], list[tuple[Plan, UsageError]]]:
    """The plans of ``model`` (None: a language model) whose memory under ``engine`` is modelled
    (runtime/engines.py), and the others with the engine profile's reason.

    Example:
        >>> from hybridplan.plan import Plan
        >>> plans = [Plan.uniform(boundaries=[0, 5, 10], data_degree=1, tensor_degree=1, micro_batch_size=4,
        ...                       global_batch_size=8, schedule=s) for s in ("1f1b", "gpipe")]
        >>> kept, refused = engine_candidates("megatron", plans, precision="bf16")
        >>> len(kept), "Megatron-LM runs 1F1B" in refused[0][1].message
        (1, True)
    """
    from hybridplan.runtime.engines import engine_run_options

    kept: list[Plan] = []
    refused: list[tuple[Plan, UsageError]] = []
    for plan in plans:
        try:
            engine_run_options(engine, plan=plan, precision=precision, model=model)
        except UsageError as e:
            refused.append((plan, e))
            continue
        kept.append(plan)
    return kept, refused


def estimate_plans(model: str, cluster: Cluster, plans: list[Plan], *, run_options: dict[str, Any] | None = None,
                   engine: str = "hybridplan", cache: str | Path | None = None,
                   progress: Callable[[str], None] | None = None) -> list[PlanEstimate]:
    """Every device's simulated peak of each plan, each distinct stage simulated once (module docstring).

    Args:
        model: zoo name or ``module:function``.
        cluster: the mesh (its capacities are not enforced while simulating: every peak is measured).
        plans: the plans (checked against the model and cluster first).
        run_options: RunConfig fields (precision, device_type, activation_checkpointing, seed).
        engine: whose memory: each plan is simulated with ``run_options`` plus the engine's RunConfig fields for it
            (runtime/engines.py ``engine_run_options``); "hybridplan" adds none.
        cache: a JSON file of simulated stages to reuse and extend (default: a temporary one).
        progress: one line per simulated stage or plan.

    Raises:
        HybridPlanError: for a plan the model or cluster cannot run, or whose memory under ``engine`` is not
            modelled (UsageError).
    """
    from hybridplan.runtime.config import RunConfig, validate_config
    from hybridplan.runtime.engines import engine_run_options
    from hybridplan.runtime.gpu_memory import LIBRARY_BYTES, estimate_overhead_bytes
    from hybridplan.runtime.sim import simulate
    from hybridplan.workflows.stage_cache import StageCache

    base = {k: v for k, v in (run_options or {}).items() if k != "backend"}
    per_plan = [{**base, **engine_run_options(engine, plan=p, precision=base.get("precision", "fp32"), model=model)}
                for p in plans]
    free = cluster.with_memory(None)
    for plan, options in zip(plans, per_plan):
        validate_config(RunConfig(model=model, plan=plan, cluster=free, backend="sim", **options))
    say = progress or (lambda _msg: None)
    cuda = base.get("device_type") == "cuda"
    groups: dict[str, list[int]] = {}  # the plans of each set of run options
    for i, options in enumerate(per_plan):
        groups.setdefault(json.dumps(options, sort_keys=True), []).append(i)
    out: dict[int, PlanEstimate] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for indices in groups.values():  # one stage cache at a time on the file: each reads what the one before saved
            options = per_plan[indices[0]]
            stages = StageCache(cache or Path(tmp) / "stages.json", model=model, cluster=free, run_options=options,
                                progress=say)
            for i in indices:
                plan, t0 = plans[i], time.perf_counter()
                if any(s.zero for s in plan.stages):  # shares per replica: each distinct one (runtime/sim.py)
                    result = simulate(RunConfig(model=model, plan=plan, cluster=free, iterations=2, backend="sim",
                                                **options))
                    if not result.ok:
                        raise UsageError(f"the simulation of plan {i + 1} ended {result.status}: {result.reason}")
                    measured = [DeviceMemory(d.device, d.stage, None, d.peak_memory_bytes) for d in result.devices]
                    reserved = {d.device: d.reserved_peak_bytes for d in result.devices
                                if d.reserved_peak_bytes is not None}
                else:
                    measured = stages.measure(plan)
                    reserved = stages.reserved_peaks(plan)
                devices = tuple(DeviceEstimate(d.device, d.stage, int(d.measured or 0),
                                               estimate_overhead_bytes(plan, d.device, set(LIBRARY_BYTES)) if cuda
                                               else None, reserved.get(d.device)) for d in measured)
                out[i] = PlanEstimate(plan, devices)
                say(f"plan {i + 1}/{len(plans)}: peak {format_bytes(out[i].peak_memory_bytes)}"
                    f" ({time.perf_counter() - t0:.1f} s)")
    return [out[i] for i in range(len(plans))]


