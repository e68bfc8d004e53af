from collections import defaultdict

import pytest

from hybridplan.plan import StagePlan
from hybridplan.runtime.routing import Layout, layout_of, route


def rows_received(transfers):
    got = defaultdict(list)
    for t in transfers:
        got[t.dst].append((t.start, t.stop))
    return {k: sorted(v) for k, v in got.items()}


def covers(intervals, lo, hi):
    pos = lo
    for a, b in intervals:
        if a != pos:
            return False
        pos = b
    return pos == hi


LAYOUTS = [
    Layout((0,), False),
    Layout((0, 1), True),
    Layout((0, 1, 2, 3), True),
    Layout((0, 1), False),
    Layout((0, 1, 2, 3), False),
]


@pytest.mark.parametrize("src", LAYOUTS)
@pytest.mark.parametrize("dst", LAYOUTS)
def test_every_destination_gets_exactly_its_rows(src, dst):
    src = Layout(tuple(r for r in src.ranks), src.sharded)
    dst = Layout(tuple(10 + r for r in dst.ranks), dst.sharded)
    rows = 8
    transfers = route(src, dst, rows)
    got = rows_received(transfers)
    for q, rank in enumerate(dst.ranks):
        lo, hi = dst.rows_of(q, rows)
        assert covers(got[rank], lo, hi)
    for t in transfers:  # a source only sends rows it holds
        a, b = src.rows_of(src.ranks.index(t.src), rows)
        assert a <= t.start < t.stop <= b


def test_replicated_source_spreads_load():
    transfers = route(Layout((0, 1), False), Layout((5, 6, 7, 8), True), 8)
    assert [t.src for t in transfers] == [0, 1, 0, 1]


def test_layout_of_stages():
    assert layout_of(StagePlan(0, 2, "data", 2, (0, 1))).sharded
    assert not layout_of(StagePlan(0, 2, "tensor", 2, (0, 1))).sharded
    assert not layout_of(StagePlan(0, 2, "data", 1, (0,))).sharded
