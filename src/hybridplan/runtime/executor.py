"""One rank's training loop: its stage's schedule actions, cross-stage transfers, gradient sync, step.

Per iteration, every rank: waits at a barrier, resets its peak, frees last iteration's gradients
(``zero_grad(set_to_none=True)``), takes its rows of the synthetic global batch, then runs its
stage's actions (:mod:`hybridplan.plan.schedule`):

- ``F j``: receive the rows of micro-batch j it holds (from the previous stage's ranks, as routed by
  :mod:`hybridplan.runtime.routing`) into a fresh buffer, run the stage, and send the output's rows on;
  the last stage computes the loss instead, weighted by its share of the micro-batch;
- ``B j``: receive the output gradient rows, back-propagate, send the input gradient rows back.

then sums gradients over the stage's data-parallel group and steps AdamW.

[Note: loss weighting] The model's loss is a mean over samples. A rank holding ``n`` of a micro-batch's
``b`` rows weights its loss by ``n / b / m`` (m micro-batches), so that SUMMING gradients over
micro-batches and data-parallel replicas gives exactly the gradient of the global-batch mean loss, as
on one device. Tensor-parallel ranks hold all rows and each back-propagates the full loss.

After its rows are sent, a stage's output keeps only its autograd edge (runtime/release.py,
[Note: releasing the stage output]).

Under "2bw" the forward and backward passes run on the previous weight version and the step updates the
newest one (runtime/weight_stash.py, [Note: 2BW weight versions]); the actions are 1F1B's.

Mixed precision (runtime/precision.py): the floating tensors crossing stage boundaries, and the first
stage's floating inputs, are in the compute dtype; the loss is computed in fp32 and multiplied by the
loss scale (fp16) before the backward pass; the reported loss is unscaled.

Under fake tensors (runtime/sim.py) the same code runs on shapes only: values that need real data (the
loss) are recorded as ``None``.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import get_gradient_edge

from hybridplan import collectives
from hybridplan.models.base import LayeredModel
from hybridplan.models.boundaries import BoundarySpec
from hybridplan.models.tensor_parallel import TensorParallelGroup, vocab_parallel_cross_entropy
from hybridplan.plan import Plan
from hybridplan.runtime.grad_buffers import reduced_gradient
from hybridplan.runtime.memory import StorageTracker
from hybridplan.runtime.release import is_fake, release_output
from hybridplan.runtime.repeats import run_actions
from hybridplan.runtime import shared_gpu
from hybridplan.runtime.routing import Transfer, layout_of, route
from hybridplan.runtime.sharding import optimizer_state, reduces_gradients
from hybridplan.plan.schedule import Action, max_in_flight, stage_actions
from hybridplan.runtime.weight_stash import WeightStash

__all__ = ["StageExecutor", "IterationRecord", "data_seed", "barrier"]


def data_seed(seed: int, iteration: int) -> int:
    """Seed of the synthetic global batch of ``iteration`` (identical under every plan)."""
    return (seed * 7_368_787 + iteration * 104_729 + 1) % (2**63 - 1)


def barrier() -> None:
    """Wait for every rank of the default group; nothing to wait for in a world of one rank.

    A one-rank world skips it: under NCCL the first barrier creates a communicator, 562 MiB of device
    memory on an H100 (../shared/notes/gpu-h100-facts.md) that a one-device plan never needs.
    """
    if dist.get_world_size() > 1:
        dist.barrier()


@dataclass
class IterationRecord:
    """What one rank measured in one iteration."""

    seconds: float
    peak: int
    static: int
    """Live bytes at the start of the iteration (parameters, optimizer state, buffers)."""
    data: int
    """Bytes of this rank's share of the batch (inputs on the first stage, targets on the last)."""
    loss: float | None
    """This rank's weighted share of the loss (0 off the last stage); None under fake tensors."""
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    reserved_peak: int | None = None
    """Peak bytes the CUDA caching allocator reserved (real or simulated CUDA device); None on a CPU."""
    workspaces: dict[str, int] | None = None
    """Library workspaces held at the start of the iteration, inside ``static`` (a simulated CUDA device's:
    runtime/memory.py ``StorageTracker.workspaces``); None where not known."""


class StageExecutor:
    """Runs one rank's part of a plan.

    Args:
        model: the layered model (for data and loss).
        plan: the plan.
        rank: this rank (= device index).
        module: the stage's layers (already tensor-parallel if the stage is).
        optimizer: the optimizer over ``module``'s parameters.
        meter: a memory meter (runtime.memory).
        device: where tensors live.
        dp_group: this rank's data-parallel group (the same tensor rank of every replica of its stage), or None.
        input_spec: what the stage receives (None for the first stage).
        output_spec: what the stage sends (None for the last stage).
        seed: data seed base.
        record_timeline: record per-action memory levels.
        dtype: compute dtype of floating activations and inputs (mixed precision), default float32.
        loss_scale: the loss is multiplied by it before the backward pass (fp16), default 1.
        checkpointed: the module recomputes activations in the backward pass (see release_output).
        staged: point-to-point transfers go through host memory (ranks sharing a GPU: runtime/shared_gpu.py).
        skip_repeats: replay, not trace, the blocks of actions that repeat (a simulated device's
            :class:`~hybridplan.runtime.memory.StorageTracker` only: runtime/repeats.py [Note: skipping repeated
            blocks]; there is no loss to count then).
        vocab_parallel: the tensor group of a last stage whose head's output stays split by vocabulary: the loss is
            computed on the shards (``RunConfig.loss = "vocab-parallel"``).
    """

    def __init__(
        self,
        *,
        model: LayeredModel,
        plan: Plan,
        rank: int,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        meter: Any,
        device: torch.device,
        dp_group: Any,
        input_spec: BoundarySpec | None,
        output_spec: BoundarySpec | None,
        seed: int,
        record_timeline: bool = True,
        dtype: torch.dtype = torch.float32,
        loss_scale: float = 1.0,
        checkpointed: bool = False,
        staged: bool = False,
        skip_repeats: bool = False,
        vocab_parallel: TensorParallelGroup | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        self.rank = rank
        self.module = module
        self.optimizer = optimizer
        self.meter = meter
        self.device = device
        self.dp_group = dp_group
        self.input_spec = _in_dtype(input_spec, dtype)
        self.output_spec = _in_dtype(output_spec, dtype)
        self.seed = seed
        self.record_timeline = record_timeline
        self.dtype = dtype
        self.loss_scale = loss_scale
        self.checkpointed = checkpointed
        self.staged = staged
        self.skip_repeats = skip_repeats
        self.vocab_parallel = vocab_parallel

        self.stage_index = plan.stage_of_device(rank)
        self.stage = plan.stages[self.stage_index]
        self.first = self.stage_index == 0
        self.last = self.stage_index == plan.num_stages - 1
        self.actions: list[Action] = stage_actions(
            plan.schedule, plan.num_stages, self.stage_index, plan.num_microbatches
        )
        self.in_flight = max_in_flight(self.actions)

        b = plan.microbatch_size
        here = layout_of(self.stage)
        self.rows = here.rows_of(self.stage.devices.index(rank), b)
        prev = layout_of(plan.stages[self.stage_index - 1]) if not self.first else None
        nxt = layout_of(plan.stages[self.stage_index + 1]) if not self.last else None
        self.fwd_recv = [t for t in route(prev, here, b) if t.dst == rank] if prev else []
        self.fwd_send = [t for t in route(here, nxt, b) if t.src == rank] if nxt else []
        self.bwd_recv = [t for t in route(nxt, here, b) if t.dst == rank] if nxt else []
        self.bwd_send = [t for t in route(here, prev, b) if t.src == rank] if prev else []

        self._pending: list[Any] = []
        self._forward_sends: dict[int, list[Any]] = {}
        self._params = [p for p in module.parameters() if p.requires_grad]
        for p in self._params:
            p.register_post_accumulate_grad_hook(lambda q: self.meter.retag(q.grad, "gradients"))
        self.weight_stash = WeightStash(self._params, meter) if plan.schedule == "2bw" else None
        self._retag_optimizer_state()  # mixed precision: the fp32 master copies exist from the start

    # ------------------------------------------------------------------ data
    def _local_batch(self, iteration: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This rank's rows of every micro-batch: inputs if first stage, targets if last."""
        if not (self.first or self.last):
            return None, None
        with self.meter.paused():
            gen = torch.Generator().manual_seed(data_seed(self.seed, iteration))
            inputs, targets = self.model.make_batch(self.plan.global_batch_size, gen)
            if inputs.is_floating_point():
                inputs = inputs.to(self.dtype)
            b, (lo, hi) = self.plan.microbatch_size, self.rows
            index = torch.cat([torch.arange(j * b + lo, j * b + hi) for j in range(self.plan.num_microbatches)])
        with self.meter.in_phase("data"):
            local_in = inputs.index_select(0, index).to(self.device) if self.first else None
            local_tgt = targets.index_select(0, index).to(self.device) if self.last else None
        return local_in, local_tgt

    # ------------------------------------------------------------------ p2p
    @staticmethod
    def _tag(microbatch: int, backward: bool) -> int:
        return 2 * microbatch + int(backward)

    def _receive(self, transfers: list[Transfer], spec: BoundarySpec, microbatch: int, backward: bool) -> torch.Tensor:
        lo, hi = self.rows
        buf = torch.empty((hi - lo, *spec.sample_shape), dtype=spec.dtype, device=self.device)
        parts = [(t.start - lo, t.stop - lo, t.src) for t in transfers]
        shared_gpu.receive_into(buf, parts, self._tag(microbatch, backward), staged=self.staged)
        return buf

    def _send(self, tensor: torch.Tensor, transfers: list[Transfer], microbatch: int, backward: bool) -> list[Any]:
        """Post the sends of ``tensor``'s rows; returns the (work, buffers) pairs to wait for later."""
        lo = self.rows[0]
        # Detached: a plain view of the output would keep the output's autograd graph (and through its
        # AccumulateGrad node the received input buffer) alive until the send is waited for.
        values = tensor.detach()
        sends = []
        for t in transfers:
            piece = values[t.start - lo : t.stop - lo]
            sends.append(shared_gpu.isend(piece, t.dst, self._tag(microbatch, backward), staged=self.staged))
        return sends

    @staticmethod
    def _finish(sends: list[Any]) -> None:
        """Wait for sends and drop them (in a function, so no loop variable keeps a buffer alive)."""
        for work, _ in sends:
            work.wait()
        sends.clear()

    def _wait_sends(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        self._forward_sends.clear()  # a last stage has none; any other stage waited for all in its backwards

    # ------------------------------------------------------------------ actions
    def _forward(
        self, j: int, local_in: torch.Tensor | None, local_tgt: torch.Tensor | None, stash: dict
    ) -> float | None:
        n = self.rows[1] - self.rows[0]
        if self.first:
            if local_in is None:  # _local_batch gives the first stage its inputs
                raise RuntimeError(f"stage {self.stage_index}: the first stage was given no input rows")
            x = local_in[j * n : (j + 1) * n]
        else:
            if self.input_spec is None:  # every stage but the first is given what it receives
                raise RuntimeError(f"stage {self.stage_index}: no input spec for a stage that receives")
            x = self._receive(self.fwd_recv, self.input_spec, j, backward=False)
            if x.is_floating_point():
                x.requires_grad_()
        y = self.module(x)
        if self.last:
            weight = n / self.plan.microbatch_size / self.plan.num_microbatches
            # .float() is a no-op in fp32; in mixed precision the loss is computed in fp32.
            if local_tgt is None:  # _local_batch gives the last stage its targets
                raise RuntimeError(f"stage {self.stage_index}: the last stage was given no targets")
            target = local_tgt[j * n : (j + 1) * n]
            if self.vocab_parallel is not None:  # the output is this rank's vocabulary shard (RunConfig.loss)
                loss = vocab_parallel_cross_entropy(y, target, self.vocab_parallel) * (weight * self.loss_scale)
            else:
                loss = self.model.loss(y.float(), target) * (weight * self.loss_scale)
            stash[j] = (x, get_gradient_edge(loss), None)
            return None if is_fake(loss) else float(loss.detach()) / self.loss_scale
        self._forward_sends[j] = self._send(y, self.fwd_send, j, backward=False)
        if y.grad_fn is None:  # nothing to back-propagate into (e.g. a stage of identity layers on integer input)
            stash[j] = (x, None, None)
        else:
            stash[j] = (x, get_gradient_edge(y), y.shape)
            release_output(y, x, self.meter, checkpointed=self.checkpointed)
        return 0.0

    def _backward(self, j: int, stash: dict) -> None:
        x, edge, out_shape = stash.pop(j)
        if self.last:
            if edge is not None:
                torch.autograd.backward([edge], grad_tensors=[torch.ones((), device=self.device)])
        else:
            if self.output_spec is None:  # every stage but the last is given what it sends
                raise RuntimeError(f"stage {self.stage_index}: no output spec for a stage that sends")
            grad = self._receive(self.bwd_recv, self.output_spec, j, backward=True)
            # [Note: waiting for forward sends] The next stage has back-propagated micro-batch j, so it
            # received our output long ago: this wait returns at once. Dropping the send buffer BEFORE
            # the backward leaves an output its op saved for backward to autograd alone, which frees it
            # mid-backward, exactly as on a rank of the stage that sent nothing: every rank of a stage
            # then has the same memory, and the output is not held to the end of the iteration.
            self._finish(self._forward_sends.pop(j))
            if edge is not None:
                torch.autograd.backward([edge], grad_tensors=[grad])
            del grad
        if not self.first:
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            self._pending += self._send(g, self.bwd_send, j, backward=True)
            self.meter.forget(g)
            del g
        del x

    def _sync_gradients(self) -> None:
        if self.dp_group is None:
            return
        if reduces_gradients(self.stage.zero):  # FSDP reduce-scattered them after each backward (sharding.py)
            for p in self._params:
                if p.grad is not None:
                    self.meter.retag(p.grad, "gradients")
            return
        for p in self._params:
            grad = reduced_gradient(p)  # .grad, or the fp32 buffer it accumulates in (runtime/grad_buffers.py)
            # A tensor-parallel parameter's gradient is a DTensor: its replicas sum their local shards (the
            # data group holds the same tensor rank of every replica, so the shards match).
            grad = grad.to_local() if hasattr(grad, "to_local") else grad
            collectives.all_reduce(grad, group=self.dp_group)

    # ------------------------------------------------------------------ iteration
    def run_iteration(self, iteration: int) -> IterationRecord:
        """Train one iteration; return this rank's measurements."""
        gc.collect()
        gc.disable()
        try:
            barrier()
            start = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self.meter.reset_peak()
            static = self.meter.current
            workspaces = self.meter.workspaces()
            local_in, local_tgt = self._local_batch(iteration)
            data = self.meter.current - static
            stash: dict[int, Any] = {}
            loss: float | None
            timeline: list[dict[str, Any]] = []
            if self.weight_stash is not None:
                self.weight_stash.use_stale()
            losses: list[float | None] = []

            def execute(action: Action) -> tuple[int, int, int]:
                before = self.meter.start_window()
                if action.kind == "F":
                    with self.meter.in_phase("activations"):
                        losses.append(self._forward(action.microbatch, local_in, local_tgt, stash))
                else:
                    with self.meter.in_phase("backward"):
                        self._backward(action.microbatch, stash)
                return before, self.meter.window_peak, self.meter.current

            replayable = self.skip_repeats and isinstance(self.meter, StorageTracker)
            levels = run_actions(self.actions, execute, meter=self.meter if replayable else None)
            if self.record_timeline:
                timeline += [{"action": str(a), "before": b, "peak": p, "after": c}
                             for a, (b, p, c) in zip(self.actions, levels)]
            # a skipped block's forwards were not traced (only under fake tensors, where there is no loss)
            traced = len(losses) == sum(a.kind == "F" for a in self.actions)
            loss = None if not traced or any(part is None for part in losses) else sum(p for p in losses if p is not None)
            del local_in, local_tgt
            before = self.meter.start_window()
            with self.meter.in_phase("step"):
                if self.weight_stash is not None:
                    self.weight_stash.rotate()
                self._sync_gradients()
                self.optimizer.step()
            self._retag_optimizer_state()
            if self.record_timeline:
                timeline.append({"action": "step", "before": before, "peak": self.meter.window_peak, "after": self.meter.current})
            self._wait_sends()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            peak, breakdown, reserved = self.meter.peak, dict(self.meter.peak_by_category), self.meter.reserved_peak
            barrier()
            seconds = time.perf_counter() - start
        finally:
            gc.enable()
        return IterationRecord(
            seconds=seconds, peak=peak, static=static, data=data, loss=loss, peak_breakdown=breakdown, timeline=timeline,
            reserved_peak=reserved, workspaces=workspaces,
        )

    def _retag_optimizer_state(self) -> None:
        """File the optimizer's tensors under "optimizer"; its scalar step counters stay on the host
        in a GPU run (torch.optim keeps them on the CPU unless capturable), which the meter is told."""
        for state in optimizer_state(self.optimizer).values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    if v.dim() > 0:
                        self.meter.retag(v, "optimizer")
                    else:
                        self.meter.host_resident(v)


def _in_dtype(spec: BoundarySpec | None, dtype: torch.dtype) -> BoundarySpec | None:
    """A boundary spec with floating tensors in the compute dtype (integer ones, e.g. tokens, unchanged)."""
    if spec is None or not spec.dtype.is_floating_point:
        return spec
    return BoundarySpec(spec.sample_shape, dtype)
