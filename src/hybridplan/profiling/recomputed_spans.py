"""How a recomputed stage's transients compose from its layers measured alone.

[Note: the transients of a recomputed stage] Under full recompute (``"recompute": "full"``, every layer of the
stage checkpointed) only each layer's input survives between its forward and its backward; everything else a
layer's forward makes is freed at once and made again just before its backward. So a stage's forward, backward
and step transients are not sums over its layers, as they nearly are without recompute: each is the largest
transient of ONE layer, taken on the level the stage's other layers leave at that moment. With ``A, G`` a layer's
activation (its kept input) and gradient, and ``FT, FBT, BT, ST`` its forward, first-backward, later-backward and
step transients, all measured with the layer alone on a stage (every layer is profiled alone, so these are the
statistics ``M_i``), the stage ``[a, b)`` has:

- forward:  ``max_l FT_l + sum_{a<=k<l} A_k``  (the earlier layers' inputs are kept);
- first backward: ``max_l FBT_l + sum_{l<k<b} G_k - sum_{l+1<k<b} A_k``  (the later layers' gradients allocated,
  their kept inputs freed, but for the one that is ``l``'s output gradient's counterpart);
- later backward: ``max_l BT_l - sum_{l+1<k<b} A_k``;
- step: ``max_l ST_l``  (AdamW's temporaries are per parameter tensor).

Composed as sums of chain increments ``M_a(l) = Q(n..l) - Q(n..l-1)`` instead, these over-count after a costly
layer (an increment measured on a chain that started on a cheap layer carries the whole of the costly layer's
transient, which a stage that already holds a costlier layer does not get) and under-count in the other
direction: moe-tiny ``[1,4)`` recomputed data x2 was predicted +7.5%, MoE 1.3B's recomputed tensor stages
1.5 to 1.7 GiB under (benchmarks/recompute_composition, where the rule above is checked against the simulated
runtime transient by transient: exact on every moe-tiny span from its layers measured alone, but where the stage
holds the model's last layer, whose loss keeps 16 KiB more than the boundary its gradient replaces).
"""

from __future__ import annotations

import numpy as np

from hybridplan.profiling.quantities import INDEX

__all__ = ["RECOMPUTED_TRANSIENTS", "layer_max_table", "received_gradients"]

RECOMPUTED_TRANSIENTS: tuple[int, ...] = tuple(INDEX[name] for name in (
    "forward_transient", "first_backward_transient", "backward_transient", "step_transient"))
"""The quantity indices the rule composes (the others stay sums of ``M_a``)."""

_A, _G = INDEX["activation"], INDEX["gradient"]
_FT, _FBT, _BT, _ST = RECOMPUTED_TRANSIENTS


def _suffix_max(values: np.ndarray) -> np.ndarray:
    """``out[a] = max(values[a:])``: a stage ``[a, b)``'s maximum over its layers, for every ``a`` at once."""
    return np.maximum.accumulate(values[::-1])[::-1]


def received_gradients(alone: np.ndarray) -> np.ndarray:
    """``R[b]``: the bytes of the output gradient a stage ending before layer ``b`` receives, per micro-batch.

    The gradient has the shape of layer ``b``'s input, which a recomputed layer alone keeps as its whole
    activation: ``R[b] = A_b`` (same tensor shape and dtype, so the same bytes on any device and precision). The
    model's last layer keeps more (its loss saves the logits), so for ``b = L - 1`` the input of the layer before
    stands in (equal in a transformer's blocks; the profile records no boundary sizes to do better), and a stage
    ending the model receives none: ``R[L] = 0``."""
    L = alone.shape[0]
    out = np.zeros(L + 1)
    out[1:L] = alone[1:L, _A]
    if L >= 2:
        out[L - 1] = alone[L - 2, _A]
    return out


def layer_max_table(alone: np.ndarray) -> np.ndarray:
    """``[L, L+1, 4]``: the four transients of every recomputed span ``[a, b)`` of the model's ``L`` layers, from
    the layers' statistic vectors measured alone (``alone[l]``, over at least the eight quantities); NaN where
    ``b <= a`` and where a layer of the span has a NaN statistic (it was not measured alone).

    Under a backward, the level of the stage at layer ``l < b - 1`` is its own level with the later layers' inputs
    freed, their gradients allocated and the stage's received gradient ``R[b]`` held (layer ``l`` measured alone
    received its own, which its transient holds); layer ``b - 1`` alone is what the stage does first. For each end
    ``b`` the terms are rewritten with prefix sums so that the maximum over ``l in [a, b)`` is one suffix maximum
    for every start ``a``: ``O(L^2)``, as the spans are."""
    L = alone.shape[0]
    missing = np.concatenate([[0], np.cumsum(np.isnan(alone[:, :len(INDEX)]).any(axis=1))])
    alone = np.nan_to_num(alone, nan=0.0)
    received = received_gradients(alone)
    a_sum = np.concatenate([[0.0], np.cumsum(alone[:, _A])])
    g_sum = np.concatenate([[0.0], np.cumsum(alone[:, _G])])
    out = np.full((L, L + 1, len(RECOMPUTED_TRANSIENTS)), np.nan)
    for b in range(1, L + 1):
        out[:b, b, 0] = _suffix_max(alone[:b, _FT] + a_sum[:b]) - a_sum[:b]
        first, later = np.empty(b), np.empty(b)
        first[b - 1], later[b - 1] = alone[b - 1, _FBT], alone[b - 1, _BT]
        later_sums = a_sum[b] - a_sum[1:b] - received[b]  # sum_{l<k<b} A_k - R[b], for l = 0 .. b-2
        first[:b - 1] = alone[:b - 1, _FBT] + (g_sum[b] - g_sum[1:b]) - later_sums
        later[:b - 1] = alone[:b - 1, _BT] - later_sums
        out[:b, b, 1] = _suffix_max(first)
        out[:b, b, 2] = _suffix_max(later)
        out[:b, b, 3] = _suffix_max(alone[:b, _ST])
        out[:b, b][missing[b] - missing[:b] > 0] = np.nan
    return out
