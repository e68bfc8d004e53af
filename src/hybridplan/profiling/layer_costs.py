"""Per-layer costs the baseline partitioners need, computed on fake tensors (no device, no data).

The partitioners people use today weigh each layer by one number (search/baselines.py): torchgpipe by its
forward time or its memory growth, DeepSpeed by its parameter count. :func:`measure_layer_costs` computes
them for any zoo or user model in one pass over its layers, each run forward on ``FakeTensor`` inputs of ONE
sample, so paper-size models cost seconds and no memory:

- ``parameters``: trainable parameter count (DeepSpeed ``partition_method="parameters"``);
- ``forward_flops_per_sample``: torch's ``FlopCounterMode`` count of the forward (matmuls, convolutions,
  attention); the stand-in for a measured time where no time profile exists ([Note: FLOPs for time]);
- ``latent_bytes_per_sample``: the bytes the forward leaves allocated (its output and what autograd saved
  for the backward), counted by the runtime's exact storage tracker. It is what torchgpipe's
  ``profile_sizes`` measures with ``torch.cuda.memory_allocated`` around each layer for a batch of one
  sample (``torchgpipe/balance/profile.py``);
- ``output_bytes_per_sample``: the bytes that cross a stage boundary placed after the layer.

[Note: FLOPs for time] torchgpipe's ``balance_by_time`` and the throughput-optimal plan need per-layer
times. Measured times come from a time profile of the model on the target device; where none exists (no
GPU was available to this project's benchmarks) the times are modelled as ``FLOPs / (peak x efficiency)``
with a backward of 2 x forward (the standard count: two matmuls per forward matmul, as AMP's
``cost_homo.py`` assumes). :func:`flop_time_profile` builds such a
:class:`~hybridplan.profiling.time_profile.TimeProfile`; its ``source`` says it is a FLOP model, not a
measurement. A block partition depends only on the ratios of the costs, so for ``balance_by_time`` the
FLOP stand-in is exact whenever time is proportional to FLOPs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridplan.errors import UsageError
from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import (
    ColumnParallel,
    CopyInput,
    GatherOutput,
    ReduceOutput,
    RowParallel,
    VocabParallelEmbedding,
)
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.timing_table import TimingTable

__all__ = [
    "LayerCost",
    "measure_layer_costs",
    "baseline_layer_costs",
    "flop_time_profile",
    "A100_PEAK_FLOPS",
    "MEGATRON_A100_EFFICIENCY",
    "TORCHGPIPE_PARAM_SCALE",
]

A100_PEAK_FLOPS: dict[str, float] = {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12}
"""Dense Tensor Core peak of an A100 (NVIDIA A100 datasheet): 312 TFLOP/s in bf16/fp16, 156 TFLOP/s in TF32,
which PyTorch and JAX use for fp32 convolutions and (JAX) matmuls on Ampere by default."""

MEGATRON_A100_EFFICIENCY = 0.52
"""Achieved fraction of peak: Megatron-LM trains GPT on A100s at "52% of theoretical peak" (Narayanan et al.,
SC'21, abstract). Used for every layer of the FLOP stand-in; real layers vary around it."""

TORCHGPIPE_PARAM_SCALE = 2.0
"""torchgpipe ``balance_by_size``'s default ``param_scale`` (parameters + SGD momentum)."""

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LayerCost:
    """One layer's static costs (module docstring)."""

    name: str
    parameters: int
    parameter_bytes: int
    """Bytes of the parameters in the compute dtype (also the gradient bytes a data-parallel all-reduce sends)."""
    forward_flops_per_sample: float
    latent_bytes_per_sample: int
    output_bytes_per_sample: int
    tensor_parallel_allreduces: tuple[int, int] = (0, 0)
    """(forward, backward) collectives of the layer's tensor-parallel split, counted from its rules."""
    tensor_splittable: bool = False


def _tensor_collectives(model: LayeredModel, index: int) -> tuple[tuple[int, int], bool]:
    """(forward, backward) collective counts of the layer's Megatron split: row-parallel, vocabulary-parallel,
    reduce and gather rules communicate forward; column-parallel and copy rules backward."""
    plan = model.tensor_parallel_plan(index)
    if plan is None:
        return (0, 0), False
    forward = sum(isinstance(r, (RowParallel, VocabParallelEmbedding, ReduceOutput, GatherOutput)) for _, r in plan.rules)
    backward = sum(isinstance(r, (ColumnParallel, CopyInput)) for _, r in plan.rules)
    return (forward, backward), True


def _cpu_attention_flops() -> dict[Any, Any]:
    """torch's flop counter has formulas for the CUDA attention kernels but not for the CPU one that fake
    tensors on the CPU dispatch to (``_scaled_dot_product_flash_attention_for_cpu``, torch 2.13): count it as
    the same attention (``sdpa_flop_count``: 2 matmuls of ``b h s s d``, 2 FLOPs per multiply-add)."""
    from torch.utils.flop_counter import sdpa_flop_count

    def cpu_flash(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(query, key, value)

    return {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash}


def measure_layer_costs(model: LayeredModel, *, precision: str = "fp32") -> list[LayerCost]:
    """Every layer's costs for one sample, forward on fake tensors in ``precision`` (module docstring).

    A model whose layers need several samples at once (``sample_granularity``, a GShard MoE's groups) runs
    that many, and the costs are divided by it.

    Raises:
        UsageError: for an unknown precision.

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> costs = measure_layer_costs(get_model("gpt-tiny"))
        >>> len(costs), costs[0].name, costs[1].forward_flops_per_sample > 0
        (10, 'embed', True)
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from hybridplan.models.base import build_layers
    from hybridplan.runtime.memory import StorageTracker
    from hybridplan.runtime.precision import cast_module

    if precision not in _DTYPES:
        raise UsageError(f"unknown precision {precision!r}", fix=f"use one of {list(_DTYPES)}")
    dtype = _DTYPES[precision]
    out: list[LayerCost] = []
    with FakeTensorMode():
        n = model.sample_granularity  # a GShard MoE routes groups of several samples
        x, _ = model.make_batch(n, torch.Generator().manual_seed(0))
        if x.is_floating_point():
            x = x.to(dtype)
        for i in range(model.num_layers):
            (layer,) = build_layers(model, i, i + 1, seed=0)
            if dtype != torch.float32:
                cast_module(layer, dtype)  # not layer.to(dtype): it cannot swap fake parameters
            params = [p for p in layer.parameters() if p.requires_grad]
            x = x.detach().requires_grad_(x.is_floating_point())
            tracker = StorageTracker()
            with tracker, FlopCounterMode(display=False, custom_mapping=_cpu_attention_flops()) as flops:
                y = layer(x)
                latent = tracker.current
            collectives, splittable = _tensor_collectives(model, i)
            out.append(LayerCost(
                name=model.layer_name(i),
                parameters=sum(p.numel() for p in params),
                parameter_bytes=sum(p.numel() * p.element_size() for p in params),
                forward_flops_per_sample=float(flops.get_total_flops()) / n,
                latent_bytes_per_sample=int(latent) // n,
                output_bytes_per_sample=y.numel() * y.element_size() // n,
                tensor_parallel_allreduces=collectives,
                tensor_splittable=splittable,
            ))
            x = y
    return out


def baseline_layer_costs(costs: Sequence[LayerCost], baseline: str, *, microbatch_size: int,
                         param_scale: float = TORCHGPIPE_PARAM_SCALE) -> list[float] | None:
    """The ``layer_costs`` that :func:`~hybridplan.search.baselines.baseline_plan` needs for ``baseline``
    (``None`` for "equal"): FLOPs for torchgpipe-time ([Note: FLOPs for time]), torchgpipe's latent bytes
    x micro-batch samples + parameter bytes x ``param_scale`` for torchgpipe-size, parameters for DeepSpeed.

    Raises:
        UsageError: for an unknown baseline.
    """
    if baseline == "equal":
        return None
    if baseline == "torchgpipe-time":
        return [c.forward_flops_per_sample for c in costs]
    if baseline == "torchgpipe-size":
        return [float(c.latent_bytes_per_sample * microbatch_size + c.parameter_bytes * param_scale) for c in costs]
    if baseline == "deepspeed-parameters":
        return [c.parameters for c in costs]
    raise UsageError(f"unknown baseline {baseline!r}",
                     fix="use equal, torchgpipe-time, torchgpipe-size or deepspeed-parameters")


def flop_time_profile(model: LayeredModel, costs: Sequence[LayerCost], *, precision: str, device_type: str = "A100",
                      peak_flops: float | None = None, efficiency: float = MEGATRON_A100_EFFICIENCY,
                      tensor_degrees: Sequence[int] = (1, 2, 4)) -> TimeProfile:
    """A time profile whose layer times are FLOP counts at ``peak_flops x efficiency`` ([Note: FLOPs for time]).

    Times are for a micro-batch of one sample (the profile scales them linearly in the samples). At tensor
    degree ``t`` a splittable layer's FLOPs divide by ``t``; a layer that cannot be split keeps its time (it
    can only sit in a tensor stage the memory model rejects). Tensor-parallel communication is added by the
    time model from the collective counts (``tensor_comm_in_times`` false).

    Raises:
        UsageError: for an unknown precision or a non-positive rate.
    """
    if precision not in A100_PEAK_FLOPS and peak_flops is None:
        raise UsageError(f"unknown precision {precision!r}", fix=f"use one of {list(A100_PEAK_FLOPS)}")
    rate = (A100_PEAK_FLOPS[precision] if peak_flops is None else peak_flops) * efficiency
    if not rate > 0:
        raise UsageError(f"the FLOP rate must be positive, got {rate!r}")
    layers = tuple(
        LayerInfo(name=c.name, activation_bytes_per_sample=float(c.output_bytes_per_sample),
                  parameter_bytes=float(c.parameter_bytes), tensor_parallel_allreduces=c.tensor_parallel_allreduces)
        for c in costs
    )
    timings = []
    for t in tensor_degrees:
        forward = tuple(c.forward_flops_per_sample / (t if c.tensor_splittable else 1) / rate for c in costs)
        timings.append(TimingTable(device_type=device_type, tensor_degree=t, micro_batch_size=1,
                                   forward_s=forward, backward_s=tuple(2.0 * f for f in forward)))
    return TimeProfile(
        model=model.name, layers=layers, timings=tuple(timings), tensor_comm_in_times=False,
        source=f"FLOP model, not a measurement: forward FLOPs / ({rate:.3g} FLOP/s = peak x {efficiency}),"
               " backward = 2 x forward (hybridplan.profiling.layer_costs)",
    )
