"""ZeRO-1 as DeepSpeed and Megatron-LM's distributed optimizer partition it: one flat, evenly split range per rank.

[Note: a flat ZeRO-1 partition] This runtime's own ZeRO-1 (runtime/sharding.py ``ZeroOneOptimizer``) is torch's
``ZeroRedundancyOptimizer``, which gives each rank WHOLE tensors, largest first, so a stage whose largest tensor is
more than 1/d of its parameters shards unevenly (docs/engines.md section 2). DeepSpeed flattens a parameter group
into one buffer and gives each of the d ranks an equal range of it (``stage_1_and_2.py``,
``get_data_parallel_partitions``); Megatron-LM's distributed optimizer cuts its contiguous gradient buffer into
equal ranges too (``distrib_optimizer.py``, ``_build_model_gbuf_param_range_map``); a tensor may be cut by a rank
boundary. :class:`FlatZeroOneOptimizer` runs that partition: the stage's trainable tensors (each tensor rank's
local shards) in order, flattened, split into d ranges of ``ceil(N / d)`` elements (the last one short: the
engines pad it, which changes no element any rank steps). A rank keeps AdamW's state for its range only, one piece
per tensor it overlaps: in mixed precision an fp32 master of the piece with the two moments (12 bytes an element,
ZeRO's K), in fp32 the two moments, the piece being a view of the parameter itself (8 bytes; Megatron-LM's fp32
row, docs/engines.md). Its step reads each piece's gradient as a view of the parameter's gradient (of its fp32
buffer where ``grad_accumulation="fp32-buffer"`` keeps one: no copy, as the engines read their flat gradient
buffer), writes the pieces back into the low-precision parameters, and every piece is then broadcast from its owner
(as ``ZeroRedundancyOptimizer`` broadcasts its shares; the engines all-gather their parameter buffer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.adamw import adamw

__all__ = ["Zero1Partition", "ZERO1_PARTITIONS", "flat_ranges", "FlatZeroOneOptimizer"]

Zero1Partition = Literal["tensors", "flat"]
"""How a ZeRO-1 stage splits its optimizer state: "tensors", whole tensors per rank (``ZeroRedundancyOptimizer``,
this runtime's way), or "flat", one equal range of the flattened parameters per rank, as DeepSpeed and Megatron-LM do
([Note: a flat ZeRO-1 partition])."""

ZERO1_PARTITIONS: tuple[Zero1Partition, ...] = get_args(Zero1Partition)


def flat_ranges(numels: Sequence[int], ranks: int) -> list[list[tuple[int, int, int]]]:
    """Per rank, the pieces ``(tensor index, start, stop)`` of its range of the tensors of ``numels`` flattened in
    order and split into ``ranks`` ranges of ``ceil(N / ranks)`` elements ([Note: a flat ZeRO-1 partition]).

    >>> flat_ranges([6, 4], 3)  # 10 elements in ranges of 4: [0, 4), [4, 8), [8, 10)
    [[(0, 0, 4)], [(0, 4, 6), (1, 0, 2)], [(1, 2, 4)]]
    """
    size = math.ceil(sum(numels) / ranks)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(ranks)]
    offset = 0
    for i, n in enumerate(numels):
        for r in range(offset // size if size else ranks, ranks):
            lo, hi = max(offset, r * size), min(offset + n, (r + 1) * size)
            if lo >= hi:
                break
            out[r].append((i, lo - offset, hi - offset))
        offset += n
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension, the same storage (its pieces are written in place)."""
    if not t.is_contiguous():
        raise ValueError("a flat ZeRO-1 partition needs contiguous parameters (a view of each is stepped in place)")
    return t.view(-1)


class FlatZeroOneOptimizer(torch.optim.Optimizer):
    """AdamW over this rank's range of the stage's flattened parameters ([Note: a flat ZeRO-1 partition]).

    Args:
        params: the stage's trainable parameters (DTensor shards of a tensor-parallel stage: their local tensors).
        dp_group: the data-parallel group the range is split over.
        learning_rate, weight_decay: AdamW's.
        masters: in mixed precision, each parameter's fp32 master (each piece of this rank's range keeps its slice;
            the rest is freed with the list); None: the parameters are fp32 and each piece is stepped in place.
        loss_scale: the gradients are divided by it before the update (1 but for fp16).
        fused: torch's single-kernel AdamW ([Note: the AdamW step, multi-tensor or fused] in runtime/precision.py).
        foreach: otherwise the multi-tensor AdamW (what torch picks on CUDA), else the per-tensor loop.
    """

    def __init__(self, params: list[nn.Parameter], dp_group: Any, *, learning_rate: float, weight_decay: float,
                 masters: list[torch.Tensor] | None = None, loss_scale: float = 1.0, fused: bool = False,
                 foreach: bool = False) -> None:
        from hybridplan.runtime.precision import ADAMW_BETAS, ADAMW_EPS

        self._params = params
        self._views = [_flat(_local(p).detach()) for p in params]
        self._group = dp_group
        ranks, rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        self._ranges = flat_ranges([v.numel() for v in self._views], ranks)
        self._owners = [dist.get_global_rank(dp_group, r) for r in range(ranks)]
        self._mine = self._ranges[rank]
        mixed = masters is not None
        pieces = [_flat(_local(masters[i]).detach())[a:b].clone() if masters is not None else self._views[i][a:b]
                  for i, a, b in self._mine]
        # one group (empty where the range is: more ranks than elements), as MixedPrecisionAdamW keeps it
        super().__init__([{"params": pieces}], {"lr": learning_rate, "weight_decay": weight_decay,
                                                "betas": ADAMW_BETAS, "eps": ADAMW_EPS})
        self.mixed, self.loss_scale, self.fused, self.foreach = mixed, loss_scale, fused, foreach
        for m in pieces if mixed else ():
            self.state[m]["master"] = m  # filed as optimizer state (runtime/executor.py)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params:
            p.grad = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure: the runtime passes none
        """Step this rank's pieces, write them into the parameters, and broadcast every rank's pieces."""
        group = self.param_groups[0]
        masters, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for m, (i, a, b) in zip(group["params"], self._mine, strict=True):
            p = self._params[i]
            source = getattr(p, "main_grad", None)  # an fp32 gradient buffer (runtime/grad_buffers.py)
            source = p.grad if source is None else source
            if source is None:
                continue
            grad = _flat(_local(source))[a:b]
            grad = grad if grad.dtype == torch.float32 else grad.float()
            if self.loss_scale != 1.0:
                grad = grad / self.loss_scale
            state = self.state[m]
            if "step" not in state:  # as torch.optim.AdamW makes them: the fused kernel's counts on the device
                state["step"] = torch.zeros((), device=m.device) if self.fused else torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(m)
                state["exp_avg_sq"] = torch.zeros_like(m)
            masters.append(m)
            grads.append(grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if masters:
            beta1, beta2 = group["betas"]
            adamw(masters, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=self.foreach and not self.fused,
                  fused=self.fused, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                  weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
        del grads
        if self.mixed:
            for m, (i, a, b) in zip(group["params"], self._mine, strict=True):
                self._views[i][a:b].copy_(m)
        for owner, pieces in zip(self._owners, self._ranges, strict=True):
            for i, a, b in pieces:
                dist.broadcast(self._views[i][a:b], src=owner, group=self._group)
