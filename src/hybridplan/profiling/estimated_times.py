"""Estimated layer times: a time profile without a GPU, from each layer's FLOPs and bytes counted on fake tensors
and the GPU's peak rates.

``plan --objective throughput|pareto`` without ``--db`` or ``--time-profile`` has no measured layer time to put in
AMP's cost model (predict/time_model.py). :func:`estimated_time_profile` gives it the same object a measured profile
gives (:class:`~hybridplan.profiling.time_profile.TimeProfile`: per device type, tensor degree and micro-batch size,
every layer's forward and backward seconds), so the search runs unchanged on estimated times.

[Note: the roofline estimate] Each distinct layer (``LayeredModel.layer_signature``: a Llama's decoder layers are
one) is built as rank 0 of a ``tensor`` x ``t`` stage builds it (runtime/split_layers.py: the runtime's own
tensor-parallel split, on a fake process group), cast to the training precision, and run forward and backward on
``FakeTensor`` inputs of ``b`` samples (the last layer with the model's loss, computed in fp32 as the runtime
does: runtime/executor.py). A dispatch mode sees every ATen operator the pass runs and counts, per operator:

- its FLOPs, by torch's own formulas (``torch.utils.flop_counter.FlopCounterMode``: matrix products,
  convolutions, attention; 2 FLOPs per multiply-add; causal attention counted whole, as torch counts it);
- its bytes: every tensor it reads and writes, once (views move nothing; an embedding reads the rows it looks
  up, not its whole table);
- the tensor-parallel collectives it issues (``c10d``), forward and backward: the time model adds their
  transfers from the cluster's links (``tensor_comm_in_times`` false).

An operator's time is the roofline bound (Williams, Waterman and Patterson, "Roofline: an insightful visual
performance model", CACM 52(4), 2009): ``max(FLOPs / peak FLOP/s, bytes / peak memory bandwidth)``, with the
GPU's dense peak rate at the training precision's math and its memory bandwidth from the GPU catalogue
(plan/gpus.py, vendor datasheets). A layer's time is the sum over its operators (GPU kernels of one stream run one
after another). The efficiency factor is :data:`EFFICIENCY` = 1.0: no source gives a fraction of peak that holds
for every layer, GPU and size (Megatron-LM's 52% of peak on A100s, profiling/layer_costs.py, is one model's
end-to-end figure), so the estimate is the bound itself, not a guess at what a kernel achieves.

What it misses, so every figure is a LOWER bound on a measured one, or near it:

- kernel efficiency: real matrix products reach a fraction of peak, small ones far less; launch latency
  (microseconds per kernel) is not counted;
- fusion and caches: an operator is charged all its inputs and outputs (a fused kernel moves less; this one
  error makes an estimate higher, not lower), and what an L2 cache would serve again is read again;
- attention: a flash kernel skips about half of a causal attention's products, which torch's formula counts;
- communication: tensor-parallel all-reduces, pipeline transfers and the gradient sync come from the cluster's
  links by the time model (none overlapped with compute, except AMP's pipeline overlap), at their peak
  bandwidth, with the per-message latency of the cluster file if it gives one (else none);
- the optimizer step is its AdamW counted the same way (its bytes per parameter byte at the memory bandwidth);
  the per-iteration overhead (zero_grad, barriers, the host) is not estimated (0).

Counts are kept in the :class:`~hybridplan.profiling.stage_memo.StageMemo` of the simulated profile (the cache
folder's ``stages``) under the layer's signature, its position (first, last), input, micro-batch size, tensor degree
and precision, the model's configuration, torch's version and the code; they do not depend on the GPU, whose rates
are applied afterwards, so another GPU re-uses them.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hybridplan.errors import UsageError
from hybridplan.models.base import LayeredModel
from hybridplan.plan import Cluster
from hybridplan.plan.gpus import Precision, gpu_memory_bandwidth, gpu_peak_flops
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.stage_memo import StageMemo, code_digest
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable

__all__ = [
    "EFFICIENCY",
    "PeakRates",
    "peak_rates",
    "PassCounts",
    "LayerCounts",
    "count_pass",
    "count_layer",
    "estimate_tensor_degrees",
    "EstimatedTimes",
    "estimated_time_profile",
]

EFFICIENCY = 1.0
"""Fraction of the peak rates a layer is assumed to reach: 1.0, the roofline bound ([Note: the roofline
estimate]: no source gives one figure for every layer and GPU)."""

_MATH: dict[str, Precision] = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
"""The math a training precision's matrix products run in: fp32 on the CUDA cores (PyTorch leaves TF32 off for
matrix products by default: ``torch.backends.cuda.matmul.allow_tf32`` is False since 1.12), bf16 and fp16 on the
Tensor Cores."""

_ZERO_TRAFFIC = frozenset({
    torch.ops.aten._unsafe_view.default,  # a reshape that aliases (autograd's view of a matmul's output)
    torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default, torch.ops.aten.empty_strided.default,
    torch.ops.aten.new_empty.default, torch.ops.aten.new_empty_strided.default,  # allocate, write nothing
})
"""ATen operators that move no data besides the views (``OpOverload.is_view``)."""


# ---------------------------------------------------------------------------------------------------- rates
@dataclass(frozen=True, kw_only=True)
class PeakRates:
    """The rates an estimate runs at: one GPU of the catalogue, one precision."""

    gpu: str
    """The GPU's catalogue key, e.g. ``"h100-sxm"``."""
    math: Precision
    """The math whose peak ``flops`` is (the training precision's: :data:`_MATH`)."""
    flops: float
    """Dense peak FLOP/s in ``math`` (the datasheet's)."""
    memory_bandwidth: float
    """Peak memory bandwidth, bytes/s (the datasheet's)."""
    efficiency: float = EFFICIENCY

    def seconds(self, counts: PassCounts) -> float:
        """The roofline time of a pass: per operator ``max(FLOPs / rate, bytes / bandwidth)``, summed.

        Example:
            >>> r = PeakRates(gpu="x", math="bf16", flops=1e12, memory_bandwidth=1e9)
            >>> r.seconds(PassCounts(flops=(2e9, 0.0), bytes=(1e6, 3e6)))   # 2 ms compute + 3 ms memory
            0.005
        """
        rate = self.flops * self.efficiency
        return float(sum(max(f / rate, b / self.memory_bandwidth) for f, b in zip(counts.flops, counts.bytes)))

    def describe(self) -> str:
        """One line: the GPU, its rate at the math and its bandwidth."""
        return (f"{self.gpu} peak {self.flops / 1e12:g} TFLOP/s dense {self.math}, memory {self.memory_bandwidth / 1e9:g}"
                f" GB/s, efficiency {self.efficiency:g}")


def peak_rates(cluster: Cluster, precision: str) -> PeakRates:
    """The peak rates of ``cluster``'s GPU at ``precision`` (every device must be the same catalogue GPU).

    Raises:
        UsageError: for CPU devices, CUDA devices of no named GPU, a cluster of several GPUs, or a GPU whose
            datasheet gives no such rate: no peak rate is known, so no time can be estimated.
    """
    fix = ("name the GPU (--gpu NAME, 'hybridplan gpus' lists them; or gpu = \"...\" in the cluster file), or give"
           " measured layer times: --time-profile FILE, or --db FILE from 'hybridplan profile --time'")
    if precision not in _MATH:
        raise UsageError(f"no peak rate for precision {precision!r}", fix=f"use one of {', '.join(_MATH)}")
    gpus = sorted({d.gpu or "" for d in cluster.devices})
    kinds = sorted({d.type for d in cluster.devices})
    if gpus == [""]:
        what = "CPU devices" if kinds == ["cpu"] else f"{'/'.join(kinds)} devices of no named GPU"
        raise UsageError(f"estimating layer times needs the devices' peak FLOP rate and memory bandwidth, and none is"
                         f" known for {what}", fix=fix)
    if len(gpus) > 1 or len(kinds) > 1:
        raise UsageError(f"layer times are estimated for one GPU, and cluster {cluster.shape} has"
                         f" {', '.join(g or 'unnamed' for g in gpus)}",
                         fix="plan each kind of node on its own, or give measured layer times (--time-profile FILE)")
    gpu, math_ = gpus[0], _MATH[precision]
    flops, bandwidth = gpu_peak_flops(gpu, math_), gpu_memory_bandwidth(gpu)
    if flops is None or bandwidth is None:
        missing = " and ".join(w for w, v in ((f"{math_} FLOP rate", flops), ("memory bandwidth", bandwidth)) if v is None)
        raise UsageError(f"GPU {gpu!r} has no published {missing} in the catalogue, so its layer times cannot be"
                         " estimated", fix="use another --precision or GPU, or give --time-profile FILE")
    return PeakRates(gpu=gpu, math=math_, flops=flops, memory_bandwidth=bandwidth)


# ---------------------------------------------------------------------------------------------------- counting
@dataclass(frozen=True, kw_only=True)
class PassCounts:
    """A forward or backward pass, operator by operator: FLOPs and bytes read and written."""

    flops: tuple[float, ...]
    bytes: tuple[float, ...]
    collectives: int = 0
    """Tensor-parallel collectives the pass issued (all-reduces, all-gathers)."""

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops))

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes))

    def to_dict(self) -> dict[str, Any]:
        return {"flops": list(self.flops), "bytes": list(self.bytes), "collectives": self.collectives}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassCounts:
        return cls(flops=tuple(float(x) for x in data["flops"]), bytes=tuple(float(x) for x in data["bytes"]),
                   collectives=int(data["collectives"]))


@dataclass(frozen=True, kw_only=True)
class LayerCounts:
    """One layer's forward and backward passes at one micro-batch size and tensor degree."""

    forward: PassCounts
    backward: PassCounts

    def to_dict(self) -> dict[str, Any]:
        return {"forward": self.forward.to_dict(), "backward": self.backward.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerCounts:
        return cls(forward=PassCounts.from_dict(data["forward"]), backward=PassCounts.from_dict(data["backward"]))


def _tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a kernel touches of ``t``: a broadcast dimension (stride 0) is one element wide."""
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0) * t.element_size()


def _cpu_attention_flops() -> dict[Any, Any]:
    """FLOP formulas for the CPU attention kernels that fake CPU tensors dispatch to (torch 2.13 has formulas for
    the CUDA kernels only): the same attention, by torch's ``sdpa_flop_count`` / ``sdpa_backward_flop_count``."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(sdpa_flop_count(query, key, value))  # torch hands formulas the shapes

    def backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return int(sdpa_backward_flop_count(grad, query, key, value))

    return {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: forward,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


class _OpCounter(TorchDispatchMode):
    """Records every ATen operator's FLOPs (read off the enclosing ``FlopCounterMode``) and bytes, and counts the
    c10d collectives ([Note: the roofline estimate])."""

    def __init__(self, flop_counter: Any) -> None:
        super().__init__()
        self.flop_counter = flop_counter
        self.flops: list[float] = []
        self.bytes: list[float] = []
        self.collectives = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        before = self.flop_counter.get_total_flops()
        out = func(*args, **kwargs)
        if func.namespace == "c10d":
            self.collectives += 1
        if func.namespace != "aten" or func.is_view or func in _ZERO_TRAFFIC:
            return out
        written = sum(_tensor_bytes(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        if func is torch.ops.aten.embedding.default:  # reads the rows it looks up (as many as it writes), and the ids
            read = written + _tensor_bytes(args[1])
        else:
            read = sum(_tensor_bytes(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        self.flops.append(float(self.flop_counter.get_total_flops() - before))
        self.bytes.append(float(read + written))
        return out


def count_pass(run: Callable[[], Any]) -> tuple[Any, PassCounts]:
    """Run ``run()`` (on fake or real tensors) and count its operators; returns its result and the counts.

    Example:
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> with FakeTensorMode():
        ...     a, b = torch.empty(8, 16), torch.empty(16, 4)
        ...     _, counts = count_pass(lambda: a @ b)
        >>> counts.flops, counts.bytes   # 2 x 8 x 16 x 4; (8x16 + 16x4 + 8x4) x 4 bytes
        ((1024.0,), (896.0,))
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as flops, _OpCounter(flops) as ops:
        result = run()
    return result, PassCounts(flops=tuple(ops.flops), bytes=tuple(ops.bytes), collectives=ops.collectives)


def count_layer(model: LayeredModel, index: int, module: torch.nn.Module, micro_batch_size: int,
                precision: str) -> LayerCounts:
    """Layer ``index`` of ``model``, built as ``module`` (inside a ``FakeTensorMode``, runtime/split_layers.py),
    run forward and backward on ``micro_batch_size`` samples in ``precision``; the last layer with the loss."""
    from hybridplan.models.boundaries import boundary_specs
    from hybridplan.runtime.precision import cast_module, compute_dtype

    dtype = compute_dtype(precision)
    if dtype != torch.float32:
        cast_module(module, dtype)
    spec = boundary_specs(model)[index]
    x = torch.empty((micro_batch_size, *spec.sample_shape), dtype=dtype if spec.dtype.is_floating_point else spec.dtype)
    if x.is_floating_point() and index > 0:  # a later stage's first layer sends the gradient of its input back
        x.requires_grad_(True)
    last = index == model.num_layers - 1
    target = model.make_batch(micro_batch_size, torch.Generator().manual_seed(0))[1] if last else None

    def forward() -> torch.Tensor:
        y = module(x)
        return model.loss(y.float(), target) if target is not None else y

    y, fwd = count_pass(forward)
    _, bwd = count_pass(lambda: y.backward(None if last else torch.empty_like(y)))
    return LayerCounts(forward=fwd, backward=bwd)


def _count_optimizer(model: LayeredModel, index: int, module: torch.nn.Module, precision: str,
                     device_type: str) -> tuple[PassCounts, float]:
    """The runtime's optimizer step over layer ``index``'s parameters (runtime/precision.py ``build_optimizer``:
    AdamW, with fp32 masters in mixed precision), counted; and the layer's parameter bytes in the compute dtype."""
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.precision import build_optimizer

    optimizer = build_optimizer(module, precision=precision, learning_rate=RunConfig.learning_rate,  # the defaults
                                weight_decay=RunConfig.weight_decay, loss_scale=None, device_type=device_type)
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.empty_like(p)
    _, step = count_pass(optimizer.step)
    return step, float(sum(p.numel() * p.element_size() for p in params))


def estimate_tensor_degrees(model: LayeredModel, devices_per_node: int) -> tuple[int, ...]:
    """1, and every power of two up to a node's devices at which some layer splits: the degrees the simulated
    memory profile has (workflows/simulated_profile.py), which a tensor group within a node may take."""
    out, t = [1], 2
    while t <= devices_per_node:
        if any(model.tensor_parallel_problem(layer, t) is None for layer in range(model.num_layers)):
            out.append(t)
        t *= 2
    return tuple(out)


# ---------------------------------------------------------------------------------------------------- the profile
@dataclass(frozen=True)
class EstimatedTimes:
    """An estimated time profile and how it was made."""

    profile: TimeProfile
    rates: PeakRates
    counted: int
    """(layer, micro-batch size, tensor degree) passes counted by this call."""
    reused: int
    """Passes read from the memo (identical layers, or an earlier command)."""
    seconds: float

    def describe(self) -> str:
        """What the times are, for the output: ESTIMATED, from what, at which rates."""
        return (f"iteration times ESTIMATED, not measured: each layer's FLOPs and bytes counted on fake tensors, timed"
                f" at the roofline of {self.rates.describe()} (a lower bound: no kernel efficiency, launch or"
                " overlap; docs/instant-planning.md); links from the cluster's bandwidths")


_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
"""This module's code, part of every memo key (a change to how passes are counted changes the counts)."""


def _identity(model: LayeredModel, index: int, micro_batch_size: int, degree: int, precision: str) -> dict[str, Any] | None:
    """What a layer's counts are a function of ([Note: the roofline estimate]); None for a layer of no signature."""
    from hybridplan.models.boundaries import boundary_specs

    signature = model.layer_signature(index)
    if signature is None:
        return None
    return {"kind": "estimated layer counts", "code": code_digest(), "estimator": _SOURCE,
            "model": {k: v for k, v in model.config().items() if k != "name"}, "signature": signature,
            "first": index == 0, "last": index == model.num_layers - 1, "input": repr(boundary_specs(model)[index]),
            "micro_batch_size": micro_batch_size, "tensor_degree": degree, "precision": precision}


def _representatives(model: LayeredModel) -> dict[int, int]:
    """Each layer's stand-in: the first layer of its memo identity (itself when it has no signature)."""
    first: dict[str, int] = {}
    out = {}
    for index in range(model.num_layers):
        key = repr(_identity(model, index, 1, 1, "")) if model.layer_signature(index) is not None else f"#{index}"
        out[index] = first.setdefault(key, index)
    return out


def _counts(model: LayeredModel, layers: Iterable[int], degree: int, sizes: Sequence[int], precision: str,
            memo: StageMemo) -> tuple[dict[tuple[int, int], LayerCounts], int]:
    """Counts of ``layers`` at ``degree`` for every size, from the memo or counted; and how many were counted."""
    from hybridplan.runtime.split_layers import split_layers

    out: dict[tuple[int, int], LayerCounts] = {}
    counted = 0
    for index in layers:
        for b in sizes:
            identity = _identity(model, index, b, degree, precision)

            def count(index: int = index, b: int = b) -> dict[str, Any]:
                nonlocal counted
                counted += 1
                # built as the runtime builds it: rank 0 of a tensor stage, on a fake process group (held while the
                # generator is open: the layer is counted inside it)
                for module in split_layers(model, "tensor", degree, [index]):
                    if module is not None:
                        return count_layer(model, index, module, b, precision).to_dict()
                raise UsageError(f"layer {index} of {model.name} cannot be split {degree} ways")  # asked only for split ones

            data = count() if identity is None else memo.cached(identity, count)
            out[(index, b)] = LayerCounts.from_dict(data)
    return out, counted


def _optimizer_rate(model: LayeredModel, index: int, precision: str, device_type: str, rates: PeakRates,
                    memo: StageMemo) -> float:
    """Seconds of the optimizer step per parameter byte, from the step over layer ``index`` counted."""
    from hybridplan.runtime.split_layers import split_layers

    def count() -> dict[str, Any]:
        for module in split_layers(model, "none", 1, [index]):
            if module is not None:
                step, nbytes = _count_optimizer(model, index, module, precision, device_type)
                return {"step": step.to_dict(), "parameter_bytes": nbytes}
        raise UsageError(f"layer {index} of {model.name} could not be built")  # split_layers builds every layer at 1

    layer = _identity(model, index, 1, 1, precision)
    data = count() if layer is None else memo.cached(
        {**{k: v for k, v in layer.items() if k not in ("micro_batch_size", "tensor_degree")},
         "kind": "estimated optimizer step", "device_type": device_type}, count)
    return rates.seconds(PassCounts.from_dict(data["step"])) / data["parameter_bytes"] if data["parameter_bytes"] else 0.0


def estimated_time_profile(model: LayeredModel, cluster: Cluster, *, precision: str, micro_batch_sizes: Sequence[int],
                           tensor_degrees: Sequence[int] | None = None, memo: StageMemo | None = None,
                           progress: Callable[[str], None] | None = None) -> EstimatedTimes:
    """A time profile of ``model`` on ``cluster``'s GPU with every layer's times estimated ([Note: the roofline
    estimate]), keyed by the cluster's device type, at every micro-batch size of ``micro_batch_sizes`` (those that
    are multiples of the model's ``sample_granularity``) and tensor degree (default :func:`estimate_tensor_degrees`).

    A layer that cannot be split at a degree gets its degree-1 times there, as a measured profile does ([Note: layers
    that cannot be split] in profiling/timing.py): no valid plan puts it in such a stage.

    Args:
        memo: where counts are kept and found (default: this call only); identical layers are counted once.
        progress: one line per event.

    Raises:
        UsageError: when the cluster's peak rates are unknown (:func:`peak_rates`: checked before any counting), or
            no micro-batch size is a positive multiple of the model's sample granularity.
    """
    from dataclasses import replace

    from hybridplan.profiling.timing import layer_infos

    rates = peak_rates(cluster, precision)
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    memo = memo if memo is not None else StageMemo()
    g = model.sample_granularity
    sizes = sorted({int(b) for b in micro_batch_sizes if b >= 1 and b % g == 0})
    if not sizes:
        raise UsageError(f"no micro-batch size among {sorted(micro_batch_sizes)} is a multiple of {g}, the samples"
                         f" {model.name} groups", fix=f"use a global batch that is a multiple of {g}")
    degrees = tuple(sorted(set(tensor_degrees))) if tensor_degrees is not None else estimate_tensor_degrees(
        model, cluster.devices_per_node)
    stand_in = _representatives(model)
    distinct = sorted(set(stand_in.values()))
    say(f"estimating layer times of {model.name} on {rates.gpu}: {len(distinct)} distinct of {model.num_layers} layers,"
        f" micro-batch sizes {sizes}, tensor degrees {list(degrees)}")
    hits = memo.hits
    counts: dict[int, dict[tuple[int, int], LayerCounts]] = {}
    counted = 0
    for t in degrees:
        split = [i for i in distinct if t == 1 or model.tensor_parallel_problem(i, t) is None]
        counts[t], n = _counts(model, split, t, sizes, precision, memo)
        counted += n
    infos = layer_infos(model, precision)
    layers = []
    for index, info in enumerate(infos):
        at = next((counts[t][(stand_in[index], sizes[0])] for t in degrees if t > 1 and (stand_in[index], sizes[0])
                   in counts[t]), None)
        collectives = (at.forward.collectives, at.backward.collectives) if at is not None else (0, 0)
        layers.append(replace(info, tensor_parallel_allreduces=collectives))
    device_type = cluster.devices[0].type
    heaviest = max(distinct, key=lambda i: infos[i].parameter_bytes)
    step = _optimizer_rate(model, heaviest, precision, device_type, rates, memo)
    tables = []
    for t in degrees:
        for b in sizes:
            passes = [counts[t].get((stand_in[i], b)) or counts[1][(stand_in[i], b)] for i in range(model.num_layers)]
            tables.append(TimingTable(device_type=device_type, tensor_degree=t, micro_batch_size=b,
                                      forward_s=tuple(rates.seconds(c.forward) for c in passes),
                                      backward_s=tuple(rates.seconds(c.backward) for c in passes),
                                      optimizer_s_per_byte=step, overhead_s=None))
    profile = TimeProfile(model=model.name, layers=tuple(layers), timings=tuple(tables), tensor_comm_in_times=False,
                          source=f"ESTIMATED, not measured: roofline of FLOPs and bytes counted on fake tensors at"
                                 f" {rates.describe()} (hybridplan.profiling.estimated_times)")
    seconds = time.perf_counter() - started
    reused = memo.hits - hits
    say(f"  layer times estimated: {counted} passes counted, {reused} read from the cache, in {seconds:.1f} s")
    return EstimatedTimes(profile, rates, counted, reused, seconds)
