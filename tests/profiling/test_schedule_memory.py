from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.profiling.schedule_memory import stage_peak, stage_peaks
from hybridplan.profiling.quantities import QUANTITIES

quantity = st.integers(0, 10**6)
vectors = st.lists(quantity, min_size=len(QUANTITIES), max_size=len(QUANTITIES))


def named(v):
    return dict(zip(QUANTITIES, v))


@settings(max_examples=200, deadline=None)
@given(v=vectors, m=st.integers(1, 12), after=st.integers(0, 12))
def test_gpipe_closed_form(v, m, after):
    q = named(v)
    S, D, A, G = q["static"], q["data"], q["activation"], q["gradient"]
    # Derived by hand from the action order F0..F(m-1) B0..B(m-1):
    candidates = [S + D + (m - 1) * A + q["forward_transient"], S + D + m * A + q["first_backward_transient"], S + G + q["step_transient"]]
    if m >= 2:  # B1 starts where B0 left the level: S + D + m*A + (G - A)
        candidates.append(S + D + m * A + (G - A) + q["backward_transient"])
    assert stage_peak(np.array(v, float), "gpipe", after, m) == max(candidates)


@settings(max_examples=200, deadline=None)
@given(v=vectors, m=st.integers(2, 12), after=st.integers(0, 12))
def test_1f1b_closed_form(v, m, after):
    q = named(v)
    S, D, A, G = q["static"], q["data"], q["activation"], q["gradient"]
    w = min(after, m)  # warm-up forwards
    tf, tb0, tb, ts = q["forward_transient"], q["first_backward_transient"], q["backward_transient"], q["step_transient"]
    c = [S + G + ts]
    c += [S + D + j * A + tf for j in range(w)]  # warm-up forwards
    if w < m:  # steady state: F(w) B0, then F B pairs, then the drain
        c += [S + D + w * A + tf, S + D + (w + 1) * A + tb0]
        if m - w >= 2:
            c += [S + D + G + w * A + tf, S + D + G + (w + 1) * A + tb]
        if w >= 1:
            c += [S + D + G + w * A + tb]
    else:  # all forwards first (w == m): GPipe-like
        c += [S + D + m * A + tb0]
        if m >= 2:
            c += [S + D + G + (m - 1) * A + tb]
    assert stage_peak(np.array(v, float), "1f1b", after, m) == max(c)


def test_position_matters_only_under_1f1b():
    q = np.zeros(len(QUANTITIES))
    q[QUANTITIES.index("activation")] = 100.0
    assert [stage_peak(q, "1f1b", a, 8) for a in (0, 1, 3, 7, 20)] == [100.0, 200.0, 400.0, 800.0, 800.0]
    assert {stage_peak(q, "gpipe", a, 8) for a in (0, 3, 20)} == {800.0}


def test_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    qs = rng.integers(0, 1000, size=(50, len(QUANTITIES))).astype(float)
    for schedule, after in (("1f1b", 0), ("1f1b", 2), ("gpipe", 5)):
        np.testing.assert_array_equal(stage_peaks(qs, schedule, after, 4), [stage_peak(q, schedule, after, 4) for q in qs])


def test_unknown_schedule_rejected():
    from hybridplan.errors import PlanError

    with pytest.raises(PlanError, match="unknown schedule"):
        stage_peak(np.zeros(len(QUANTITIES)), "interleaved", 0, 2)
