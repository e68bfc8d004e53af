"""A profiled scenario's statistics at the plan's batch: spans looked up in original layers, scaled by batch.

A profile measures each scenario at two batch sizes, possibly on merged layers (profiling/merger.py); the memory
predictor needs a span's quantities in the model's own layers at the plan's batch. This module holds that step
(steps 1 and 2 of predict/memory.py's docstring): the look-up of a span, or of every span at once, in statistics
that may be on merged layers, and the straight line through the two profiled sizes (seed 000 III-B2) with its
one modelled exception, [Note: the first backward]; the floor a stage that ends the model puts under its backward
transients ([Note: the loss's backward floor] in profiling/loss_memory.py); and a data replica's per-row bytes
taken where the pipeline scenario measured them at its rows ([Note: a data replica's rows were profiled]). It
knows nothing of schedules, degrees or ZeRO, which the predictor and predict/zero_stage.py apply to what it
returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hybridplan.profiling.quantities import INDEX, QUANTITIES
from hybridplan.profiling.statistics import SpanStatistics

__all__ = ["PEAK", "span_in_units", "table_in_layers", "scaled_to_batch", "loss_floor", "loss_backward_bytes", "measured_at", "with_replica_rows",
           "EXTRAPOLATION_LIMIT", "extrapolation_note"]

PEAK = len(QUANTITIES)  # column of the measured peak in SpanStatistics vectors


def span_in_units(stats: SpanStatistics, start: int, stop: int) -> np.ndarray | None:
    """A span given in original layers, looked up in statistics that may be on merged layers."""
    if stats.bounds is None:
        return stats.span(start, stop)
    try:
        return stats.span(stats.bounds.index(start), stats.bounds.index(stop))
    except ValueError:  # not on the merged layers' boundaries
        return None


def table_in_layers(stats: SpanStatistics, num_layers: int, *, after_backward: bool = False) -> np.ndarray:
    """``[L, L+1, Q]`` span table in original layers (NaN where merged statistics cannot say); ``after_backward``:
    as :meth:`~hybridplan.profiling.statistics.SpanStatistics.all_spans`."""
    table = stats.all_spans(after_backward=after_backward)
    if stats.bounds is None:
        return table
    out = np.full((num_layers, num_layers + 1, table.shape[-1]), np.nan)
    b = np.array(stats.bounds)
    out[np.ix_(b[:-1], b)] = table
    return out


def _first_backward(v1: np.ndarray, v2: np.ndarray, target: np.ndarray, b1: int, b2: int, b: int) -> np.ndarray:
    """The first backward's transient at micro-batch ``b``: a maximum of two regimes, fitted piece by piece.

    [Note: the first backward] Back-propagating the first micro-batch allocates every gradient while it
    frees that micro-batch's activations, layer by layer, so its peak (above the level it starts from)
    is the larger of the start, where it is a later backward's transient ``TB``, and the end, where
    it is ``G - A + X`` with ``X`` the first layer's activation and backward transient. Measured on
    gpt-tiny (6 blocks): the end dominates at micro-batch 2, the start at 4 and 8, so a straight line
    through two profiled sizes misses (by 715 KiB at 8); each piece is linear in the batch, though.
    ``X`` is fitted through the profiled sizes where the end dominated (through the origin if only one
    did); where it never did, the start is kept. A size where the two tie counts as one where the end dominated:
    the end is then ``TB`` there too, and a line through both sizes keeps both measured values (through the origin
    from the other size alone, a ZeRO-3 first backward, whose ``TB`` holds the prefetched layer and ties it at the
    larger size, came out 18.7% high there: Llama-2-7B's blocks [3, 5) as data x2).
    """
    tb0, tb = INDEX["first_backward_transient"], INDEX["backward_transient"]
    ga = lambda v: v[..., INDEX["gradient"]] - v[..., INDEX["activation"]]  # noqa: E731
    x1, x2 = v1[..., tb0] - ga(v1), v2[..., tb0] - ga(v2)
    end1, end2 = v1[..., tb0] >= v1[..., tb], v2[..., tb0] >= v2[..., tb]
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(
            end1 & end2,
            x1 + (x2 - x1) * (b - b1) / (b2 - b1),
            np.where(end2, x2 * b / b2, np.where(end1, x1 * b / b1, -np.inf)),
        )
        return np.maximum(target[..., tb], ga(target) + x)


def scaled_to_batch(values: list[np.ndarray], sizes: list[SpanStatistics], *, global_batch_size: int,
                    microbatch_size: int) -> np.ndarray:
    """Linear fit through two profiled batch sizes, evaluated at the target batch (seed 000 III-B2): the two
    around the target's micro-batch, or the two nearest it beyond the profiled ones (a scenario profiled at a
    replica's rows too has three: profiling/campaign.py [Note: a replica's rows are measured]).

    ``values`` hold one array per profiled size whose LAST axis runs over the statistics (a span's
    vector, or a whole ``[L, L+1, Q]`` table).
    """
    ordered = sorted(zip(sizes, values), key=lambda p: p[0].microbatch_size)
    k = next((i for i in range(1, len(ordered)) if microbatch_size <= ordered[i][0].microbatch_size), len(ordered) - 1)
    (s1, v1), (s2, v2) = ordered[k - 1], ordered[k]
    b1, b2, b = s1.microbatch_size, s2.microbatch_size, microbatch_size
    t = (b - b1) / (b2 - b1)
    out = v1 + (v2 - v1) * t
    # The data share grows with the global batch, not the micro-batch.
    g = (global_batch_size - s1.batch_size) / (s2.batch_size - s1.batch_size)
    d = INDEX["data"]
    out[..., d] = v1[..., d] + (v2[..., d] - v1[..., d]) * g
    out[..., INDEX["first_backward_transient"]] = _first_backward(v1, v2, out, b1, b2, b)
    return out


def loss_floor(values: np.ndarray, loss_backward: Mapping[str, Sequence[float]] | None, rows: float) -> np.ndarray:
    """``values`` (a span's vector or a table of spans, statistics on the LAST axis, every span ending the model)
    with their first and later backward transients at least the loss's backward at ``rows`` rows per device.

    [Note: the loss's backward floor] (profiling/loss_memory.py): every backward of a stage that ends the model
    starts with the loss's, whose bytes are proportional to the rows (the logits'), so where the layer's own phase
    set both profiled sizes the straight line misses the loss's phase at a larger target. ``loss_backward``: the
    profile's measurement of the loss alone, ``{"samples": [n1, n2], "bytes": [b1, b2]}``, a straight line in the
    rows; None (a profile taken before it was recorded): ``values`` unchanged. NaN stays NaN.

    >>> v = np.zeros(len(QUANTITIES)); v[INDEX["backward_transient"]] = 99_328.0
    >>> int(loss_floor(v, {"samples": [1, 2], "bytes": [16_384, 32_768]}, 8)[INDEX["backward_transient"]])
    131072
    """
    if loss_backward is None:
        return values
    floor = loss_backward_bytes(loss_backward, rows)
    out = values.copy()
    for q in (INDEX["first_backward_transient"], INDEX["backward_transient"]):
        out[..., q] = np.maximum(values[..., q], floor)  # NaN (unpredictable) stays NaN
    return out


def loss_backward_bytes(loss_backward: Mapping[str, Sequence[float]], rows: float) -> float:
    """The loss's backward bytes at ``rows`` rows per device: the profile's straight line through its two
    measurements ([Note: the loss's backward floor]; :func:`loss_floor` raises the backwards to it)."""
    (n1, n2), (b1, b2) = loss_backward["samples"], loss_backward["bytes"]
    return b1 + (b2 - b1) * (rows - n1) / (n2 - n1)


def measured_at(samples: Sequence[float], values: Sequence[float], rows: float) -> float:
    """A quantity measured at increasing ``samples`` read at ``rows``: piecewise linear between them, the last two's
    line beyond them, the first value below them ([Note: the head's backward phase] in profiling/loss_memory.py).

    >>> measured_at([1, 2, 4, 8], [16, 16, 16, 32], 6), measured_at([1, 2, 4, 8], [16, 16, 16, 32], 16)
    (24.0, 64.0)
    """
    if rows <= samples[0]:
        return float(values[0])
    k = next((i for i in range(1, len(samples)) if rows <= samples[i]), len(samples) - 1)
    (x1, x2), (y1, y2) = samples[k - 1:k + 1], values[k - 1:k + 1]
    return float(y1 + (y2 - y1) * (rows - x1) / (x2 - x1))


_REPLICA_ROWS = [INDEX[name] for name in ("activation", "forward_transient", "backward_transient")]


def with_replica_rows(scaled: np.ndarray, pipeline: np.ndarray) -> np.ndarray:
    """A data scenario's ``scaled`` quantities with the per-row ones taken from ``pipeline``, the pipeline scenario's
    at the replica's rows (NaN there: kept as scaled); statistics on the LAST axis.

    [Note: a data replica's rows were profiled] Each replica of a data xd stage runs exactly what a pipeline-only
    device runs on its b/d rows: the whole stage's parameters, gradients and optimizer state, b/d rows of inputs,
    activations and transients; its gradient all-reduce leaves no buffer behind (the premise of [Note: a data stage
    wider than the profiled ones] in predict/memory.py). Measured: every quantity of the data x2 scenario at
    micro-batch 8 (4 rows a replica) equals the pipeline scenario's at micro-batch 4 but the data share and CAPTURE's
    peak (moe-tiny's MoE layer 1 alone, recomputed: activation 8,192, forward 320,512, first backward 650,048, later
    backward 535,360; gpt-tiny's head alone; benchmarks/extended_accuracy's recompute profiles). And a campaign
    profiles the pipeline scenario at micro-batches b/2 and b/4 (seed 000 III-A2), exactly the rows of a data x2
    and a data x4 replica at the target: there the per-row quantities were measured, and the data scenario's own
    line through b/4 and b/8 (x2) extrapolates them. That line misses where a transient is not linear in the rows:
    moe-tiny's MoE layer recomputed, later backward 333,216 and 535,360 bytes at 2 and 4 rows, the line 939,648 at
    8, the pipeline scenario 1,037,952 at 8, as the data stage measures (benchmarks/recompute_composition).
    So the activation and the forward and later backward transients are the pipeline scenario's at the replica's
    rows, the first backward's at least the later one's (its start regime, [Note: the first backward]; its end is
    still the data scenario's fit), and the data share, static bytes, gradients and step stay the data scenario's
    (its step holds the gradient all-reduce). A span the pipeline scenario composes is composed from its own
    chains (section 4 of docs/prediction.md), as the data scenario's are.

    >>> q = np.zeros(len(QUANTITIES) + 1); q[INDEX["backward_transient"]] = 939_648.0
    >>> p = np.full_like(q, np.nan); p[INDEX["backward_transient"]] = 1_037_952.0
    >>> out = with_replica_rows(q, p)
    >>> int(out[INDEX["backward_transient"]]), int(out[INDEX["first_backward_transient"]]), np.isnan(out[0])
    (1037952, 1037952, np.False_)
    """
    out = scaled.copy()
    measured = pipeline[..., _REPLICA_ROWS]
    out[..., _REPLICA_ROWS] = np.where(np.isnan(measured), scaled[..., _REPLICA_ROWS], measured)
    first, later = INDEX["first_backward_transient"], INDEX["backward_transient"]
    out[..., first] = np.maximum(out[..., first], out[..., later])
    return out


EXTRAPOLATION_LIMIT = 4.0
"""How far beyond the largest profiled batch a prediction goes before :func:`extrapolation_note` warns: a
campaign profiles B/2 and B/4 (seed 000 III-A2), so its own target is 2x the largest profiled batch; 4x is
twice as far as the campaign itself extrapolates."""


def extrapolation_note(stats: dict[tuple[str, int], list[SpanStatistics]], global_batch_size: int,
                       microbatch_size: int) -> str | None:
    """One line if the target batch lies far beyond the profiled ones (:data:`EXTRAPOLATION_LIMIT`), else None.

    The batch scaling is a straight line through two measured sizes; far beyond them nothing was
    measured, so the prediction is an extrapolation a user should know about (and may re-profile for).
    """
    sizes = [s for per_size in stats.values() for s in per_size]
    if not sizes:
        return None
    big_global = max(s.batch_size for s in sizes)
    big_micro = max(s.microbatch_size for s in sizes)
    ratio = max(global_batch_size / big_global, microbatch_size / big_micro)
    if ratio <= EXTRAPOLATION_LIMIT:
        return None
    return (f"warning: global batch {global_batch_size} (micro-batches of {microbatch_size}) is {ratio:.3g}x"
            f" the largest profiled ({big_global}, micro-batches of {big_micro}): the batch scaling is extrapolated"
            " that far from its two measured sizes; profile near this batch for a measured answer")
