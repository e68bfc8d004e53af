"""Training precision: fp32, or mixed precision (bf16 / fp16) with fp32 master weights and AdamW states.

Mixed precision as the CAPTURE/Alpa benchmarks train (Alpa ``alpa/model/model_util.py`` ``TrainState``
with ``mixed_precision=True``; Micikevicius et al., 2018, "Mixed Precision Training"):

- the stage's parameters, its activations, the tensors crossing stage boundaries, and the gradients
  are in the low precision (the gradients are reduced across data-parallel replicas in it too);
- every parameter has an fp32 master copy; AdamW's moments are fp32 (they are created like the
  master); the step updates the master with an fp32 copy of the gradient, then copies the master back
  into the low-precision parameter. Memory per parameter: 2 (parameter) + 2 (gradient) + 4 (master)
  + 8 (moments) = 16 bytes, the ``2 + 2 + 12`` of ZeRO (Rajbhandari et al., 2020, section 3.1), which
  also counts the master copy as optimizer state: the memory tracker files it under "optimizer";
- the loss is computed in fp32 from the low-precision output (Megatron-LM casts the logits with
  ``.float()`` before its cross entropy unless ``--fp16-lm-cross-entropy``);
- "fp16" multiplies the loss by a STATIC scale and divides the fp32 gradient copy by it. A static
  scale, not a dynamic one, because adjusting the scale needs the gradients' values, which a
  simulated run (runtime/sim.py) does not have; there is no overflow check either (an overflow shows
  as a non-finite loss one iteration later: lower ``RunConfig.loss_scale`` then). bf16 has fp32's
  exponent range and needs no scale.

The gradient is converted to fp32 one parameter at a time inside the step, so the step's transient
memory is one parameter's fp32 gradient plus AdamW's own temporaries, not a full fp32 gradient copy.
A gradient accumulated in a persistent fp32 buffer (runtime/grad_buffers.py, Megatron's ``main_grad``) is
stepped from that buffer, without a copy.

[Note: the AdamW step, multi-tensor or fused] The step's temporaries depend on AdamW's implementation. By default
the runtime runs the one torch picks for the device it models: in fp32 the multi-tensor ("foreach") AdamW for
"cuda", whose step allocates whole-list temporaries (``torch._foreach_sqrt(exp_avg_sqs)``: a copy of every
second moment of the group; torch/optim/adam.py ``_multi_tensor_adam``), the per-tensor loop for "cpu"; in mixed
precision the per-parameter loop above. ``adamw="fused"`` (``RunConfig.adamw``) steps with torch's single-kernel
AdamW (``fused=True``: ``torch._fused_adamw_``, in place, no temporaries), as Megatron-LM's and DeepSpeed's
``FusedAdam`` and torchtitan's default ``implementation="fused"`` do (docs/engines.md, section 3); in mixed
precision the fp32 copy of a gradient is still made where no fp32 buffer holds it.

A tensor-parallel parameter is an ``nn.Parameter(DTensor)``; its master copy and moments are DTensors
with the same placements (the step runs DTensor's pointwise rules, on the local shard).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Literal, get_args

import torch
from torch import nn
from torch.optim.adamw import adamw

from hybridplan.errors import UsageError
from hybridplan.models.tensor_parallel import is_sharded_parameter

__all__ = [
    "cast_module",
    "Precision",
    "PRECISIONS",
    "DEFAULT_FP16_LOSS_SCALE",
    "compute_dtype",
    "loss_scale_of",
    "check_precision",
    "MixedPrecisionAdamW",
    "build_optimizer",
    "AdamWStep",
    "ADAMW_STEPS",
    "FsdpReduce",
    "FSDP_REDUCES",
]

Precision = Literal["fp32", "bf16", "fp16"]
"""A training precision: fp32, or mixed precision with bf16 or fp16 compute (module docstring)."""

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
"""Training precisions ``RunConfig.precision`` accepts."""

AdamWStep = Literal["default", "fused"]
"""AdamW's implementation ([Note: the AdamW step, multi-tensor or fused]): "default", the one torch picks for the
modelled device, or "fused", the single kernel the engines step with."""

ADAMW_STEPS: tuple[AdamWStep, ...] = get_args(AdamWStep)
"""The choices ``RunConfig.adamw`` accepts."""

FsdpReduce = Literal["compute", "fp32"]
"""The dtype a ZeRO-2/3 stage's FSDP2 units reduce-scatter gradients in under mixed precision: "compute", the low
dtype (this runtime's way, as the unsharded stages reduce), or "fp32", as torchtitan does
(``mixed_precision_reduce = "float32"``: each unit's gradients are cast to fp32 before the collective)."""

FSDP_REDUCES: tuple[FsdpReduce, ...] = get_args(FsdpReduce)
"""The choices ``RunConfig.fsdp_reduce`` accepts."""

DEFAULT_FP16_LOSS_SCALE = 128.0
"""Static loss scale of fp16 runs: fairseq's default FP16 loss scale (``fp16_init_scale = 2**7``,
fairseq/dataclass/configs.py), a value that is large enough to keep small gradients out of fp16's
subnormal range and small enough not to overflow activation gradients of the zoo models."""

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

ADAMW_BETAS = (0.9, 0.999)
"""AdamW's moment decay rates: torch.optim.AdamW's defaults, which the fp32 runs use too."""
ADAMW_EPS = 1e-8
"""AdamW's epsilon: torch.optim.AdamW's default."""


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype of parameters, activations and gradients under ``precision``."""
    return _DTYPES[precision]


def loss_scale_of(precision: str, loss_scale: float | None) -> float:
    """The loss scale a run uses: the given one or the fp16 default; 1 for fp32 and bf16."""
    if precision != "fp16":
        return 1.0
    return DEFAULT_FP16_LOSS_SCALE if loss_scale is None else float(loss_scale)


def check_precision(precision: str, loss_scale: float | None) -> None:
    """Validate the precision options of a run.

    Raises:
        UsageError: for an unknown precision, or a loss scale that is not positive or not for fp16.
    """
    if precision not in PRECISIONS:
        raise UsageError(f"precision {precision!r} is not supported", fix=f"use one of {list(PRECISIONS)}")
    if loss_scale is None:
        return
    if precision != "fp16":
        raise UsageError(
            f"loss_scale {loss_scale} was given for precision {precision!r}",
            fix="a loss scale only applies to 'fp16'; leave it unset",
        )
    if not loss_scale > 0:
        raise UsageError(f"loss_scale must be positive, got {loss_scale}", fix="use e.g. 128 (the default)")


class NoParameters(torch.optim.Optimizer):
    """The optimizer of a stage without trainable parameters: nothing to update.

    ``torch.optim.Optimizer`` refuses an empty parameter list, but a pipeline stage may hold only
    parameterless layers (activations, pooling, flatten), and it still trains: it back-propagates.
    """

    def __init__(self) -> None:  # deliberately not calling Optimizer.__init__, which rejects no parameters
        self.state: defaultdict[torch.Tensor, Any] = defaultdict(dict)  # as Optimizer.__init__ makes it
        self.param_groups: list[dict[str, Any]] = []
        self.defaults: dict[str, Any] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure: the runtime passes none
        return None


class MixedPrecisionAdamW(torch.optim.Optimizer):
    """AdamW over fp32 master copies of low-precision parameters.

    ``zero_grad`` and ``param_groups`` act on the low-precision parameters, as with any optimizer;
    ``state[p]`` holds ``"master"``, and after the first step ``"exp_avg"``, ``"exp_avg_sq"`` and
    ``"step"`` (a host scalar, as torch.optim.AdamW keeps it when not capturable).
    :func:`build_optimizer` makes the pairs from an fp32 module.

    Args:
        pairs: ``(low-precision parameter, fp32 master)`` pairs.
        lr: learning rate.
        weight_decay: decoupled weight decay, applied to the master.
        loss_scale: the gradients are divided by it before the update (1 for bf16).
        fused: step each master with torch's fused AdamW kernel ([Note: the AdamW step, multi-tensor or fused]).
    """

    def __init__(
        self,
        pairs: Iterable[tuple[nn.Parameter, torch.Tensor]],
        *,
        lr: float,
        weight_decay: float,
        loss_scale: float = 1.0,
        fused: bool = False,
    ) -> None:
        pairs = list(pairs)
        for p, master in pairs:
            if master.dtype != torch.float32 or master.shape != p.shape:
                raise ValueError(f"a master copy must be fp32 and shaped like its parameter, got {master.dtype}")
        # One group, empty where a ZeRO-1 rank's share is (fewer parameter tensors than ranks: it steps nothing),
        # as torch.optim.AdamW takes the group ZeroRedundancyOptimizer gives it (runtime/sharding.py).
        group = {"params": [p for p, _ in pairs]}
        super().__init__([group], {"lr": lr, "weight_decay": weight_decay, "betas": ADAMW_BETAS, "eps": ADAMW_EPS})
        self.loss_scale = loss_scale
        self.fused = fused
        for p, master in pairs:
            self.state[p]["master"] = master

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Update every master with its parameter's gradient (in fp32, unscaled); copy it back."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                buffer = getattr(p, "main_grad", None)  # an fp32 gradient buffer (runtime/grad_buffers.py)
                if p.grad is None and buffer is None:
                    continue
                state = self.state[p]
                master = state["master"]
                if "step" not in state:
                    # the fused kernel takes its step counts on the parameters' device, as torch.optim.AdamW(fused=True)
                    # makes them; the loop's is a host scalar
                    state["step"] = torch.zeros((), device=master.device) if self.fused else torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(master)
                    state["exp_avg_sq"] = torch.zeros_like(master)
                # The buffer is already fp32 and is unscaled in place, as Megatron unscales its main grads.
                grad = buffer if buffer is not None else p.grad.float()
                if self.loss_scale != 1.0:
                    grad.mul_(1.0 / self.loss_scale)
                adamw(
                    [master],
                    [grad],
                    [state["exp_avg"]],
                    [state["exp_avg_sq"]],
                    [],
                    [state["step"]],
                    foreach=False,
                    fused=self.fused,
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
                del grad
                p.copy_(master)


def build_optimizer(
    module: nn.Module,
    *,
    precision: str,
    learning_rate: float,
    weight_decay: float,
    loss_scale: float | None,
    device_type: str,
    adamw: str = "default",
) -> torch.optim.Optimizer:
    """The stage's optimizer; for mixed precision, also casts ``module`` (built in fp32) to the low dtype.

    fp32 keeps the runtime's AdamW: torch.optim.AdamW, whose implementation is chosen by the device
    the run MODELS, not the one it runs on: the multi-tensor ("foreach") one for "cuda", as torch
    picks by default for CUDA tensors (torch/optim/optimizer.py ``_default_to_fused_or_foreach``),
    the per-tensor loop for "cpu". A simulated CUDA run (fake CPU tensors) thus allocates the same
    temporaries as the real CUDA run. The multi-tensor kernels cannot mix DTensor and plain tensors in
    one call (``aten._foreach_mul_ got mixed torch.Tensor and DTensor``), so for "cuda" a
    tensor-parallel stage's sharded and replicated parameters form two parameter groups. ``adamw="fused"``: torch's
    fused AdamW in either precision ([Note: the AdamW step, multi-tensor or fused]), with the same two groups.

    Example:
        >>> m = nn.Linear(4, 4)
        >>> opt = build_optimizer(m, precision="bf16", learning_rate=1e-3, weight_decay=0.0,
        ...                       loss_scale=None, device_type="cpu")
        >>> m.weight.dtype, opt.state[m.weight]["master"].dtype
        (torch.bfloat16, torch.float32)
    """
    check_precision(precision, loss_scale)
    if not any(p.requires_grad for p in module.parameters()):
        return NoParameters()  # e.g. a VGG stage of ReLU and pooling layers only
    _check_adamw(adamw)
    fused = adamw == "fused"
    if precision == "fp32":
        params: Any = list(module.parameters())
        if device_type == "cuda" or fused:
            kinds = [[p for p in params if is_sharded_parameter(p)], [p for p in params if not is_sharded_parameter(p)]]
            params = [{"params": group} for group in kinds if group]
        if fused:
            return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, fused=True)
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, foreach=device_type == "cuda")
    pairs = cast_module(module, compute_dtype(precision))
    return MixedPrecisionAdamW(
        pairs, lr=learning_rate, weight_decay=weight_decay, loss_scale=loss_scale_of(precision, loss_scale), fused=fused
    )


def _check_adamw(adamw: str) -> None:
    if adamw not in ADAMW_STEPS:
        raise UsageError(f"AdamW implementation {adamw!r} is not supported", fix=f"use one of {list(ADAMW_STEPS)}")


def cast_module(module: nn.Module, dtype: torch.dtype) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """Replace ``module``'s floating parameters and buffers by ``dtype`` copies, in place.

    Returns ``(new parameter, old fp32 values)`` pairs in ``module.parameters()`` order: the old values
    become the master copies (no copy is made). Not ``module.to(dtype)``: on tensor subclasses (DTensor,
    FakeTensor) it swaps tensor objects, which fails on fake tensors; replacing the parameters keeps
    every parameter a leaf of the right type (an ``nn.Parameter(DTensor)`` stays one).
    """
    pairs: list[tuple[nn.Parameter, torch.Tensor]] = []
    done: dict[int, nn.Parameter] = {}
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            if id(p) not in done:
                with torch.no_grad():
                    done[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                pairs.append((done[id(p)], p.detach()))
            m._parameters[name] = done[id(p)]
        for name, b in list(m._buffers.items()):
            if b is not None and b.is_floating_point():
                m._buffers[name] = b.to(dtype)
    order = {id(p): i for i, p in enumerate(module.parameters())}
    return sorted(pairs, key=lambda pair: order[id(pair[0])])
