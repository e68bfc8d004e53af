"""The minimum of every window of a row of values, for windows fixed in advance: what one evaluation of the
stage-cut search's ``S(P, Q)`` spends its time on ([Note: bottleneck search cost] in
search/time/bottleneck_cuts.py).
"""

from __future__ import annotations

import numpy as np

__all__: list[str] = []

SPARSE_TABLE_FACTOR = 4.0
"""Window minima use a sparse table once the windows' total width exceeds this factor times its ``L log w``
cost (both give the same floats, a minimum being exact): a choice of speed, not of result
(tests/search/time/test_bottleneck_cuts.py varies it and gets the same minima)."""


class _WindowMinima:
    """The minimum of ``h[r, lo[r, i] : i]`` for every row ``r`` and end ``i``, for any ``h`` of ``rows x (L + 2)``
    (windows fixed, values not); the starts are non-decreasing in ``i``. A row is one cap (one evaluation of
    ``S``): rows are flattened into one array, which no window crosses.

    Two ways, the cheaper chosen once per set of windows: ``np.minimum.reduceat`` over the ``[lo_i, i)`` pairs,
    ``O(sum of widths)`` (``O(L w)`` per row); or a sparse table, ``O(L log w)`` per row: level ``s`` holds
    the minima of the ``2^s`` values from each position, and a window of width ``d`` is the minimum of two
    overlapping blocks of ``2^floor(log2 d)``. An empty window (``lo >= i``) gives some value of ``h``;
    callers add inf."""

    def __init__(self, lo: np.ndarray) -> None:
        rows, ends = lo.shape[0], lo.shape[1]
        stride = ends + 1
        end = np.arange(ends)[None, :]
        width = np.maximum(end - lo, 1)
        offset = (np.arange(rows) * stride)[:, None]
        self.levels = int(width.max()).bit_length()  # levels 0 .. floor(log2 w)
        self.sparse = float(width.sum()) > SPARSE_TABLE_FACTOR * width.size * (self.levels + 2)
        if self.sparse:
            level = np.frexp(width)[1] - 1  # floor(log2 d), exact: frexp reads the exponent
            self.level, self.left, self.right = level, lo + offset, np.maximum(end - (1 << level), lo) + offset
        else:
            self.pairs = np.empty((rows, 2 * ends), dtype=np.intp)
            self.pairs[:, 0::2], self.pairs[:, 1::2] = lo + offset, end + offset
            self.pairs = self.pairs.ravel()
        self.shape = lo.shape

    def __call__(self, h: np.ndarray) -> np.ndarray:
        flat = h.ravel()
        if not self.sparse:
            # every window's minimum in one pass, the in-between results dropped
            return np.minimum.reduceat(flat, self.pairs)[0::2].reshape(self.shape)
        table = np.full((self.levels, len(flat)), np.inf)
        table[0] = flat
        for s in range(1, self.levels):
            half = 1 << (s - 1)
            np.minimum(table[s - 1, : len(flat) - half], table[s - 1, half:], out=table[s, : len(flat) - half])
        return np.minimum(table[self.level, self.left], table[self.level, self.right])
