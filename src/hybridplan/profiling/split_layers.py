"""Every layer of a model split as a stage of some kind and degree splits it, on fake tensors (no memory, no run).

What a profile records about a split layer without running it (the bytes of a 2BW weight stash,
profiling/stash_sizes.py; the shapes of a tensor rank's parameter shards, which ZeRO partitions:
:func:`layer_shard_shapes`) is read off the layer built exactly as the runtime builds it (runtime/stage.py:
tensor-parallel shards on a fake process group) in a ``FakeTensorMode``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from hybridplan.models.base import LayeredModel
from hybridplan.plan import Parallelism, StagePlan

__all__ = ["split_layers", "layer_shard_shapes"]


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
    from hybridplan.runtime.sim import fake_process_group
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
    out: list[list[list[int]] | None] = []
    for module in split_layers(model, "tensor", degree):
        if module is None:
            out.append(None)
            continue
        shapes = []
        for p in module.parameters():
            if p.requires_grad:
                local = p.to_local() if hasattr(p, "to_local") else p
                shapes.append([local.element_size(), *local.shape])
        out.append(shapes)
    return out
