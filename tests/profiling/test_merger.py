"""The layer merger (profiling/merger.py): merged-layer bounds and their mapping, and merges chosen by hand on
small synthetic statistics."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from hybridplan.errors import PlanError, ProfileError
from hybridplan.profiling.merger import LayerGroups, merge_layers
from hybridplan.profiling.quantities import INDEX
from hybridplan.profiling.statistics import STATISTIC_QUANTITIES, SpanStatistics


class Span(NamedTuple):
    start: int
    stop: int


def test_groups_map_merged_ranges_to_original_layers_and_back():
    groups = LayerGroups([0, 2, 3, 6])
    assert (groups.num_groups, groups.num_layers) == (3, 6)
    assert groups.original(1, 3) == (2, 6) and groups.original(0, 1) == (0, 2)
    assert groups.merged(2, 6) == (1, 3) and groups.merged(1, 3) is None  # layer 1 is inside group 0
    assert groups.original_spans([Span(0, 2), Span(2, 3)]) == [Span(0, 3), Span(3, 6)]
    with pytest.raises(PlanError, match=r"(?s)stage 1 covers layers \[1, 3\).*groups starting at \[0, 2, 3\]"):
        groups.merged_or_raise(1, 3, "stage 1")
    listed = groups.to_list()
    listed.append(9)
    assert groups.to_list() == [0, 2, 3, 6]  # a copy
    assert LayerGroups.identity(3).to_list() == [0, 1, 2, 3]


@pytest.mark.parametrize("bounds", [[0], [1, 3], [0, 2, 2], [0, 3, 1]])
def test_bounds_must_rise_strictly_from_zero(bounds):
    with pytest.raises(ProfileError, match="must rise strictly from 0"):
        LayerGroups(bounds)


def _stats(mi: dict[str, list[float]], ma: dict[str, list[float]]) -> SpanStatistics:
    """Statistics of ``len`` layers whose M_i / M_a are zero but for the quantities given (M_a of layer 0 unused)."""
    L = len(next(iter(mi.values())))
    s = SpanStatistics(num_layers=L, microbatch_size=4, batch_size=16)
    s.mi = np.zeros((L, len(STATISTIC_QUANTITIES)))
    s.ma = np.zeros((L, len(STATISTIC_QUANTITIES)))
    for name, values in mi.items():
        s.mi[:, INDEX[name]] = values
    for name, values in ma.items():
        s.ma[:, INDEX[name]] = values
    return s


def test_the_cheapest_adjacent_pair_is_merged_first():
    # Only static memory: a merged layer (l, l+1) costs M_i(l) + M_a(l+1) at any position and schedule.
    # 4 -> 3: pairs cost 5 + 4, 1 + 2, 1 + 8: layers 1 and 2 merge (M_i 3, M_a 4 + 2 = 6);
    # 3 -> 2: pairs cost 5 + 6 and 3 + 8, a tie: the first pair merges.
    stats = _stats({"static": [5, 1, 1, 9]}, {"static": [0, 4, 2, 8]})
    merge = lambda target: merge_layers(stats, target, schedule="1f1b", num_microbatches=4).to_list()  # noqa: E731
    assert merge(4) == [0, 1, 2, 3, 4]
    assert merge(3) == [0, 1, 3, 4]
    assert merge(2) == [0, 3, 4]
    assert merge(1) == [0, 4]


@pytest.mark.parametrize("schedule, bounds", [("1f1b", [0, 1, 3]), ("gpipe", [0, 2, 3])])
def test_the_schedule_decides_what_a_merged_layer_costs(schedule, bounds):
    # Pair (0, 1): static 6 + 4 = 10, no activations. Pair (1, 2): static 2 + 2 = 4, activations 2 + 2 = 4 per
    # micro-batch. As a first stage under 1F1B one micro-batch is in flight: 4 + 4 = 8 < 10, so (1, 2) merges;
    # under GPipe all 4 are: 4 + 4 * 4 = 20 > 10, so (0, 1) merges.
    stats = _stats({"static": [6, 2, 1], "activation": [0, 2, 0]}, {"static": [0, 4, 2], "activation": [0, 0, 2]})
    assert merge_layers(stats, 2, schedule=schedule, num_microbatches=4).to_list() == bounds


def test_bad_targets_and_missing_statistics_are_refused():
    stats = _stats({"static": [1, 1, 1]}, {"static": [0, 1, 1]})
    for target in (0, 4):
        with pytest.raises(ProfileError, match=f"cannot merge 3 layers into {target}"):
            merge_layers(stats, target, schedule="1f1b", num_microbatches=2)
    stats.ma[2, INDEX["gradient"]] = np.nan
    with pytest.raises(ProfileError, match="needs M_i and M_a of every layer"):
        merge_layers(stats, 2, schedule="1f1b", num_microbatches=2)
