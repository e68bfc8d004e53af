"""The loss's own backward bytes, measured alone on fake tensors: the floor of a last stage's backward transient.

[Note: the loss's backward floor] The stage holding the model's last layer also computes the loss, and every one of
its backwards starts with the loss's backward, before any layer's: so its first and later backward transients are
at least what the loss's backward holds above the level it starts from, and that is proportional to the rows the
device holds (cross-entropy: the gradient of the log-probabilities and of the logits, twice the logits). The
layer's own backward phase (its matmuls' gradients, a constant part of parameter size plus a part per row) can set
the transient at the profiled sizes and the loss's at the target, and a straight line through two sizes the layer
set cannot see the change. Measured on gpt-tiny's last layer alone (final norm + LM head, logits of 8,192 bytes
per row), as data x2 on simulated devices (``hybridplan run --backend sim``) and traced op by op under the
runtime's tracker, rows per replica 2 / 4 / 8 / 16:

- recomputed: backward transient 49,408 / 66,048 / 131,072 / 262,144 bytes; the head's phase (at ``aten.mm``)
  32,768 + 8,320 x rows, the loss's (at ``aten._log_softmax_backward_data``) 16,384 x rows = 2 x the logits: the
  head's at 2 and 4 (the profiled sizes of benchmarks/extended_accuracy's data x2 stage), the loss's at 8 (the
  target) and 16. The line through 2 and 4 gives 99,328 at 8 (the head's phase), the device -8.66% (1F1B);
- not recomputed: 40,960 / 65,536 / 131,072 / 262,144, the head's phase 32,768 + 4,096 x rows: the head's at 2,
  the loss's from 4 on; the line through 2 and 4 gives 114,688 at 8.

So :func:`loss_backward_bytes` measures the loss's backward alone, as the runtime runs it
(runtime/executor.py: ``model.loss(y.float(), targets) * weight``, back-propagated from ``ones(())``), on a fake
output leaf of the model's output shape (models/boundaries.py) and dtype (the precision's compute dtype), at one
and two sample groups: no profiling run, no real memory (GPT-3's logits are measured on fake tensors). The
predictor floors the first and later backward transients of every span that ends the model with it, at the rows
per device of the stage (predict/batch_scaling.py ``loss_floor``). Measured alone, gpt-tiny's loss gives 16,384
bytes per row, the byte-exact loss phase above. On a CUDA profile the bytes are the tensors' own, not the
allocator's blocks (at most 512 bytes per tensor fewer): the floor stays a floor.

[Note: the head's backward phase] The loss's phase hides the model's last layer's own (the head's) in every
profiled suffix, and a ZeRO-3 stage that ends the model needs the head's: only there does FSDP add the head's
gathered bytes and the layer before it prefetched ([Note: the layers before the head] in
predict/zero3_transients.py). So :func:`head_backward_bytes` measures it alone too, on fake tensors, with the last
layer built as a rank of a tensor stage of each profiled degree builds it (runtime/split_layers.py) in the run's
precision: the peak above the forward's end from the moment the loss's backward has produced the layer's output
gradient to the backward's end, fresh gradients (ZeRO-3 allocates them afresh each backward). Its bytes are not a
straight line in the rows (gpt-tiny's head split 2 ways: 16,384 bytes at 1, 2 and 4 samples, then 4,096 per
sample: 32,768 at 8), so it is taken at 1, 2, 4, ..., 32 sample groups and read piecewise linearly
(predict/batch_scaling.py ``measured_at``); in a recompute profile it is taken checkpointed as the runtime
checkpoints a layer (its forward runs again inside the phase). Unsplit, gpt-tiny's comes out as the head's phase that
[Note: the loss runs outside every FSDP unit] reads off the data and ZeRO-3 scenarios: 32,768 + 4,096 x rows.
With it goes the head's input's bytes per sample (``input_bytes``, at the run's precision): the gradient the head
hands back, which a stage ending there frees once the layer before the head has used it, where a profiled stage
ending before the head holds the gradient it receives through its whole backward (the runtime keeps it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a measurement runs: the predictor reads the meta key without it
    import torch

    from hybridplan.models.base import LayeredModel

__all__ = ["loss_backward_bytes", "LOSS_BACKWARD_META", "head_backward_bytes", "HEAD_BACKWARD_META", "HEAD_SAMPLES"]

LOSS_BACKWARD_META = "loss_backward_transient"
"""The profile's meta key: ``{"samples": [n1, n2], "bytes": [b1, b2]}``."""
HEAD_BACKWARD_META = "head_backward_transient"
"""The profile's meta key: ``{"<tensor degree>": {"samples": [...], "bytes": [...], "recompute": bool,
"input_bytes": int}}`` ([Note: the head's backward phase]; ``input_bytes``: per sample, since 28 Nov)."""
HEAD_SAMPLES = (1, 2, 4, 8, 16, 32)
"""The sample groups the head's phase is measured at."""


def _measure(model: LayeredModel, sample_shape: tuple[int, ...], samples: int, dtype: torch.dtype) -> int:
    """Peak bytes above the level while the loss of ``samples`` samples back-propagates into a fake output leaf."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hybridplan.runtime.memory import StorageTracker

    with FakeTensorMode():
        _, targets = model.make_batch(samples, torch.Generator().manual_seed(0))
        y = torch.empty((samples, *sample_shape), dtype=dtype, requires_grad=True)
        tracker = StorageTracker()
        with tracker:
            tracker.track_all([y, targets], "data")
            loss = model.loss(y.float(), targets) * 1.0  # the runtime's weighting (executor.py), a scalar op
            tracker.reset_peak()
            level = tracker.current
            torch.autograd.backward([loss], grad_tensors=[torch.ones(())])
            return int(tracker.peak - level)


def loss_backward_bytes(model: LayeredModel, *, precision: str = "fp32") -> dict[str, Any] | None:
    """The loss's backward transient at one and two sample groups (``model.sample_granularity``), for the profile's
    meta ([Note: the loss's backward floor]); None where the model's output is not a floating tensor (no loss to
    back-propagate through).

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> loss_backward_bytes(get_model("gpt-tiny"))  # 2 x the logits (16 x 128 float32 per sample)
        {'samples': [1, 2], 'bytes': [16384, 32768]}
    """
    from hybridplan.models.boundaries import boundary_specs
    from hybridplan.runtime.precision import compute_dtype

    spec = boundary_specs(model)[model.num_layers]
    if not spec.dtype.is_floating_point:
        return None
    dtype = compute_dtype(precision)
    n = model.sample_granularity
    return {"samples": [n, 2 * n], "bytes": [_measure(model, spec.sample_shape, k, dtype) for k in (n, 2 * n)]}


def head_backward_bytes(model: LayeredModel, degree: int, *, precision: str = "fp32",
                        recompute: bool = False) -> dict[str, Any] | None:
    """The head's backward phase ([Note: the head's backward phase]) of a rank of a ``degree``-way tensor stage
    (1: unsplit) at :data:`HEAD_SAMPLES` sample groups, checkpointed as the runtime checkpoints it where
    ``recompute`` (its forward then runs again inside the phase), for the profile's meta; None where the model's
    output is not a floating tensor or its last layer does not split ``degree`` ways.

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> head_backward_bytes(get_model("gpt-tiny"), 2)["bytes"]  # its weight shard's gradient, then its input's
        [16384, 16384, 16384, 32768, 65536, 131072]
    """
    import torch

    from hybridplan.models.boundaries import boundary_specs
    from hybridplan.runtime.split_layers import split_layers
    from hybridplan.runtime.precision import cast_module, compute_dtype

    last, specs = model.num_layers - 1, boundary_specs(model)
    if not specs[model.num_layers].dtype.is_floating_point or (
            degree > 1 and model.tensor_parallel_problem(last, degree) is not None):
        return None
    dtype, n = compute_dtype(precision), model.sample_granularity
    measured: list[int] = []
    for module in split_layers(model, "tensor" if degree > 1 else "none", degree, layers=[last]):
        if module is not None:  # inside the fake process group and tensor mode split_layers holds
            if dtype != torch.float32:
                cast_module(module, dtype)
            measured = [_measure_head(model, module, n * k, dtype, recompute) for k in HEAD_SAMPLES]
    if not measured:  # the layer was not built split (split_layers gives None for it)
        return None
    spec = specs[last]  # the head's input, whose gradient it hands back
    itemsize = (dtype if spec.dtype.is_floating_point else spec.dtype).itemsize
    return {"samples": [n * k for k in HEAD_SAMPLES], "bytes": measured, "recompute": recompute,
            "input_bytes": math.prod(spec.sample_shape) * itemsize}


def _measure_head(model: LayeredModel, module: torch.nn.Module, samples: int, dtype: torch.dtype,
                  recompute: bool) -> int:
    """Peak bytes above the forward's end while ``module`` (the model's last layer) back-propagates ``samples``
    samples, from its output gradient on (fake tensors; its gradients fresh)."""
    import torch

    from torch.utils.checkpoint import checkpoint

    from hybridplan.models.boundaries import boundary_specs
    from hybridplan.runtime.memory import StorageTracker

    spec = boundary_specs(model)[model.num_layers - 1]
    floating = spec.dtype.is_floating_point
    for p in module.parameters():
        p.grad = None
    _, targets = model.make_batch(samples, torch.Generator().manual_seed(0))
    x = torch.empty((samples, *spec.sample_shape), dtype=dtype if floating else spec.dtype, requires_grad=floating)
    tracker = StorageTracker()
    with tracker:
        tracker.track_all([x, targets], "data")
        y = checkpoint(module, x, use_reentrant=False, preserve_rng_state=False) if recompute else module(x)
        loss = model.loss(y.float(), targets) * 1.0  # the runtime's weighting (executor.py), a scalar op
        level = tracker.current

        def start(grad: torch.Tensor) -> None:  # the head's phase starts with its output gradient
            tracker.start_window()

        y.register_hook(start)
        torch.autograd.backward([loss], grad_tensors=[torch.ones(())])
        return int(tracker.window_peak - level)
