"""Which devices of a ZeRO stage hold the same memory: FSDP2's rows of each parameter, and the devices a simulation
can stand for the others (runtime/sim.py).

Importing this module imports no torch (predict/zero_layout.py reads :func:`fsdp_rows` on the warm path of a
question answered from the cache, docs/instant-planning.md); :func:`zero_representatives` builds the model's split
layers when called.
"""

from __future__ import annotations

import math
from typing import Any

from hybridplan.plan import Plan

__all__ = ["fsdp_rows", "zero_representatives"]


def fsdp_rows(dim0: int, world: int, rank: int) -> int:
    """Rows of a parameter's dim 0 that FSDP2 gives ``rank`` of ``world``: ``torch.chunk``'s chunks of
    ``ceil(dim0 / world)`` rows, the last ones smaller or empty (``_chunk_with_empty``).

    Example:
        >>> [fsdp_rows(10, 4, r) for r in range(4)]
        [3, 3, 3, 1]
    """
    chunk = math.ceil(dim0 / world)
    return max(0, min(chunk, dim0 - rank * chunk))


def zero_representatives(model: Any, plan: Plan) -> dict[int, int]:
    """For each device of a ZeRO stage, the device of its stage whose memory it holds to the byte.

    [Note: equal ZeRO shares] A ZeRO stage's devices differ only in their shares of the parameters, which the
    parameters' shapes fix (predict/zero_layout.py): the ranks of one replica hold equal tensor shards (a split needs
    the degree to divide the dimension), and over the data group ZeRO-2/3 give each rank ``torch.chunk``'s rows of
    every local shard's dim 0 (``fsdp_rows``: only where ``d`` does not divide a dimension do the last ranks get
    fewer), while ZeRO-1 gives each a different set of whole shards (``zero1_shares``). So: one device per replica
    under ZeRO-1; under ZeRO-2/3 one per distinct tuple of rows, which for a model whose dimensions the data degree
    divides (a Llama's, d a power of two) is one device for the whole stage.
    """
    from hybridplan.models.base import parameter_shapes
    from hybridplan.models.zoo import resolve_model
    from hybridplan.runtime.split_layers import layer_shard_shapes

    layered = resolve_model(model)
    same: dict[int, int] = {}
    shards: dict[int, list[list[list[int]] | None]] = {}
    for stage in plan.stages:
        if not stage.zero:
            continue
        t = stage.tensor_degree if stage.parallelism == "data+tensor" else 1
        d = stage.data_degree
        replicas = [stage.devices[r * t:(r + 1) * t] for r in range(d)]
        if stage.zero == 1:
            firsts = list(range(d))
        else:
            if t not in shards:  # [element bytes, *shape] of each trained parameter (shard), per layer
                shards[t] = layer_shard_shapes(layered, t) if t > 1 else list(parameter_shapes(layered))
            dims = [shape[1] if len(shape) > 1 else 1 for layer in shards[t][stage.start:stage.stop]
                    for shape in (layer or [])]
            seen: dict[tuple[int, ...], int] = {}
            firsts = [seen.setdefault(tuple(fsdp_rows(n, d, r) for n in dims), r) for r in range(d)]
        for r, devices in enumerate(replicas):
            for device in devices:
                same[device] = replicas[firsts[r]][0]
    return same
