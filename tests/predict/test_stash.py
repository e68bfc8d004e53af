"""The 2BW weight stash added to (or removed from) a profile's ``static`` quantity (predict/stash.py), by hand."""

from __future__ import annotations

import numpy as np

from hybridplan.predict.stash import StashAdjustment
from hybridplan.profiling.quantities import INDEX, QUANTITIES
from tests.predict.test_memory import L
from tests.predict.test_memory_2bw import STASH

S = INDEX["static"]


def test_stash_sign() -> None:
    for schedule, profiled, sign in [("2bw", "1f1b", 1), ("2bw", "gpipe", 1), ("1f1b", "2bw", -1), ("flush", "2bw", -1),
                                     ("2bw", "2bw", 0), ("flush", "1f1b", 0), ("2bw", None, 0)]:
        assert StashAdjustment(STASH, num_layers=L, schedule=schedule, profile_schedule=profiled).sign == sign


def _adjustment(schedule: str, profiled: str | None, stash=STASH) -> StashAdjustment:
    return StashAdjustment(stash, num_layers=L, schedule=schedule, profile_schedule=profiled)


def test_a_stage_gets_the_stash_of_its_layers_in_its_static_only() -> None:
    add = _adjustment("2bw", "1f1b")
    q = np.arange(len(QUANTITIES), dtype=float)
    before = q.copy()
    assert add.apply(q, 1, 3, "none", 1) is q  # in place
    assert q[S] == before[S] + 1200 + 700  # layers 1 and 2 of the replicated table
    assert list(np.delete(q, S)) == list(np.delete(before, S))


def test_replicated_stages_share_one_table_and_tensor_stages_have_their_own() -> None:
    add = _adjustment("2bw", "1f1b")
    assert add.apply(np.zeros(8), 1, 3, "data", 4)[S] == 1200 + 700  # a data replica stashes whole parameters
    assert add.apply(np.zeros(8), 1, 3, "tensor", 2)[S] == 600 + 350  # a tensor stage its shards
    assert add.apply(np.zeros(8), 0, 4, "tensor", 4) is None  # no sizes for tensor x4


def test_a_2bw_profile_predicts_other_schedules_with_the_stash_removed() -> None:
    assert _adjustment("1f1b", "2bw").apply(np.zeros(8), 0, 2, "none", 1)[S] == -(1000 + 1200)


def test_nothing_changes_within_a_schedule_family() -> None:
    q = np.ones(8)
    for schedule, profiled in (("1f1b", "1f1b"), ("2bw", "2bw"), ("2bw", None)):
        assert _adjustment(schedule, profiled, stash={}).apply(q, 0, 4, "tensor", 8) is q
    assert list(q) == [1.0] * 8


def test_a_layer_without_stash_bytes_leaves_spans_that_hold_it_unknown() -> None:
    add = _adjustment("2bw", "1f1b", stash={("none", 1): {0: 10, 1: 20}})  # layers 2 and 3 unknown
    assert add.apply(np.zeros(8), 0, 2, "none", 1)[S] == 30
    assert add.apply(np.zeros(8), 1, 3, "none", 1) is None


def test_a_whole_span_table_gets_every_span_at_once() -> None:
    table = np.zeros((L, L + 1, len(QUANTITIES)))
    _adjustment("2bw", "1f1b").apply(table, None, None, "none", 1)
    per_layer = [1000, 1200, 700, 900]
    for a in range(L):
        for b in range(a + 1, L + 1):
            assert table[a, b, S] == sum(per_layer[a:b])
    assert not table[..., [i for i in range(len(QUANTITIES)) if i != S]].any()
