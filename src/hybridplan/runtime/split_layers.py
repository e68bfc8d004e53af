"""Every layer of a model split as a stage of some kind and degree splits it, on fake tensors (no memory, no run).

What a profile records about a split layer without running it (the bytes of a 2BW weight stash,
profiling/stash_sizes.py; the shapes of a tensor rank's parameter shards, which ZeRO partitions:
:func:`layer_shard_shapes`) is read off the layer built exactly as the runtime builds it (runtime/stage.py:
tensor-parallel shards on a fake process group) in a ``FakeTensorMode``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from hybridplan.models.base import LayeredModel
from hybridplan.plan import Parallelism, StagePlan

__all__ = ["split_layers", "layer_shard_shapes", "per_layer"]

T = TypeVar("T")


def split_layers(model: LayeredModel, kind: str, degree: int,
                 layers: Sequence[int] | None = None) -> Iterator[nn.Module | None]:
    """Each layer of ``model`` (or each of ``layers``) as rank 0 of a ``kind`` x ``degree`` stage holds it, on fake
    tensors; ``None`` for a layer that cannot be tensor-parallel at ``degree``. Only "tensor" at a degree above 1
    splits.

    Consume it whole: the fake process group and tensor mode stay set up until the last layer is given.

    Raises:
        UsageError: if this process already has a process group (the fake one cannot be set up).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    from hybridplan.models.tensor_parallel import TensorParallelGroup
    from hybridplan.runtime.fake_group import fake_process_group
    from hybridplan.runtime.stage import build_stage_module

    tensor = kind == "tensor" and degree > 1
    label: Parallelism = cast(Parallelism, kind) if degree > 1 else "none"  # StagePlan rejects an unknown kind
    with fake_process_group(0, degree), FakeTensorMode():
        tp = None
        if tensor:
            world = dist.group.WORLD
            if world is None:  # fake_process_group makes the default group; torch did not
                raise RuntimeError("the fake process group has no default group")
            with unset_fake_temporarily():
                mesh = DeviceMesh.from_group(world, "cpu")
            tp = TensorParallelGroup(world, mesh, 0, degree)
        for layer in range(model.num_layers) if layers is None else layers:
            if tensor and model.tensor_parallel_problem(layer, degree) is not None:
                yield None
                continue
            stage = StagePlan(layer, layer + 1, label, degree, tuple(range(degree)))
            yield build_stage_module(model, stage, seed=0, device=torch.device("cpu"), tp=tp)


def per_layer(model: LayeredModel, kind: str, degree: int, measure: Callable[[nn.Module], T]) -> list[T | None]:
    """``measure`` of each layer of ``model`` as rank 0 of a ``kind`` x ``degree`` stage holds it (:func:`split_layers`;
    ``None`` where the layer cannot be split), each distinct layer built and measured once: layers of one
    :meth:`~hybridplan.models.base.LayeredModel.layer_signature` are built alike (the premise of the stage memo,
    [Note: a simulated stage is a function of its layers' signatures] in profiling/stage_memo.py), so a Llama's
    decoder layers are measured once, not 80 times. A layer without a signature is measured on its own."""
    signatures = [model.layer_signature(i) for i in range(model.num_layers)]
    first: dict[object, int] = {}
    for i, sig in enumerate(signatures):
        if sig is not None:
            first.setdefault(sig, i)
    built = [i for i, sig in enumerate(signatures) if sig is None or first[sig] == i]
    measured = {i: None if module is None else measure(module)
                for i, module in zip(built, split_layers(model, kind, degree, built))}
    return [measured[i] if sig is None or first[sig] == i else copy.deepcopy(measured[first[sig]])
            for i, sig in enumerate(signatures)]  # a copy: one layer's result edited never edits another's


def layer_shard_shapes(model: LayeredModel, degree: int) -> list[list[list[int]] | None]:
    """Per layer, the trained parameters a rank of a ``degree``-way tensor stage holds, as
    ``[bytes per element, *local shard shape]`` in the split layer's ``parameters()`` order (the order the
    runtime's ZeRO-1 optimizer is given them; models/base.py ``parameter_shapes`` is the unsplit form); ``None``
    for a layer that cannot be split at ``degree``. Every rank's shards have these shapes (a split needs the
    degree to divide the dimension).

    Example:
        >>> from hybridplan.models.zoo import get_model
        >>> layer_shard_shapes(get_model("gpt-tiny"), 2)[1][:3]
        [[4, 64], [4, 64], [4, 32, 64]]
    """
    def shapes(module: nn.Module) -> list[list[int]]:
        out = []
        for p in module.parameters():
            if p.requires_grad:
                local = p.to_local() if hasattr(p, "to_local") else p
                out.append([local.element_size(), *local.shape])
        return out

    return per_layer(model, "tensor", degree, shapes)
