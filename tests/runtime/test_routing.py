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
    Layout((0,), 1),
    Layout((0, 1), 2),  # data x2
    Layout((0, 1, 2, 3), 4),  # data x4
    Layout((0, 1), 1),  # tensor x2
    Layout((0, 1, 2, 3), 1),  # tensor x4
    Layout((0, 1, 2, 3), 2),  # data x2 + tensor x2
    Layout((0, 1, 2, 3, 4, 5, 6, 7), 2),  # data x2 + tensor x4
    Layout((0, 1, 2, 3, 4, 5, 6, 7), 4),  # data x4 + tensor x2
]


@pytest.mark.parametrize("src", LAYOUTS)
@pytest.mark.parametrize("dst", LAYOUTS)
def test_every_destination_gets_exactly_its_rows(src, dst):
    dst = Layout(tuple(10 + r for r in dst.ranks), dst.replicas)
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
    transfers = route(Layout((0, 1), 1), Layout((5, 6, 7, 8), 4), 8)
    assert [t.src for t in transfers] == [0, 1, 0, 1]


def test_every_rank_of_a_tensor_group_gets_its_replicas_rows():
    # data x2 + tensor x2 (ranks 4..7: replicas (4, 5) and (6, 7)) fed by data x4 (ranks 0..3), 8 rows:
    # replica 0 holds rows 0-3, from ranks 0 (rows 0-1) and 1 (rows 2-3); replica 1 rows 4-7 from ranks 2 and 3.
    transfers = route(Layout((0, 1, 2, 3), 4), Layout((4, 5, 6, 7), 2), 8)
    assert [(t.src, t.dst, t.start, t.stop) for t in transfers] == [
        (0, 4, 0, 2), (1, 4, 2, 4), (0, 5, 0, 2), (1, 5, 2, 4), (2, 6, 4, 6), (3, 6, 6, 8), (2, 7, 4, 6), (3, 7, 6, 8)]
    # and the gradients back: each rank of data x4 from the rank of its replica's tensor group at its index
    # modulo 2 (spreading the sends): ranks 0, 1 from 4, 5 (replica 0); ranks 2, 3 from 6, 7 (replica 1)
    back = route(Layout((4, 5, 6, 7), 2), Layout((0, 1, 2, 3), 4), 8)
    assert [(t.src, t.dst, t.start, t.stop) for t in back] == [(4, 0, 0, 2), (5, 1, 2, 4), (6, 2, 4, 6), (7, 3, 6, 8)]


def test_layout_of_stages():
    assert layout_of(StagePlan(0, 2, "data", 2, (0, 1))).sharded
    assert not layout_of(StagePlan(0, 2, "tensor", 2, (0, 1))).sharded
    assert not layout_of(StagePlan(0, 2, "data", 1, (0,))).sharded
    both = layout_of(StagePlan.of(0, 2, (0, 1, 2, 3), data_degree=2, tensor_degree=2))
    assert both.sharded and both.replica_size == 2 and both.rows_of(3, 8) == (4, 8)
