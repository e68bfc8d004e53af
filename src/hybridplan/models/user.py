"""User models: wrap an ``nn.Sequential`` as a :class:`LayeredModel`, one child per layer.

Example::

    model = from_sequential(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), name="mlp")

or, from the command line, ``--model mypkg.models:build`` with ``build()`` returning the Sequential.

The input shape of a sample is taken from ``input_shape`` or inferred from the first child (an
``nn.Linear``'s ``in_features``); the output shape comes from a forward pass on the meta device (no
memory, no compute). Synthetic targets are class indices over the output's last dimension
(``loss="cross_entropy"``) or a tensor of the output's shape (``loss="mse"``).

Weights: :meth:`SequentialModel.build_layer` deep-copies child ``i`` (floating-point tensors in the
default dtype, on the default device, as a constructor would make them) and calls
``reset_parameters`` on every submodule that has one, so those weights come from the (seeded) global
RNG like the zoo models'. Parameters of modules without ``reset_parameters`` keep the values of the
given Sequential; the model is pickled with them to every process, so they are the same everywhere.

Like the zoo models, a user model should avoid batch statistics (BatchNorm) and random layers
(Dropout with ``p > 0``): with them, micro-batching and data-parallel sharding change the math.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.tensor_parallel import ColumnParallel, GatherOutput, TensorParallelPlan

__all__ = ["SequentialModel", "from_sequential", "LOSSES"]

LOSSES = ("cross_entropy", "mse")
"""Losses :func:`from_sequential` accepts."""

_LINEAR_TP = TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput(dim=-1))])
_CONV_TP = TensorParallelPlan([("", ColumnParallel()), ("", GatherOutput(dim=1))])
_REPLICATED_TP = TensorParallelPlan([])


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "meta" or is_fake(t)


def _fresh_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose tensors are made like a constructor makes them: on the current
    default device (and fake mode), floating-point ones in the default dtype.

    Values are copied only into real tensors: under ``torch.device("meta")`` or ``FakeTensorMode``
    the copy costs no memory, which is what parameter counting and simulation need.
    """
    memo: dict[int, Any] = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        new = torch.empty(t.shape, dtype=torch.get_default_dtype() if t.is_floating_point() else t.dtype)
        if not _is_fake(new) and not _is_fake(t):
            with torch.no_grad():
                new.copy_(t)
        memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    return copy.deepcopy(module, memo)


def _first_leaf(module: nn.Module) -> nn.Module:
    while isinstance(module, nn.Sequential) and len(module) > 0:
        module = module[0]
    return module


class SequentialModel(LayeredModel):
    """A :class:`LayeredModel` over the children of an ``nn.Sequential``; build with :func:`from_sequential`.

    Picklable (the runtime sends models to spawned processes) as long as the Sequential is.
    """

    def __init__(
        self,
        seq: nn.Sequential,
        *,
        name: str,
        input_shape: tuple[int, ...],
        input_dtype: torch.dtype,
        input_high: int | None,
        output_shape: tuple[int, ...],
        loss: str,
        num_classes: int | None,
    ) -> None:
        self.seq = seq
        self.name = name
        self.input_shape = input_shape
        """Shape of one input sample."""
        self.input_dtype = input_dtype
        self.input_high = input_high
        """Exclusive upper bound of integer inputs (token ids), else ``None``."""
        self.output_shape = output_shape
        """Shape of one output sample (from the meta forward)."""
        self.loss_name = loss
        self.num_classes = num_classes
        """Classes of the cross-entropy targets (``None`` for mse)."""

    @property
    def num_layers(self) -> int:
        return len(self.seq)

    def layer_name(self, index: int) -> str:
        return f"{index}.{type(self.seq[index]).__name__.lower()}"

    def build_layer(self, index: int) -> nn.Module:
        layer = _fresh_copy(self.seq[index])
        for sub in layer.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()
        return layer

    def tensor_parallel_plan(self, index: int) -> TensorParallelPlan | None:
        """Column-parallel for a plain ``nn.Linear`` or ungrouped ``nn.Conv2d`` (exact types: a subclass may
        change the forward), an empty plan for a child without parameters or buffers, else ``None``."""
        child = self.seq[index]
        if type(child) is nn.Linear:
            return _LINEAR_TP
        if type(child) is nn.Conv2d and child.groups == 1:
            return _CONV_TP
        if next(itertools.chain(child.parameters(), child.buffers()), None) is None:
            return _REPLICATED_TP
        return None

    def make_batch(self, num_samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (num_samples, *self.input_shape)
        if self.input_high is not None:
            inputs = torch.randint(0, self.input_high, shape, generator=generator, dtype=self.input_dtype)
        else:
            inputs = torch.randn(shape, generator=generator, dtype=self.input_dtype)
        if self.num_classes is not None:
            targets = torch.randint(0, self.num_classes, (num_samples, *self.output_shape[:-1]), generator=generator)
        else:
            targets = torch.randn((num_samples, *self.output_shape), generator=generator)
        return inputs, targets

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.loss_name == "mse":
            return F.mse_loss(output, target)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": "user",
            "layers": [type(m).__name__ for m in self.seq],
            "input_shape": list(self.input_shape),
            "input_dtype": str(self.input_dtype),
            "output_shape": list(self.output_shape),
            "loss": self.loss_name,
            "num_classes": self.num_classes,
        }

    def describe(self) -> str:
        return (
            f"{self.name}: user nn.Sequential, {self.num_layers} layers, input {list(self.input_shape)}"
            f" -> output {list(self.output_shape)}, loss {self.loss_name}"
        )


def _infer_input(first: nn.Module, name: str) -> tuple[tuple[int, ...], torch.dtype]:
    if isinstance(first, nn.Linear):
        return (first.in_features,), torch.float32
    if isinstance(first, nn.Embedding):
        raise ModelError(
            f"model {name!r} starts with an nn.Embedding: the sequence length of a sample is unknown",
            fix="give input_shape=(seq_len,) to from_sequential (a 'module:function' model can return"
            " from_sequential(seq, name=..., input_shape=...) instead of the bare Sequential)",
        )
    if isinstance(first, nn.Conv2d):
        raise ModelError(
            f"model {name!r} starts with an nn.Conv2d({first.in_channels}, ...): the image size is unknown",
            fix=f"give input_shape=({first.in_channels}, height, width) to from_sequential (a 'module:function'"
            " model can return from_sequential(seq, name=..., input_shape=...) instead of the bare Sequential)",
        )
    raise ModelError(
        f"model {name!r} starts with {type(first).__name__}: cannot infer the shape of an input sample",
        fix="give input_shape (the shape of one sample, without the batch dimension) to from_sequential",
    )


def _meta_output_shape(
    seq: nn.Sequential, name: str, input_shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[int, ...]:
    """Shape of one output sample, from a forward of a 2-sample batch on the meta device."""
    tensors = itertools.chain(seq.named_parameters(), seq.named_buffers())
    meta = {k: torch.empty_like(v, device="meta") for k, v in tensors}
    x = torch.zeros((2, *input_shape), dtype=dtype, device="meta")
    try:
        with torch.no_grad(), torch.device("meta"):
            out = functional_call(seq, meta, (x,))
    except Exception as e:  # any failure of the user's forward on this input is a bad shape or dtype
        raise ModelError(
            f"model {name!r} fails on an input of shape {list(input_shape)} ({dtype}): {type(e).__name__}: {e}",
            fix="give input_shape and input_dtype matching the first layer",
        ) from None
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != 2:
        raise ModelError(
            f"model {name!r} must map a batch-first tensor to a batch-first tensor, got {type(out).__name__}"
            + (f" of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else ""),
            fix="make the last layer return one tensor whose dim 0 is the sample",
        )
    return tuple(out.shape[1:])


def from_sequential(
    seq: nn.Sequential,
    *,
    name: str,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: torch.dtype | None = None,
    num_classes: int | None = None,
    loss: str = "cross_entropy",
) -> SequentialModel:
    """Wrap ``seq`` as a layered model with one layer per child.

    Args:
        seq: the model; every child maps one batch-first tensor to one batch-first tensor.
        name: the model's name in reports.
        input_shape: shape of one input sample; inferred from a leading ``nn.Linear`` if omitted.
        input_dtype: dtype of the inputs; ``torch.long`` token ids (in ``[0, num_embeddings)``) for a leading
            ``nn.Embedding``, else ``torch.float32``.
        num_classes: classes of the cross-entropy targets; default the output's last dimension.
        loss: ``"cross_entropy"`` (classes on the output's last dimension) or ``"mse"``.

    Raises:
        ModelError: an empty or non-Sequential model, an unknown loss, an input shape that cannot be
            inferred, a forward that fails on the given input, or ``num_classes`` out of range.
    """
    if not isinstance(seq, nn.Sequential) or len(seq) == 0:
        raise ModelError(
            f"model {name!r} is {type(seq).__name__}" + (" with no children" if isinstance(seq, nn.Sequential) else ""),
            fix="give a non-empty nn.Sequential whose children are the layers",
        )
    if loss not in LOSSES:
        raise ModelError(f"model {name!r}: unknown loss {loss!r}", fix=f"use one of {list(LOSSES)}")
    first = _first_leaf(seq)
    if input_shape is None:
        input_shape, inferred_dtype = _infer_input(first, name)
    else:
        input_shape = tuple(int(d) for d in input_shape)
        inferred_dtype = torch.long if isinstance(first, nn.Embedding) else torch.float32
    dtype = input_dtype or inferred_dtype
    high = first.num_embeddings if isinstance(first, nn.Embedding) else None
    if high is None and not dtype.is_floating_point:
        raise ModelError(
            f"model {name!r}: integer input_dtype {dtype} needs a leading nn.Embedding to bound the values",
            fix="use a floating-point input_dtype, or start the model with nn.Embedding",
        )
    output_shape = _meta_output_shape(seq, name, input_shape, dtype)
    if loss == "cross_entropy":
        if not output_shape:
            raise ModelError(
                f"model {name!r} outputs one number per sample: no class dimension for cross_entropy",
                fix="use loss='mse', or end the model with a layer producing class scores",
            )
        classes = output_shape[-1]
        if num_classes is None:
            num_classes = classes
        elif not 1 <= num_classes <= classes:
            raise ModelError(
                f"model {name!r}: num_classes {num_classes} is outside [1, {classes}] (the output's last dimension)",
                fix=f"give num_classes <= {classes}, or omit it",
            )
    elif num_classes is not None:
        raise ModelError(
            f"model {name!r}: num_classes {num_classes} given with loss 'mse', which has no classes",
            fix="omit num_classes, or use loss='cross_entropy'",
        )
    return SequentialModel(
        seq,
        name=name,
        input_shape=input_shape,
        input_dtype=dtype,
        input_high=high,
        output_shape=output_shape,
        loss=loss,
        num_classes=num_classes,
    )
