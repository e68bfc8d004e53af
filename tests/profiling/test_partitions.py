from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.profiling.partitions import Scenario, Span, default_neighbors, pack_run, required_spans


def all_runs(L, scenario, devices, groups, neighbors=None):
    pending = set(required_spans(L, neighbors or default_neighbors(L, groups)))
    runs = []
    while pending:
        run = pack_run(pending, num_layers=L, scenario=scenario, devices=devices, max_groups=groups)
        if run is None:
            break
        assert set(run.measured) <= pending
        pending -= set(run.measured)
        runs.append(run)
    return runs, pending


def test_required_spans_follow_description_1():
    # L=10 on 4 devices: anchors every ceil(10/4)=3 layers; the first layer of a block uses the previous anchor
    spans = set(required_spans(10, 3))
    assert {Span(l, l + 1) for l in range(10)} <= spans
    assert {Span(0, 2), Span(0, 3), Span(0, 4), Span(3, 5), Span(3, 6), Span(3, 7), Span(6, 8), Span(6, 9), Span(6, 10)} <= spans
    assert len(spans) == 19


def test_disallowed_spans_fall_back_to_nearest_neighbours():
    # layer 4 cannot be in a (tensor) span: no span contains it, M_a(5) comes from [4..] -> impossible, skipped
    spans = required_spans(8, 4, allowed=lambda s: not (s.start <= 4 < s.stop))
    assert all(not (s.start <= 4 < s.stop) for s in spans)
    assert Span(5, 6) in spans and Span(5, 7) in spans  # M_a(6) from its left neighbour 5
    assert Span(0, 3) in spans and Span(0, 4) in spans  # anchor 0 unaffected
    assert Span(4, 6) not in spans and Span(5, 6) in spans


def test_bad_input():
    with pytest.raises(ProfileError):
        required_spans(0, 1)
    with pytest.raises(ProfileError, match="unknown scenario"):
        Scenario.parse("pipe")
    assert Scenario.parse("tensor4") == Scenario("tensor", 4) and Scenario.parse("pipeline").name == "pipeline"


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 30), devices=st.integers(3, 16), degree=st.sampled_from([1, 2, 4]))
def test_runs_are_valid_plans_within_budget_and_cover_every_span(L, devices, degree):
    if degree > devices - 2:
        return
    scenario = Scenario("none" if degree == 1 else "data", degree)
    groups = devices // degree
    runs, left = all_runs(L, scenario, devices, groups)
    assert not left  # with two spare devices every span fits alone, fillers on both sides
    for run in runs:
        plan = run.plan(schedule="1f1b", global_batch_size=8, num_microbatches=2)
        plan.validate(num_layers=L, cluster=Cluster.parse(f"1x{run.devices}"))
        assert run.devices <= devices
        assert sum(1 for s in run.stages if s.degree == degree and degree > 1) <= groups
        measured = [s for s in run.stages if (s.start, s.stop) in {(m.start, m.stop) for m in run.measured}]
        assert all(s.degree == degree for s in measured)


@settings(max_examples=40, deadline=None)
@given(L=st.integers(4, 40), devices=st.integers(4, 16))
def test_pipeline_runs_at_most_description_1(L, devices):
    """Description 1 needs L + 1 runs; packing the same statistics never needs more."""
    runs, left = all_runs(L, Scenario("none", 1), devices, devices)
    assert not left and len(runs) <= L + 1


def test_packing_measures_several_spans_per_run():
    runs, _ = all_runs(34, Scenario("none", 1), 16, 16)  # GPT-3 2.6B's 34 layers on a 4x4 mesh
    assert len(runs) <= math.ceil(35 / 4)  # far fewer than Description 1's 35


def _brute_force_best(pending, L, degree, devices, max_groups, fillers):
    """(spans, devices used) of the best packing by enumeration: the most disjoint pending spans whose stages and
    gap fillers fit, fewest devices on ties."""
    from itertools import combinations

    best = (0, 0)
    spans = sorted(pending)
    for k in range(1, len(spans) + 1):
        for chosen in combinations(spans, k):
            if any(a.stop > b.start for a, b in zip(chosen, chosen[1:])) or k > max_groups:
                continue
            bounds = [0] + [x for s in chosen for x in (s.start, s.stop)] + [L]
            gaps = [b - a for a, b in zip(bounds[::2], bounds[1::2]) if b > a]
            used = degree * k + sum(min(fillers, g) for g in gaps)
            if used <= devices and (k, -used) > (best[0], -best[1]):
                best = (k, used)
    return best


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 9), devices=st.integers(1, 10), degree=st.sampled_from([1, 2, 3]),
       fillers=st.integers(1, 3), data=st.data())
def test_packing_measures_the_most_spans_on_the_fewest_devices(L, devices, degree, fillers, data):
    """pack_run's dynamic program against every subset of the pending spans (small models)."""
    every = [Span(a, b) for a in range(L) for b in range(a + 1, L + 1)]
    pending = set(data.draw(st.lists(st.sampled_from(every), max_size=8)))
    groups = data.draw(st.integers(1, 4))
    run = pack_run(pending, num_layers=L, scenario=Scenario("none" if degree == 1 else "data", degree),
                   devices=devices, max_groups=groups, fillers_per_gap=fillers)
    count, used = _brute_force_best(pending, L, degree, devices, groups, fillers)
    if count == 0:
        assert run is None
    else:
        assert run is not None and set(run.measured) <= pending and len(run.measured) == count
        assert run.devices == used
