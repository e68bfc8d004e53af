"""PipeDream-2BW's second weight version (runtime/weight_stash.py): each iteration computes on the version before
the newest, the step updates the newest, the swaps copy nothing, and the stash is counted as "weight_stash"."""

from __future__ import annotations

import torch

from hybridplan.runtime.memory import StorageTracker
from hybridplan.runtime.meters import NullMeter
from hybridplan.runtime.weight_stash import WeightStash


def test_iteration_t_computes_on_the_weights_of_t_minus_1():
    p = torch.nn.Parameter(torch.zeros(2))  # W(0) = 0; each step adds 1: W(t) = t
    stash = WeightStash([p], NullMeter())
    computed_on = []
    for _ in range(4):
        stash.use_stale()
        computed_on.append(p[0].item())
        stash.rotate()
        with torch.no_grad():
            p.add_(1.0)  # the step, on the newest version
    # W(-1) = W(0) = 0 for iteration 0, then W(0), W(1), W(2)
    assert computed_on == [0.0, 0.0, 1.0, 2.0]
    assert p.tolist() == [4.0, 4.0]


def test_the_swaps_move_storages_and_repeating_one_changes_nothing():
    p = torch.nn.Parameter(torch.arange(3.0))
    stash = WeightStash([p], NullMeter())
    newest = p.data_ptr()
    stash.use_stale()
    stale = p.data_ptr()
    assert stale != newest
    stash.use_stale()  # already on the stale version
    assert p.data_ptr() == stale
    stash.rotate()
    assert p.data_ptr() == newest  # back to the newest storage: no copy, no allocation
    stash.rotate()
    assert p.data_ptr() == newest and p.tolist() == [0.0, 1.0, 2.0]


def test_the_stash_is_one_copy_of_the_parameters_filed_as_weight_stash():
    a = torch.nn.Parameter(torch.zeros(3))  # 3 x 4 bytes
    b = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float16))  # 4 x 2 bytes
    tracker = StorageTracker()
    tracker.track_all([a, b], "parameters")  # counted before the stash, as a rank (runtime/rank.py) counts them
    with tracker:
        stash = WeightStash([a, b], tracker)
    assert stash.nbytes == 20
    assert tracker.current == 40 and tracker.by_category["weight_stash"] == 20 and tracker.by_category["parameters"] == 20
