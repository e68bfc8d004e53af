"""Megatron-style tensor parallelism for any layer, with parameters held as DTensor shards.

A layer's split is a :class:`TensorParallelPlan`: rules applied to its submodules by path. The rules
are the Megatron-LM operators (Shoeybi et al., 2019, section 3):

- :class:`ColumnParallel`: the weight's output dimension is sharded; the input is replicated and
  enters through the ``f`` operator (identity forward, all-reduce of the gradient backward);
  the output is sharded on the feature dimension.
- :class:`RowParallel`: the weight's input dimension is sharded; the output is a partial sum that
  leaves through the ``g`` operator (all-reduce forward, identity backward); the bias is added once,
  after the reduction.
- :class:`GatherOutput`: all-gather a column-parallel output back to a replicated tensor
  (split of the gradient backward), e.g. for a vocabulary head; or, without it, the loss computed on the
  vocabulary shards (:func:`vocab_parallel_cross_entropy`, Megatron-LM's and torchtitan's way).
- :class:`VocabParallelEmbedding`: the embedding table is sharded by rows; out-of-shard tokens look
  up zeros and the partial results are all-reduced.
- :class:`ShardParams`: shard further parameters without communication (a norm over sharded
  channels, expert weights), optionally dividing integer attributes (heads, groups) by the degree.
- :class:`CopyInput` / :class:`ReduceOutput`: the bare ``f`` / ``g`` operators on a module, to open
  and close a region whose inside :class:`ShardParams` shards.

Every layer's input and output stay replicated on all ranks of the stage, so layers compose in any
contiguous range. [Note: DTensor parameters] Sharded parameters are ``nn.Parameter(DTensor)`` with a
``Shard(dim)`` placement (so optimizers, ``full_tensor()`` and memory accounting see real shards); the
module's forward sees the local shard through a parametrization. DTensor's own operator rules are not
used for the compute because they do not cover sharded convolutions (measured on torch 2.13:
``conv2d`` with a ``Shard(0)`` weight fails).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from hybridplan import collectives

__all__ = [
    "TensorParallelGroup",
    "TensorParallelRule",
    "TensorParallelPlan",
    "ColumnParallel",
    "RowParallel",
    "GatherOutput",
    "VocabParallelEmbedding",
    "ShardParams",
    "CopyInput",
    "ReduceOutput",
    "is_sharded_parameter",
    "full_parameter",
    "vocab_parallel_cross_entropy",
    "without_gathered_output",
]


@dataclass(frozen=True)
class TensorParallelGroup:
    """The ranks that split one stage: a process group and its 1-D device mesh."""

    group: Any
    """``torch.distributed`` process group of the stage."""
    mesh: Any
    """``DeviceMesh`` over the same ranks (for DTensor placements)."""
    rank: int
    """This process's index in the group."""
    size: int
    """The tensor-parallel degree."""
    reduce_in_place: bool = True
    """Whether ``g`` sums the partial result in place (Megatron's way). False under a selective checkpoint
    (runtime/checkpointing.py): a row-parallel projection's product may be a kept output there, and summing it in
    place would change what the recompute is handed (so trained, gpt-tiny's loss drifted 4e-5 from one device's)."""


# ---------------------------------------------------------------------------------------------- operators
class _CopyToRegion(torch.autograd.Function):
    """Megatron ``f``: identity forward; all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        collectives.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron ``g``: all-reduce (sum) forward, in place on the fresh partial result (or on a copy, where the
    partial result may be kept: :attr:`TensorParallelGroup.reduce_in_place`); identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, in_place: bool = True) -> torch.Tensor:
        x = x.contiguous() if in_place else x.clone(memory_format=torch.contiguous_format)
        collectives.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _GatherFromRegion(torch.autograd.Function):
    """All-gather shards along ``dim`` forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallelGroup, dim: int) -> torch.Tensor:
        dim = dim % x.dim()
        ctx.tp, ctx.dim, ctx.width = tp, dim, x.shape[dim]
        moved = x.movedim(dim, 0).contiguous()
        out = torch.empty((tp.size * moved.shape[0], *moved.shape[1:]), dtype=x.dtype, device=x.device)
        collectives.all_gather_into_tensor(out, moved, group=tp.group)
        return out.movedim(0, dim).contiguous() if dim != 0 else out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start = ctx.tp.rank * ctx.width
        return grad.narrow(ctx.dim, start, ctx.width).contiguous(), None, None


def copy_to_region(x: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
    """Apply Megatron's ``f`` operator."""
    return _CopyToRegion.apply(x, tp.group)


def reduce_from_region(x: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
    """Apply Megatron's ``g`` operator."""
    return _ReduceFromRegion.apply(x, tp.group, tp.reduce_in_place)


def gather_from_region(x: torch.Tensor, tp: TensorParallelGroup, dim: int) -> torch.Tensor:
    """All-gather a sharded tensor along ``dim`` (autograd-aware)."""
    return _GatherFromRegion.apply(x, tp, dim)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy of each row of logits split by vocabulary over ``tp`` (Megatron-LM's vocab-parallel cross
    entropy: Shoeybi et al., 2019, section 3; ``megatron/core/tensor_parallel/cross_entropy.py``).

    Each rank holds the logits of a contiguous ``1/t`` of the vocabulary (a :class:`ColumnParallel` head without
    :class:`GatherOutput`). Three all-reduces of one number per row (the row's max, the target's logit from the rank
    that holds it, the sum of exponentials) give every rank every row's loss. The fp32 shard it is given is worked
    on in place: shifted by the max, exponentiated, normalised into the softmax that the backward needs; so a rank
    holds one fp32 copy of its shard of the logits, never the whole vocabulary."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
        import torch.distributed as dist

        width = logits.shape[-1]
        start = tp.rank * width
        row_max = logits.max(dim=-1).values
        collectives.all_reduce(row_max, group=tp.group, op=dist.ReduceOp.MAX)
        logits.sub_(row_max.unsqueeze(-1))
        elsewhere = (target < start) | (target >= start + width)
        local = (target - start).masked_fill(elsewhere, 0)
        target_logit = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(elsewhere, 0.0)
        collectives.all_reduce(target_logit, group=tp.group)
        softmax = logits.exp_()
        total = softmax.sum(dim=-1)
        collectives.all_reduce(total, group=tp.group)
        loss = total.log() - target_logit
        softmax.div_(total.unsqueeze(-1))
        ctx.save_for_backward(softmax, elsewhere, local)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, elsewhere, local = ctx.saved_tensors
        grad_logits = softmax  # in place: the saved softmax is not needed again
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), (elsewhere.to(softmax.dtype) - 1.0).unsqueeze(-1))
        grad_logits.mul_(grad.unsqueeze(-1))
        return grad_logits, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
    """The mean cross entropy of ``logits`` (``[..., V / t]``, this rank's vocabulary shard, in any dtype: computed in
    fp32) against ``target`` (``[...]``, whole-vocabulary indices): the value the gathered logits' cross entropy
    has, without gathering them (:class:`_VocabParallelCrossEntropy`)."""
    # In fp32 the shard itself is worked on, as Megatron-LM does: nothing saved it (a projection keeps its input, not
    # its output), and autograd's version check would refuse the backward if something had.
    rows = logits.reshape(-1, logits.shape[-1]).float()
    return _VocabParallelCrossEntropy.apply(rows, target.reshape(-1), tp).mean()


def without_gathered_output(plan: TensorParallelPlan) -> TensorParallelPlan:
    """``plan`` without its :class:`GatherOutput` rules: the output stays split (for
    :func:`vocab_parallel_cross_entropy`)."""
    return TensorParallelPlan([(path, rule) for path, rule in plan.rules if not isinstance(rule, GatherOutput)])


# ---------------------------------------------------------------------------------------------- parameters
class _LocalShard(nn.Module):
    """Parametrization that shows a module its parameter's local DTensor shard."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_local() if hasattr(x, "to_local") else x


def _shard_parameter(module: nn.Module, name: str, dim: int, tp: TensorParallelGroup) -> None:
    from torch.distributed.tensor import DTensor, Shard

    param = getattr(module, name)
    dim = dim % param.dim()
    local = param.detach().chunk(tp.size, dim=dim)[tp.rank].clone()
    sharded = DTensor.from_local(local, tp.mesh, [Shard(dim)], run_check=False)
    delattr(module, name)
    module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
    parametrize.register_parametrization(module, name, _LocalShard(), unsafe=True)


def is_sharded_parameter(param: torch.Tensor) -> bool:
    """Whether ``param`` is a DTensor shard (as created by the rules here)."""
    return hasattr(param, "placements") and hasattr(param, "to_local")


def _weight_shape(module: nn.Module) -> tuple[int, ...]:
    """The shape of ``module.weight`` (a Linear, Conv or Embedding)."""
    weight = getattr(module, "weight")  # noqa: B009  (typed as Tensor | Module on nn.Module)
    return tuple(int(n) for n in weight.shape)


def full_parameter(param: torch.Tensor) -> torch.Tensor:
    """The full (gathered) value of a possibly sharded parameter, as a plain tensor."""
    if is_sharded_parameter(param):
        full: torch.Tensor = param.full_tensor()  # type: ignore[attr-defined]  # a DTensor (checked above)
        return full.detach()
    return param.detach()


def _divisible(size: int, degree: int, what: str) -> str | None:
    if size % degree:
        return f"{what} {size} is not divisible by degree {degree}"
    return None


# ---------------------------------------------------------------------------------------------- rules
class TensorParallelRule:
    """How one submodule is split. Subclasses implement :meth:`apply` and :meth:`problem`."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        """Split ``module`` in place for this rank of ``tp``."""
        raise NotImplementedError

    def problem(self, module: nn.Module, degree: int) -> str | None:
        """Why ``module`` cannot be split at ``degree`` (e.g. a dimension not divisible), or ``None``."""
        return None


@dataclass(frozen=True)
class ColumnParallel(TensorParallelRule):
    """Shard the output dimension (``weight`` dim 0 and ``bias``); the input enters through ``f``."""

    copy_input: bool = True
    """Insert ``f`` on the input; set False when an enclosing :class:`CopyInput` already does."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        _shard_parameter(module, "weight", 0, tp)
        if getattr(module, "bias", None) is not None:
            _shard_parameter(module, "bias", 0, tp)
        if self.copy_input:
            module.register_forward_pre_hook(lambda m, args: (copy_to_region(args[0], tp), *args[1:]))

    def problem(self, module: nn.Module, degree: int) -> str | None:
        return _divisible(_weight_shape(module)[0], degree, f"output size of {type(module).__name__}")


@dataclass(frozen=True)
class RowParallel(TensorParallelRule):
    """Shard the input dimension (``weight`` dim 1); the output leaves through ``g``, then the bias is added."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        _shard_parameter(module, "weight", 1, tp)
        bias = getattr(module, "bias", None)
        if bias is not None:
            setattr(module, "bias", None)  # noqa: B010  (nn.Module's typed attributes refuse None to mypy)
            module.register_parameter("tp_bias", nn.Parameter(bias.detach().clone()))

        def finish(m: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            out = reduce_from_region(out, tp)
            b = getattr(m, "tp_bias", None)
            if b is None:
                return out
            shape = [1] * out.dim()
            shape[1 if isinstance(m, nn.modules.conv._ConvNd) else -1] = -1
            return out + b.view(shape)

        module.register_forward_hook(finish)

    def problem(self, module: nn.Module, degree: int) -> str | None:
        return _divisible(_weight_shape(module)[1], degree, f"input size of {type(module).__name__}")


@dataclass(frozen=True)
class GatherOutput(TensorParallelRule):
    """All-gather the module's (sharded) output along ``dim``; pair with :class:`ColumnParallel`."""

    dim: int = -1

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        module.register_forward_hook(lambda m, args, out: gather_from_region(out, tp, self.dim))


@dataclass(frozen=True)
class CopyInput(TensorParallelRule):
    """Megatron ``f`` on the module's input (opens a tensor-parallel region)."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        module.register_forward_pre_hook(lambda m, args: (copy_to_region(args[0], tp), *args[1:]))


@dataclass(frozen=True)
class ReduceOutput(TensorParallelRule):
    """Megatron ``g`` on the module's output (closes a region)."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        module.register_forward_hook(lambda m, args, out: reduce_from_region(out, tp))


@dataclass(frozen=True)
class ShardParams(TensorParallelRule):
    """Shard named parameters along given dims (no communication); divide integer attributes by the degree.

    Example: a GroupNorm over channel-sharded activations is ``ShardParams({"weight": 0, "bias": 0},
    divide=("num_groups",))``; expert weights ``[E, M, F]`` split on F are ``ShardParams({"wi": 2})``.
    """

    params: Mapping[str, int] = field(default_factory=dict)
    divide: Sequence[str] = ()

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        for name, dim in self.params.items():
            if getattr(module, name, None) is not None:
                _shard_parameter(module, name, dim, tp)
        for attr in self.divide:
            setattr(module, attr, getattr(module, attr) // tp.size)

    def problem(self, module: nn.Module, degree: int) -> str | None:
        for name, dim in self.params.items():
            p = getattr(module, name, None)
            if p is not None:
                issue = _divisible(p.shape[dim], degree, f"dimension {dim} of {name}")
                if issue:
                    return issue
        for attr in self.divide:
            issue = _divisible(int(getattr(module, attr)), degree, attr)
            if issue:
                return issue
        return None


@dataclass(frozen=True)
class VocabParallelEmbedding(TensorParallelRule):
    """Shard an ``nn.Embedding`` by rows (tokens); each rank looks up its rows, zeros the others, ``g`` sums."""

    def apply(self, module: nn.Module, tp: TensorParallelGroup) -> None:
        rows = _weight_shape(module)[0] // tp.size
        lo, hi = tp.rank * rows, (tp.rank + 1) * rows
        _shard_parameter(module, "weight", 0, tp)

        def lookup(m: nn.Module, args: Any) -> Any:
            tokens = args[0]
            m._tp_outside = (tokens < lo) | (tokens >= hi)
            return ((tokens - lo).masked_fill(m._tp_outside, 0), *args[1:])

        def combine(m: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            outside = m.__dict__.pop("_tp_outside")
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
            return reduce_from_region(out, tp)

        module.register_forward_pre_hook(lookup)
        module.register_forward_hook(combine)

    def problem(self, module: nn.Module, degree: int) -> str | None:
        return _divisible(_weight_shape(module)[0], degree, "vocabulary size")


@dataclass(frozen=True)
class TensorParallelPlan:
    """The rules of one layer, as ``(submodule path, rule)`` pairs; ``""`` is the layer itself.

    Example (a transformer block)::

        TensorParallelPlan([("attn.q", ColumnParallel()), ("attn.k", ColumnParallel()),
                            ("attn.v", ColumnParallel()), ("attn.o", RowParallel()),
                            ("fc1", ColumnParallel()), ("fc2", RowParallel())])
    """

    rules: Sequence[tuple[str, TensorParallelRule]]

    def apply(self, layer: nn.Module, tp: TensorParallelGroup) -> nn.Module:
        """Split ``layer`` in place for this rank and return it."""
        for path, rule in self.rules:
            rule.apply(layer.get_submodule(path) if path else layer, tp)
        return layer

    def problem(self, layer: nn.Module, degree: int) -> str | None:
        """The first reason a rule cannot split ``layer`` at ``degree``, or ``None``."""
        for path, rule in self.rules:
            issue = rule.problem(layer.get_submodule(path) if path else layer, degree)
            if issue:
                return f"{path or 'layer'}: {issue}"
        return None
