"""The binary search of a largest-model study: the widest model that fits, each probe a measurement.

Memory grows with the width (parameters, gradients, optimizer state, activations), so whether a width fits is
monotone and a binary search over the widths in ``step`` s finds the widest in about log2(range / step) probes
(:func:`widest`); where a probe also says how much memory the width needs, :func:`widest_guided` aims each probe
at the width whose need meets the capacity, the same answer in fewer probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def widest(fits: Callable[[int], bool], low: int, high: int, step: int) -> int:
    """The widest multiple of ``step`` in ``[low, high]`` for which ``fits`` holds (``high`` itself if it fits:
    the answer is then "at least"), or 0 if ``low`` does not fit.

    Example:
        >>> widest(lambda w: w <= 100, 32, 256, 32)
        96
    """
    lo, hi = -(-low // step), high // step
    if lo > hi:
        raise ValueError(f"no multiple of {step} in [{low}, {high}]")
    if not fits(lo * step):
        return 0
    if hi == lo or fits(hi * step):
        return hi * step
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid
    return lo * step


def widest_guided(probe: Callable[[int], tuple[bool, float | None]], low: int, high: int, step: int,
                  capacity: float, known: Mapping[int, float] | None = None) -> int:
    """:func:`widest`, each next width guessed from what the probes so far *needed* (bytes) where they say it.

    ``probe(w)`` answers whether width ``w`` fits and what it needs (None: unknown). A probe is a profile of a
    new model (minutes to half an hour at paper size), so fewer of them matter more than the arithmetic. Memory
    grows about as ``a + b w + c w^2`` in the width ``w`` (parameters, gradients and optimizer state are width x
    width per layer; activations grow linearly), so the next probe is where that curve through the three
    probes nearest the bracket (a width that fits, one that does not; or the widest fitting ones where the
    other end's need is unknown) meets ``capacity`` (with two probes: a line in ``w^2``), rounded down to the
    step and kept strictly inside the bracket (:func:`_guess`).

    The top end ``high`` is not probed first where the needs already place the limit below it: the widest
    widths are the dearest probes (a profile whose spans run out of memory and are split again and again) and
    often say no need at all. Until a width is seen not to fit, the guesses go up from the widest fitting one
    (with one need known, the line through the origin: memory that grew only linearly would meet the capacity
    there, so the limit is seldom beyond it); a guess at or above ``high``, two fitting guesses in a row, or
    no guess at all, probe ``high`` itself. Whatever the guesses, the answer is :func:`widest`'s for any
    monotone ``fits``: a width is answered only once a probe fits there and one a step wider does not (or it
    is ``high``). Inside a bracket, where the guesses stop halving it (two probes in a row), or the probes say
    no need, the next probe bisects; but a guess within a step of the widest fit is still taken, twice at most
    (MoE 1.3B's extended space fitted at 3,136 and 3,152 with 16-wide steps, the curve's next width 3,168, and
    the bisection probed 3,328 instead). A guess that lands just below the limit is followed by one just above it:
    a few probes on a smooth growth, where the bisection takes about log2(range / step).

    Example:
        >>> widest_guided(lambda w: (w * w <= 10_000, float(w * w)), 32, 256, 8, 10_000.0)
        96
    """
    lo, hi = -(-low // step), high // step
    if lo > hi:
        raise ValueError(f"no multiple of {step} in [{low}, {high}]")
    needs: dict[int, float] = dict(known or {})

    def ask(k: int) -> bool:
        fits, need = probe(k * step)
        if need is not None:
            needs[k * step] = float(need)
        return fits

    if not ask(lo):
        return 0
    if hi == lo:
        return lo * step
    top, missed = hi, False  # ``hi`` is a width seen not to fit once ``missed``; until then ``top``, unprobed
    climbed = 0  # fitting guesses in a row below the unprobed top
    while not missed:
        guess = _guess_up(needs, lo * step, top * step, capacity) if climbed < 2 else None
        k = top if guess is None else min(max(int(guess // step), lo + 1), top)
        if ask(k):
            if k == top:
                return top * step
            lo, climbed = k, climbed + 1
        else:
            hi, missed = k, True
    stalled = 0  # probes in a row that did not halve the bracket
    while hi - lo > 1:
        guess = _guess(needs, lo * step, hi * step, capacity) if stalled < 4 else None
        k = (lo + hi) // 2 if guess is None else min(max(int(guess // step), lo + 1), hi - 1)
        if stalled >= 2 and k != lo + 1:
            k = (lo + hi) // 2  # the guesses stopped halving the bracket: bisect, unless they put the limit
            # within a step of the widest fit, where one probe ends the search (or moves it by a step)
        before = hi - lo
        if ask(k):
            lo = k
        else:
            hi = k
        stalled = 0 if guess is None else stalled + 1 if 2 * (hi - lo) > before else 0
    return lo * step


def _guess_up(needs: dict[int, float], lo: int, top: int, capacity: float) -> float | None:
    """Where the needs place the limit above ``lo`` (the widest width that fits) and below ``top`` (not seen not
    to fit here, though an earlier search may have probed it): :func:`_guess` through the probes nearest that
    range, or with ``lo``'s need alone the line through the origin; None where ``lo``'s need is unknown or over
    the capacity, or the guess is not below ``top``."""
    if lo not in needs or needs[lo] > capacity or needs[lo] <= 0:
        return None
    known = {w: n for w, n in needs.items() if w <= top}
    guess = _guess(known, lo, top, capacity) if len(known) > 1 else lo * capacity / needs[lo]
    return guess if guess is not None and guess < top else None


def _growing(widths: list[int], needs: dict[int, float]) -> bool:
    """Whether the needs grow with the width over ``widths``."""
    ordered = [needs[w] for w in sorted(widths)]
    return all(a < b for a, b in zip(ordered, ordered[1:]))


def _guess(needs: dict[int, float], lo: int, hi: int, capacity: float) -> float | None:
    """Where ``a + b w + c w^2`` through the three probes nearest ``[lo, hi]`` (two: ``a + c w^2``) crosses
    ``capacity`` inside ``(lo, hi)``: between the bracket's ends, or beyond the fitting end where the other end's
    need is unknown (a width whose every plan holds a stage the profile could not measure: no need to say).
    Where the three needs do not grow with the width (the uniform plans: each width's best shape differs, GPT-3
    2.6B's needing 39.47 GiB at 5,056 and 34.48 at 5,152), the curve is the one through the bracket's two ends:
    the parabola through those three crossed 40 GiB at 7,373 of the bracket 5,152 to 7,680, the two ends' at 5,817.
    None where the fitting end's need is unknown, fewer than two needs are known, or the curve does not cross
    inside the bracket (needs that do not grow)."""
    if lo not in needs or needs[lo] > capacity or needs.get(hi, np.inf) <= capacity:
        return None
    near = sorted(needs, key=lambda w: (max(lo - w, w - hi, 0), w))[:3]
    if len(near) == 3 and hi in needs and not _growing(near, needs):
        near = [lo, hi]  # (needs that fall somewhere: a parabola through them crosses far from the bracket's line)
    if len(near) == 3:
        c2, c1, c0 = (float(x) for x in np.polyfit(near, [needs[w] for w in near], 2))
    elif len(near) == 2:
        w1, w2 = sorted(near)
        c2 = (needs[w2] - needs[w1]) / (w2 * w2 - w1 * w1)
        c1, c0 = 0.0, needs[w1] - c2 * w1 * w1
    else:
        return None
    roots = np.roots([c2, c1, c0 - capacity]) if c2 != 0 or c1 != 0 else np.array([])
    inside = [float(r.real) for r in np.atleast_1d(roots) if abs(r.imag) < 1e-9 and lo < r.real < hi]
    return min(inside) if inside else None
