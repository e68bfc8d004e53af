"""The binary search of a largest-model study: the widest model that fits, each probe a measurement.

Memory grows with the width (parameters, gradients, optimizer state, activations), so whether a width fits is
monotone and a binary search over the widths in ``step`` s finds the widest in about log2(range / step) probes.
"""

from __future__ import annotations

from collections.abc import Callable


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
