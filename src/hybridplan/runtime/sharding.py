"""ZeRO sharding of a data-parallel stage (a plan stage's ``"zero"`` key), with PyTorch's own pieces.

ZeRO (Rajbhandari et al., SC'20) removes the replicas' duplicated training state, one kind per level,
over the stage's data-parallel group of ``d`` devices:

- **ZeRO-1**, optimizer state: :class:`torch.distributed.optim.ZeroRedundancyOptimizer`. Each replica
  keeps the AdamW state of its share of the parameters (whole parameters, balanced by size, so a stage
  of few large parameters shards unevenly), steps them and broadcasts them to the others. Gradients
  are still all-reduced whole (runtime/executor.py), as in ZeRO-1. On a data x tensor stage it shards the
  state of each tensor rank's shards over that rank's data group (:class:`ZeroOneOptimizer`). In mixed
  precision the fp32 master copies are sharded with the moments (below).
- **ZeRO-2**, + gradients: FSDP2 :func:`~torch.distributed.fsdp.fully_shard` per layer with
  ``reshard_after_forward=False`` (FSDP's SHARD_GRAD_OP, which PyTorch's FSDP documentation likens to
  ZeRO-2). Gradients are reduce-scattered after each micro-batch's backward and accumulated sharded;
  optimizer state follows the sharded parameters. A layer's gathered parameters stay from its forward
  to its backward. Unlike DeepSpeed's ZeRO-2, parameters are also sharded between iterations (FSDP
  frees the gathered copy after the backward), so what persists from one iteration to the next is
  ``1/d`` of everything; the peak holds the gathered layers of the micro-batches in flight.
- **ZeRO-3**, + parameters: ``fully_shard`` per layer with ``reshard_after_forward=True`` (FULL_SHARD):
  a layer's parameters are all-gathered before its forward and again before its backward, and freed
  after each.

On a data x tensor stage, ZeRO-2/3 compose FSDP2 with the tensor split as PyTorch composes them (FSDP + TP,
"2-D"): the stage's ranks form one 2-D ``("data", "tensor")`` ``DeviceMesh`` (runtime/rank.py
``stage_meshes``), the tensor-parallel rules (models/tensor_parallel.py) place their DTensor shards on its
tensor dimension, and ``fully_shard`` over its data dimension shards each tensor rank's local shard along
dim 0 over that rank's data group (a parameter sharded on dim 0 by both gets FSDP's ``_StridedShard``
placement); parameters the tensor split replicates (norms, a row-parallel bias) are sharded over the data
group alone. Each device then keeps ``1/d`` of its tensor rank's training state.

Each layer with parameters is its own FSDP unit (as torchtitan wraps each transformer block), so at
most a layer's parameters are gathered at once per micro-batch in flight, and the stage module is the
root unit. Gradients are summed, not averaged (divide factor 1): the executor already weights each
replica's loss by its share of the rows, as for the all-reduce of an unsharded data-parallel stage.

In mixed precision (runtime/precision.py: low-precision parameters and gradients, fp32 master copies and
moments), ZeRO-1 shards the master copies with the moments, as ZeRO counts them (optimizer state, section
3.1 of the paper) and DeepSpeed's ZeRO-1 shards them: ``ZeroRedundancyOptimizer``'s local optimizer is
precision.py's ``MixedPrecisionAdamW`` over the rank's share, whose masters are kept from the fp32 values the
stage was built with (:func:`zero1_optimizer`); it steps them, copies them into the low-precision parameters,
and ``ZeroRedundancyOptimizer`` broadcasts those.

ZeRO-2/3 in mixed precision use FSDP2's ``MixedPrecisionPolicy`` instead of precision.py's master copies
(:func:`shard_stage`): the stage stays fp32 and sharded (its shards are the masters, 4 bytes per element per
device over ``d``), each layer is all-gathered in the low dtype, and the gradients are reduce-scattered in it
and accumulated as fp32 shards, so a device keeps ``(4 + 4 + 8) / d`` bytes per element between iterations
against precision.py's unsharded ``2 + 2 + 12``.

What this runtime does not shard yet (refused by runtime/config.py with the reason): PipeDream-2BW (its stale
weight version is a second full copy of the parameters).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from hybridplan.runtime.resize_watch import watch_resizes

__all__ = ["shard_stage", "shard_layer", "zero1_optimizer", "ZeroOneOptimizer", "optimizer_state", "reduces_gradients", "SettledReduceScatter"]

_SETTLE_LIMIT_S = 1.0
"""How long a reduce-scatter waits for the transport to let go of its buffers (microseconds in practice)."""


def _use_count(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def _settle(tensors: tuple[torch.Tensor, ...], before: tuple[int, ...]) -> None:
    deadline = time.monotonic() + _SETTLE_LIMIT_S
    while tuple(_use_count(t) for t in tensors) > before and time.monotonic() < deadline:
        time.sleep(0)


class _SettledComm:
    def __init__(self, meter: Any) -> None:
        self.meter = meter
        """The rank's memory meter: gloo's own temporaries inside a collective (a reduce-scatter allocates a
        copy of its input in ``wait()``, freed from its worker thread) are the transport's, not the model's
        (NCCL keeps its buffers outside the caching allocator too), so they are not counted."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class SettledAllGather(_SettledComm):
    """FSDP2's all-gather, synchronous, returning once the transport lets go of its buffers (see
    :class:`SettledReduceScatter`); FSDP waits on a ``None`` work as on a finished one."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        import torch.distributed as dist

        tensors = (output_tensor, input_tensor)
        before = tuple(_use_count(t) for t in tensors)
        with self.meter.paused():
            dist.all_gather_single(output_tensor, input_tensor, group=group)
        _settle(tensors, before)


class SettledReduceScatter(_SettledComm):
    """FSDP2's reduce-scatter, returning only once the transport holds no reference to its buffers.

    [Note: deterministic frees] A gloo collective runs on a worker thread, which drops its references to
    the input and output a moment AFTER the caller's ``wait()`` returns. When FSDP then drops the last
    Python reference first (it does at the end of a backward: the last layer's reduce-scatter input),
    the buffer is freed later, from the worker thread, and the memory tracker (runtime/memory.py) would
    see a level that depends on thread timing. Waiting here until the buffers' use counts are back to
    what they were before the call makes every free happen where the program drops it, as on a GPU.
    Used through ``FSDPModule.set_custom_reduce_scatter`` (PyTorch's own extension point).
    """

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        import torch.distributed as dist

        tensors = (output_tensor, input_tensor)
        before = tuple(_use_count(t) for t in tensors)
        with self.meter.paused():
            dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group)  # synchronous
        _settle(tensors, before)


def shard_stage(module: nn.Module, zero: int, dp_mesh: Any, *, settle_for: Any = None, precision: str = "fp32",
                loss_scale: float = 1.0, reduce: str = "compute") -> None:
    """Make ``module`` (a stage's ``nn.Sequential``) FSDP2 units for ZeRO-2 (``zero=2``) or ZeRO-3 (``zero=3``).

    In place: each layer with parameters, then the stage, become ``FSDPModule`` s over ``dp_mesh`` (the
    1-D ``DeviceMesh`` of the stage's data group, made outside the memory meter: its rank table is host
    bookkeeping, not device memory); their parameters become DTensors sharded along dim 0 (padded to a
    multiple of ``d``).

    ``settle_for``: a memory meter; FSDP's collectives then run through :class:`SettledAllGather` and
    :class:`SettledReduceScatter`, so the exact tracker's count does not depend on thread timing (the gloo
    runs the tracker measures; a CUDA run measured by the allocator keeps FSDP's own overlapped collectives).

    ``precision``: mixed precision ("bf16", "fp16") through FSDP2's ``MixedPrecisionPolicy``: the sharded fp32
    parameters are the master copies (the stage is built and stepped in fp32), all-gathered into the low dtype
    for compute, and the gradients are reduce-scattered in the low dtype (as runtime/precision.py reduces them)
    and kept as fp32 shards (``reduce="fp32"``: reduce-scattered in fp32, torchtitan's way). ``loss_scale``: fp16's static loss scale, divided out of every reduce-scattered
    gradient (FSDP's gradient divide factor; a power of two, so the division is exact).
    """
    if zero not in (2, 3):
        raise ValueError(f"shard_stage shards parameters for ZeRO-2 and ZeRO-3, not ZeRO-{zero}")
    from torch.distributed.fsdp import FSDPModule, fully_shard

    watch_resizes()  # the tracker re-measures gathered parameters after FSDP2's resizes only (runtime/resize_watch.py)
    for layer in module.children():
        if not isinstance(layer, FSDPModule):  # (not sharded as it was built: build_stage_module's each_layer)
            shard_layer(layer, zero, dp_mesh, precision=precision, reduce=reduce)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=zero == 3, mp_policy=_policy(precision, reduce))
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(loss_scale)
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM; a factor of 1 needs no scaling
            if settle_for is not None:
                unit.set_custom_all_gather(SettledAllGather(settle_for))  # type: ignore[arg-type]  # duck-typed Comm
                unit.set_custom_reduce_scatter(SettledReduceScatter(settle_for))  # type: ignore[arg-type]


def shard_layer(layer: nn.Module, zero: int, dp_mesh: Any, *, precision: str = "fp32", reduce: str = "compute") -> None:
    """One layer of a ZeRO-2 (``zero=2``) or ZeRO-3 (``zero=3``) stage as its FSDP2 unit over ``dp_mesh``, in place
    (nothing for a layer without trainable parameters): :func:`shard_stage`'s per-layer units, made by
    ``build_stage_module`` as each layer is built ([Note: a layer is sharded before the next is built] in
    runtime/stage.py), so that the device never holds the stage's whole parameters; :func:`shard_stage` then
    makes the stage's own unit."""
    if zero not in (2, 3):
        raise ValueError(f"shard_layer shards parameters for ZeRO-2 and ZeRO-3, not ZeRO-{zero}")
    from torch.distributed.fsdp import fully_shard

    watch_resizes()
    if any(p.requires_grad for p in layer.parameters()):
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=zero == 3, mp_policy=_policy(precision, reduce))


def _policy(precision: str, reduce: str = "compute") -> Any:
    """FSDP2's mixed precision policy for ``precision``: the low dtype for compute, and for gradient reduction
    unless ``reduce`` is "fp32" (runtime/precision.py ``FsdpReduce``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from hybridplan.runtime.precision import compute_dtype

    low = compute_dtype(precision)
    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if reduce == "fp32" else low)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind ``t``: a DTensor's local shard (sharing its storage), or ``t``."""
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


class ZeroOneOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``ZeroRedundancyOptimizer`` (AdamW inside) over the *local* tensors of the stage's parameters.

    A tensor-parallel parameter is a DTensor, which ``ZeroRedundancyOptimizer`` cannot broadcast; but the data
    group holds the same tensor rank of every replica (runtime/rank.py), so its members hold the same shard,
    and sharding the optimizer state of the shards over the data group is exactly ZeRO-1 of a data x tensor
    stage (Megatron's distributed optimizer does the same per tensor rank). The optimizer therefore sees a
    leaf view of each parameter's local tensor (same storage, so its in-place update and the broadcast that
    follows are the parameter's) and, at each step, the local tensor of its gradient. A plain parameter is
    its own local tensor.
    """

    def __init__(self, params: list[torch.Tensor], dp_group: Any, *, learning_rate: float, weight_decay: float,
                 foreach: bool, masters: list[torch.Tensor] | None = None, loss_scale: float = 1.0,
                 fused: bool = False) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self._params = params
        self._views = [_local(p).detach() for p in params]
        super().__init__(self._views, {"lr": learning_rate})
        if masters is None:
            how = {"fused": True} if fused else {"foreach": foreach}  # runtime/precision.py: [Note: the AdamW step,
            # multi-tensor or fused]
            self.optim = ZeroRedundancyOptimizer(self._views, optimizer_class=torch.optim.AdamW, process_group=dp_group,
                                                 lr=learning_rate, weight_decay=weight_decay, **how)
            return
        by_view = {id(v): _local(m) for v, m in zip(self._views, masters, strict=True)}
        self.optim = ZeroRedundancyOptimizer(self._views, optimizer_class=_adamw_over_masters(by_view),
                                             process_group=dp_group, lr=learning_rate, weight_decay=weight_decay,
                                             loss_scale=loss_scale, fused=fused)
        by_view.clear()  # the local optimizer holds its share's masters; the others' are freed

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params:
            p.grad = None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for p, v in zip(self._params, self._views, strict=True):
            v.grad = None if p.grad is None else _local(p.grad)
            buffer = getattr(p, "main_grad", None)  # an fp32 gradient buffer (runtime/grad_buffers.py)
            if buffer is not None:
                v.main_grad = _local(buffer)  # type: ignore[attr-defined]  # what MixedPrecisionAdamW reads
        self.optim.step()
        for v in self._views:
            v.grad = None


def _adamw_over_masters(masters: dict[int, torch.Tensor]) -> Any:
    """A local-optimizer constructor for ``ZeroRedundancyOptimizer``: runtime/precision.py's ``MixedPrecisionAdamW``
    over the low-precision parameters of this rank's share (the parameter groups it is given), each with its
    fp32 master from ``masters`` (keyed by the parameter's ``id``)."""
    from hybridplan.runtime.precision import MixedPrecisionAdamW

    def build(params: list[Any], **options: Any) -> MixedPrecisionAdamW:
        flat = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
        return MixedPrecisionAdamW([(p, masters[id(p)]) for p in flat], **options)

    return build


def zero1_optimizer(module: nn.Module, dp_group: Any, *, learning_rate: float, weight_decay: float,
                    foreach: bool, precision: str = "fp32", loss_scale: float | None = None,
                    adamw: str = "default", partition: str = "tensors") -> torch.optim.Optimizer:
    """The stage's AdamW with its state sharded over ``dp_group`` (ZeRO-1; see :class:`ZeroOneOptimizer`).

    In mixed precision it casts ``module`` (built in fp32) to the low dtype as runtime/precision.py does, and the
    fp32 master copies, which ZeRO counts as optimizer state (Rajbhandari et al., section 3.1), are sharded with
    the moments: each replica keeps the masters of its share only, steps them and broadcasts the low-precision
    parameters (DeepSpeed's ZeRO-1 does the same). ``adamw="fused"``: each share steps with torch's fused AdamW.
    ``partition="flat"``: each replica's share is an equal range of the flattened parameters, not whole tensors
    (runtime/flat_zero1.py)."""
    from hybridplan.runtime.flat_zero1 import FlatZeroOneOptimizer
    from hybridplan.runtime.precision import cast_module, compute_dtype, loss_scale_of

    fused = adamw == "fused"
    if partition == "flat":
        params = [p for p in module.parameters() if p.requires_grad]
        if precision == "fp32":
            return FlatZeroOneOptimizer(params, dp_group, learning_rate=learning_rate, weight_decay=weight_decay,
                                        fused=fused, foreach=foreach)
        cast = [(p, m) for p, m in cast_module(module, compute_dtype(precision)) if p.requires_grad]
        return FlatZeroOneOptimizer([p for p, _ in cast], dp_group, learning_rate=learning_rate,
                                    weight_decay=weight_decay, masters=[m for _, m in cast],
                                    loss_scale=loss_scale_of(precision, loss_scale), fused=fused)
    if precision == "fp32":
        return ZeroOneOptimizer([p for p in module.parameters() if p.requires_grad], dp_group,
                                learning_rate=learning_rate, weight_decay=weight_decay, foreach=foreach, fused=fused)
    pairs = [(p, m) for p, m in cast_module(module, compute_dtype(precision)) if p.requires_grad]
    return ZeroOneOptimizer([p for p, _ in pairs], dp_group, learning_rate=learning_rate, weight_decay=weight_decay,
                            foreach=False, masters=[m for _, m in pairs], loss_scale=loss_scale_of(precision, loss_scale),
                            fused=fused)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[Any, dict[str, Any]]:
    """The per-parameter state an optimizer holds on this rank (ZeRO-1: only its own share's)."""
    inner: Any = optimizer
    while isinstance(getattr(inner, "optim", None), torch.optim.Optimizer):  # ZeRO-1 steps a local AdamW
        inner = inner.optim
    state: dict[Any, dict[str, Any]] = inner.state
    return state


def reduces_gradients(zero: int) -> bool:
    """Whether the stage's sharding reduces the gradients itself (FSDP's reduce-scatter), so the executor
    must not all-reduce them."""
    return zero >= 2
