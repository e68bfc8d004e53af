"""Torch's fake process group for one block: where simulated devices (runtime/sim.py) and layers split on fake tensors
(runtime/split_layers.py) run collectives that return at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from hybridplan.errors import UsageError

__all__ = ["fake_process_group"]


@contextmanager
def fake_process_group(rank: int, world: int) -> Iterator[None]:
    """This process as ``rank`` of ``world`` in torch's fake process group, for the block's duration.

    Raises:
        UsageError: if a default process group already exists in this process.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UsageError(
            "cannot simulate devices: this process already has a torch.distributed process group",
            fix="simulate from a process that has not called init_process_group (or destroy it first)",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
