"""Uniform plan sampling: the counts match the space's, the draws cover it evenly, filters hold."""

from __future__ import annotations

from collections import Counter

import pytest

from hybridplan.errors import PlanError, UsageError
from hybridplan.workflows.sampling import count_kept_plans, sample_plans
from hybridplan.search import PlanSpace, count_plans, enumerate_plans


@pytest.mark.parametrize("shape", [(7, 1, 4, False), (30, 1, 4, True), (10, 2, 2, False), (18, 4, 4, False)])
def test_counts_agree_with_the_space(shape):
    space = PlanSpace(*shape)
    assert count_kept_plans(space) == count_plans(space)


def test_small_space_is_returned_whole_without_duplicates():
    space = PlanSpace(7, 1, 4)
    plans = sample_plans(space, 1000, seed=3)
    assert len(plans) == 136 and set(plans) == set(enumerate_plans(space))


def test_draws_are_distinct_reproducible_and_about_uniform():
    space = PlanSpace(8, 1, 4)  # 191 plans
    assert sample_plans(space, 50, seed=1) == sample_plans(space, 50, seed=1)
    assert len(set(sample_plans(space, 150, seed=2))) == 150
    from hybridplan.workflows.sampling import _Counter, _draw
    import random

    counter, rng = _Counter(space, None), random.Random(0)
    hits = Counter(_draw(counter, (8, space.packing.start, 0), rng) for _ in range(19100))
    assert len(hits) == 191 and max(hits.values()) < 2 * min(hits.values())  # expected 100 each


def test_filter_is_respected():
    space = PlanSpace(7, 2, 2)
    keep = lambda c, after: c.stop - c.start <= 2  # noqa: E731
    plans = sample_plans(space, 20, seed=0, keep=keep)
    assert plans and all(c.stop - c.start <= 2 for p in plans for c in p)
    assert count_kept_plans(space, keep) == sum(all(keep(c, 0) for c in p) for p in enumerate_plans(space))


def test_errors():
    with pytest.raises(UsageError):
        sample_plans(PlanSpace(4, 1, 2), -1)
    with pytest.raises(PlanError, match="has every stage admitted"):
        sample_plans(PlanSpace(4, 1, 2), 3, keep=lambda c, after: False)


@pytest.mark.parametrize("shape", [(7, 2, 2, False), (9, 1, 4, False), (6, 3, 4, False)])
def test_a_stage_filter_counts_and_draws_as_the_general_keep(shape):
    """A StageFilter is counted without the stages placed; the counts and the draws must be the general keep's."""
    from hybridplan.workflows.sampling import StageFilter

    space = PlanSpace(*shape)
    admits = lambda c: (c.stop - c.start + c.config) % 3 != 0  # noqa: E731  (an arbitrary mix of kept stages)
    general = lambda c, after: admits(c)  # noqa: E731
    expected = sum(all(admits(c) for c in p) for p in enumerate_plans(space))
    assert expected > 20
    assert count_kept_plans(space, StageFilter(admits)) == count_kept_plans(space, general) == expected
    assert sample_plans(space, 20, seed=5, keep=StageFilter(admits)) == sample_plans(space, 20, seed=5, keep=general)


def test_no_filter_counts_as_the_general_counter():
    from hybridplan.workflows.sampling import _Counter, _counter, _StageCounter

    space = PlanSpace(18, 4, 4)
    assert isinstance(_counter(space, None), _StageCounter)
    root = (18, space.packing.start, 0)
    assert _counter(space, None).count(*root) == _Counter(space, None).count(*root) == count_plans(space)
