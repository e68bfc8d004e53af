"""Collectives whose tensors live exactly as long as the program holds them (collectives.py): the sums and
concatenations are right, the caller's tensor is the one filled in, and the scratch buffer gloo works on is
reused and invisible to a memory tracker (gloo, in the shared test pool)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from gloo import WORLD, GlooPool

from hybridplan import collectives
from hybridplan.runtime.memory import StorageTracker


def _collectives(rank: int, world: int) -> dict[str, Any]:
    t = torch.full((3,), float(rank + 1))
    summed = collectives.all_reduce(t)
    out = torch.empty(2 * world)
    gathered = collectives.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    shape = (257,)  # a shape no other job of the pool uses: its scratch buffer is new here
    tracker = StorageTracker()
    with tracker:
        x = torch.ones(shape)
        collectives.all_reduce(x)
        scratch = len(collectives._scratch)
        collectives.all_reduce(x)
    return {"same tensor": summed is t and gathered is out, "sum": t.tolist(), "gathered": out.tolist(),
            "tracked": (tracker.current, tracker.peak), "x": x[0].item(),
            "reused": len(collectives._scratch) == scratch}


@pytest.mark.distributed
def test_all_reduce_and_all_gather_on_gloo(gloo_pool: Callable[[int], GlooPool]) -> None:
    total = sum(range(1, WORLD + 1))  # every rank adds rank + 1
    for report in gloo_pool(WORLD).run(_collectives):
        assert report["same tensor"]  # the caller's tensors, filled in place
        assert report["sum"] == [float(total)] * 3
        assert report["gathered"] == [float(r) for r in range(WORLD) for _ in range(2)]  # rank r's two values, in order
        assert report["x"] == float(WORLD**2)  # ones, summed over the ranks twice
        assert report["tracked"] == (257 * 4, 257 * 4)  # only x: the scratch copy is not the program's memory
        assert report["reused"]
