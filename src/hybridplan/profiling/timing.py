"""Layer-time profiling (``hybridplan profile --time``): per-layer forward and backward seconds, measured by
the runtime, for the throughput model (predict/time_model.py).

For each tensor-parallel degree ``t`` (1, 2 and 4 where a node has ``t`` devices and some layer can be
split; :func:`default_tensor_degrees`) and each micro-batch size ``b`` (the target's, and its half), runs
train the model as ONE pipeline stage, "tensor" x ``t`` ("none" for 1) on ``t`` devices, for
:data:`TIMING_ITERATIONS` iterations of :data:`TIMING_MICROBATCHES` micro-batches of ``b`` samples, with
``RunConfig.layer_timing``: hooks time every layer's forward and backward of every micro-batch
(runtime/layer_timer.py). A layer's time is the median over the micro-batches of the measured iterations
(the first iteration is a warm-up and dropped), taken on the slowest rank of the tensor group (a tensor
group waits for its slowest member). The times at ``t > 1`` are measured inside a real tensor-parallel group,
so they include its all-reduces (``tensor_comm_in_times``).

[Note: optimizer step and overhead] The same runs measure the two per-iteration costs the layers leave out
(issue 14; on an H100 the layers alone were 16-36% below the iteration: ../shared/notes/gpu-h100-facts.md,
section Time): the optimizer step, timed by the optimizer's own step hooks (runtime/layer_timer.py) and stored
per byte of parameters one device updates (the time model composes a stage's step from its parameter bytes,
tensor degree and ZeRO sharding: AdamW's update is a fixed number of element-wise passes over every
parameter), and the *overhead*: per measured iteration, the rank's iteration seconds minus its layers' forward
and backward seconds over all micro-batches minus its step: zero_grad, the synthetic batch, the loss, the
barriers that delimit an iteration, and the glue between layers. Both are medians over the measured
iterations; the step is the slowest rank's, the overhead the smallest rank's (a faster rank's residual also
holds its wait for the slowest one at the closing barrier, which the layer times already count). Each run's
two numbers go to table ``run_costs``.

Chunks: a run holds at most ``max_layers_per_run`` consecutive layers (default: all), as a
:class:`~hybridplan.models.slice.ModelSlice` when it is not the whole model: for a model larger than ``t``
devices hold. [Note: layers that cannot be split] At ``t > 1`` only the layers with a tensor-parallel split
at ``t`` are timed, in maximal runs of consecutive ones. A time profile needs every layer at every degree:
the others get their degree-1 time at the same micro-batch size (what a replicated copy costs); no valid
plan puts them in a tensor stage (``Plan.validate``), so the value never counts.

[Note: measuring the links] Before the first timing run, two processes of the runtime measure its backend's
per-message latency and bandwidth (runtime/link_probe.py; gloo on CPU, NCCL on CUDA), stored once per
database as ``time_links`` (profiling/links.py): the time model charges that latency per message the runtime
sends (predict/communication.py, [Note: per-message latency]). A probe that fails is said and leaves the
profile without links (latency 0), as a profile of an older version has.

Every run's times go to the profile database (table ``layer_times``, profiling/store.py) when it finishes,
and a run whose layers are all there is skipped: an interrupted profile resumes. :func:`~hybridplan.profiling.stored_time_profile.time_profile_from_store`
turns the table into a :class:`~hybridplan.profiling.time_profile.TimeProfile` (its JSON is the documented
format), keyed by the cluster's device type.

CPU timings are noisy (no pinning, other processes, gloo's TCP collectives) and say little about GPU times:
they exercise the pipeline; plan with a profile taken on the devices you train on.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.models.base import LayeredModel
from hybridplan.plan import Plan, StagePlan
from hybridplan.profiling.links import LinkCosts, measure_links
from hybridplan.profiling.layer_info import LayerInfo, parameter_bytes
from hybridplan.profiling.store import ProfileStore

__all__ = [
    "DEFAULT_TENSOR_DEGREES",
    "TIMING_MICROBATCHES",
    "TIMING_ITERATIONS",
    "TimingConfig",
    "TimingSummary",
    "LayerTiming",
    "default_tensor_degrees",
    "timing_chunks",
    "median_layer_times",
    "run_costs",
    "layer_infos",
]

DEFAULT_TENSOR_DEGREES: tuple[int, ...] = (1, 2, 4)
"""Tensor-parallel degrees timed by default: those of issue #5 and of AMP's profiles (``known_cost`` files
for tp 1, 2, 4; seed 002); larger ones span nodes of 4 GPUs, which no stage of a plan may."""

TIMING_MICROBATCHES = 4
"""Micro-batches per timing run: with two measured iterations, 8 samples of every layer's time to take the
median of (robust to the odd slow micro-batch on a shared machine)."""

TIMING_ITERATIONS = 3
"""Iterations per timing run: one warm-up (allocator growth, lazy initialisation, first-call dispatch,
dropped) and two measured."""


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    """What to time and how."""

    model: str
    """Zoo name or ``module:function``."""
    cluster: Cluster
    """Its device type labels the times; its node size bounds the tensor degrees."""
    micro_batch_sizes: tuple[int, ...]
    """Samples per micro-batch to time at (the target's, and its half)."""
    tensor_degrees: tuple[int, ...] | None = None
    """Default: :func:`default_tensor_degrees`."""
    num_microbatches: int = TIMING_MICROBATCHES
    iterations: int = TIMING_ITERATIONS
    max_layers_per_run: int | None = None
    """Consecutive layers per run (None: all that can run together)."""
    seed: int = 0
    timeout_s: float = 900.0
    run_options: dict[str, Any] = field(default_factory=dict)
    """Further RunConfig fields (precision, activation_checkpointing, device_type), as for memory profiling."""


@dataclass
class TimingSummary:
    """What a timing profile did."""

    runs_executed: int = 0
    runs_resumed: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def default_tensor_degrees(model: LayeredModel, cluster: Cluster) -> tuple[int, ...]:
    """1, and 2 and 4 where a node has that many devices and at least one layer can be split so."""
    out = [1]
    for t in DEFAULT_TENSOR_DEGREES[1:]:
        if t <= cluster.devices_per_node and any(model.tensor_parallel_problem(l, t) is None for l in range(model.num_layers)):
            out.append(t)
    return tuple(out)


def timing_chunks(model: LayeredModel, degree: int, max_layers: int | None = None) -> list[tuple[int, int]]:
    """Layer ranges ``[start, stop)`` timed at ``degree``: maximal runs of layers that can be split at it
    ([Note: layers that cannot be split]), cut to at most ``max_layers`` layers each.

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> timing_chunks(get_model("gpt-tiny"), 2, 4)
        [(0, 4), (4, 8), (8, 10)]
    """
    ok = [degree == 1 or model.tensor_parallel_problem(l, degree) is None for l in range(model.num_layers)]
    step = max_layers or model.num_layers
    chunks, l = [], 0
    while l < model.num_layers:
        if not ok[l]:
            l += 1
            continue
        end = l
        while end < model.num_layers and ok[end] and end - l < step:
            end += 1
        chunks.append((l, end))
        l = end
    return chunks


def median_layer_times(result: Any, num_layers: int) -> tuple[list[float], list[float], int]:
    """Per-layer ``(forward_s, backward_s, samples)`` from a timing run's result: the median over the
    micro-batches of the measured iterations on each rank, then the slowest rank."""
    forward = [0.0] * num_layers
    backward = [0.0] * num_layers
    counts = []
    for device in result.devices:
        records = device.layer_seconds[1:] or device.layer_seconds  # drop the warm-up iteration
        rows_f = [row for r in records for row in r["forward"]]
        rows_b = [row for r in records for row in r["backward"]]
        if not rows_f or not rows_b:
            raise ProfileError(f"device {device.device} recorded no layer times", fix="time with RunConfig.layer_timing")
        counts.append(min(len(rows_f), len(rows_b)))
        for l in range(num_layers):
            forward[l] = max(forward[l], statistics.median(r[l] for r in rows_f))
            backward[l] = max(backward[l], statistics.median(r[l] for r in rows_b))
    return forward, backward, min(counts)


def run_costs(result: Any) -> tuple[float, float]:
    """``(step_s, overhead_s)`` of a timing run's result ([Note: optimizer step and overhead])."""
    steps, overheads = [], []
    for device in result.devices:
        measured = range(1, len(device.layer_seconds)) if len(device.layer_seconds) > 1 else range(len(device.layer_seconds))
        step_it, over_it = [], []
        for it in measured:
            record = device.layer_seconds[it]
            layers = sum(sum(row) for row in record["forward"]) + sum(sum(row) for row in record["backward"])
            step = sum(row[0] for row in record.get("step", []))
            step_it.append(step)
            over_it.append(device.iteration_seconds[it] - layers - step)
        if not step_it:
            raise ProfileError(f"device {device.device} recorded no iteration", fix="time with RunConfig.layer_timing")
        steps.append(statistics.median(step_it))
        overheads.append(statistics.median(over_it))
    return max(steps), max(0.0, min(overheads))


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask; what the CPU runtime's device processes share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def layer_infos(model: LayeredModel, precision: str = "fp32") -> tuple[LayerInfo, ...]:
    """Each layer's boundary bytes per sample (its output, in the compute dtype if floating) and gradient bytes
    (trainable parameters in the compute dtype: gradients are reduced in it, runtime/precision.py), from the
    meta device."""
    from hybridplan.runtime.precision import compute_dtype
    from hybridplan.models.boundaries import boundary_specs

    dtype = compute_dtype(precision)
    size = torch.empty((), dtype=dtype).element_size()
    specs = boundary_specs(model)
    out = []
    for l in range(model.num_layers):
        spec = specs[l + 1]
        esize = size if spec.dtype.is_floating_point else torch.empty((), dtype=spec.dtype).element_size()
        with torch.device("meta"):
            trainable = [p for p in model.build_layer(l).parameters() if p.requires_grad]
        params = sum(p.numel() for p in trainable)
        out.append(LayerInfo(name=model.layer_name(l), activation_bytes_per_sample=float(math.prod(spec.sample_shape) * esize),
                             parameter_bytes=float(params * size), parameter_tensors=len(trainable)))
    return tuple(out)


class LayerTiming:
    """Runs a :class:`TimingConfig` into a :class:`ProfileStore` (module docstring).

    Args:
        cfg: what to time.
        store: the profile database (shared with the memory campaign; resumed).
        progress: called with one line per event.
        execute: runs a RunConfig and returns its result (default: the runtime's launcher).
        links: measures the backend's links ([Note: measuring the links]; default: two processes of the
            runtime when ``execute`` is the runtime's launcher, none when a caller gives its own ``execute``).

    Raises:
        ProfileError: for a simulated backend, a heterogeneous cluster, or a database of another model or setup.
    """

    def __init__(
        self,
        cfg: TimingConfig,
        store: ProfileStore,
        *,
        progress: Callable[[str], None] | None = None,
        execute: Callable[[Any], Any] | None = None,
        links: Callable[[str], LinkCosts] | None = None,
    ) -> None:
        from hybridplan.models.zoo import resolve_model

        if cfg.run_options.get("backend", "real") != "real":
            raise ProfileError(
                "--time measures seconds, but simulated devices (--backend sim) run fake tensors that take no time",
                fix="time layers with --backend real (the default)",
            )
        types = sorted({d.type for d in cfg.cluster.devices})
        if len(types) > 1:
            raise ProfileError(
                f"--time labels the times with the cluster's device type, but cluster {cfg.cluster.shape} has {types}",
                fix="time each device type on its own machine with a cluster of that type",
            )
        self.cfg = cfg
        self.store = store
        self.say = progress or (lambda _msg: None)
        self.model = resolve_model(cfg.model)
        self.device_type = types[0]
        self.degrees = cfg.tensor_degrees or default_tensor_degrees(self.model, cfg.cluster)
        for t in self.degrees:
            if t < 1 or t > cfg.cluster.devices_per_node:
                raise ProfileError(f"cannot time tensor degree {t} on nodes of {cfg.cluster.devices_per_node} devices",
                                   fix=f"use degrees from 1 to {cfg.cluster.devices_per_node}")
        for b in cfg.micro_batch_sizes:
            if b < 1 or b % self.model.sample_granularity:
                raise ProfileError(f"micro-batch size {b} is not a positive multiple of {self.model.sample_granularity}")
        self.execute = execute or self._launch
        self.links = links if links is not None else (measure_links if execute is None else None)
        self._record_meta()

    def _record_meta(self) -> None:
        options = self.cfg.run_options
        identity = {
            "model": self.cfg.model,
            "precision": options.get("precision", "fp32"),
            "activation_checkpointing": bool(options.get("activation_checkpointing", False)),
            "device": options.get("device_type", "cpu"),
            "seed": self.cfg.seed,
            "num_microbatches": self.cfg.num_microbatches,
            "iterations": self.cfg.iterations,
        }
        memory_model = self.store.get_meta("model")
        if memory_model is not None and memory_model != self.cfg.model:
            raise ProfileError(f"{str(self.store.path)!r} profiles {memory_model!r}, not {self.cfg.model!r}",
                               fix="use the database of this model, or a new --db file")
        old = self.store.get_meta("time_identity")
        if old is not None and old != identity:
            diff = sorted(k for k in identity if old.get(k) != identity[k])
            raise ProfileError(f"{str(self.store.path)!r} holds layer times of another setup (differs in {diff})",
                               fix="use a new --db file, or the same timing options")
        self.store.set_meta("time_identity", identity)
        if identity["device"] == "cpu":
            self.store.set_meta("time_host_cores", host_cores())
        self.store.set_meta("time_layers", [vars(i) | {"tensor_parallel_allreduces": list(i.tensor_parallel_allreduces)}
                                            for i in layer_infos(self.model, identity["precision"])])
        unsplittable = {str(t): [l for l in range(self.model.num_layers) if self.model.tensor_parallel_problem(l, t)]
                        for t in self.degrees if t > 1}
        self.store.set_meta("time_unsplittable", {**(self.store.get_meta("time_unsplittable") or {}), **unsplittable})

    def run(self) -> TimingSummary:
        """Time every (degree, micro-batch size, chunk) not yet in the database."""
        summary = TimingSummary()
        started = time.perf_counter()
        self._measure_links()
        done = self.store.layer_times()
        todo = [(t, b, c) for t in self.degrees for b in self.cfg.micro_batch_sizes
                for c in timing_chunks(self.model, t, self.cfg.max_layers_per_run)]
        for i, (t, b, (start, stop)) in enumerate(todo):
            have = done.get((self.device_type, t, b), {})
            if all(l in have for l in range(start, stop)):
                summary.runs_resumed += 1
                continue
            t0 = time.perf_counter()
            result = self.execute(self._config(t, b, start, stop))
            what = f"tensor degree {t}, micro-batch {b}, layers [{start}, {stop})"
            if not result.ok:
                summary.failed.append(f"{what}: {result.status}: {result.reason}")
                self.say(f"[{i + 1}/{len(todo)}] {what}: {result.status} ({result.reason})")
                continue
            if not getattr(result, "iteration_seconds_representative", True):  # ranks shared a GPU: not recorded
                reason = f"its {t} ranks shared a GPU (runtime/shared_gpu.py): times not representative, not recorded"
                summary.failed.append(f"{what}: {reason}")
                self.say(f"[{i + 1}/{len(todo)}] {what}: {reason}")
                continue
            fwd, bwd, samples = median_layer_times(result, stop - start)
            step_s, overhead_s = run_costs(result)
            self.store.record_layer_times(self.device_type, t, b, [
                (start + l, fwd[l], bwd[l], samples) for l in range(stop - start)])
            self.store.record_run_costs(self.device_type, t, b, start, stop, self._parameter_bytes(start, stop) / t,
                                        step_s, overhead_s)
            summary.runs_executed += 1
            self.say(f"[{i + 1}/{len(todo)}] {what}: forward {sum(fwd) * 1e3:.2f} ms, backward {sum(bwd) * 1e3:.2f} ms"
                     f" (medians of {samples} micro-batches) in {time.perf_counter() - t0:.1f} s")
        summary.seconds = time.perf_counter() - started
        return summary

    def _measure_links(self) -> None:
        """[Note: measuring the links], once per database."""
        if self.links is None or self.store.get_meta("time_links") is not None:
            return
        try:
            costs = self.links(self.cfg.run_options.get("device_type", "cpu"))
        except ProfileError as e:
            self.say(f"links not measured ({e.message}): the time model will charge no per-message latency")
            return
        self.store.set_meta("time_links", costs.to_dict())
        bandwidth = lambda b: "unmeasured" if b is None else f"{b / 1e9:.2f} GB/s"  # noqa: E731
        self.say(f"links ({costs.backend}): all-reduce {costs.allreduce_latency_s * 1e6:.0f} us per ring step,"
                 f" {bandwidth(costs.allreduce_bandwidth)}; send/recv {costs.p2p_latency_s * 1e6:.0f} us per message,"
                 f" {bandwidth(costs.p2p_bandwidth)}")

    def _parameter_bytes(self, start: int, stop: int) -> float:
        """Parameter bytes of layers ``[start, stop)``, shared ones once (as a stage holds them)."""
        return parameter_bytes(layer_infos(self.model, self.cfg.run_options.get("precision", "fp32"))[start:stop])

    def _config(self, degree: int, micro_batch_size: int, start: int, stop: int) -> Any:
        from hybridplan.models.slice import ModelSlice
        from hybridplan.runtime.config import RunConfig

        whole = (start, stop) == (0, self.model.num_layers)
        model: Any = self.cfg.model if whole else ModelSlice(self.model, start, stop)
        stage = StagePlan(0, stop - start, "tensor" if degree > 1 else "none", degree, tuple(range(degree)))
        m = self.cfg.num_microbatches
        plan = Plan("1f1b", micro_batch_size * m, m, (stage,))
        cluster = Cluster.uniform(1, degree, device_type=self.device_type)
        return RunConfig(model=model, plan=plan, cluster=cluster, iterations=self.cfg.iterations, seed=self.cfg.seed,
                         timeout_s=self.cfg.timeout_s, track_memory=False, record_timeline=False, layer_timing=True,
                         **self.cfg.run_options)

    @staticmethod
    def _launch(cfg: Any) -> Any:
        from hybridplan.runtime.launch import launch

        return launch(cfg)
