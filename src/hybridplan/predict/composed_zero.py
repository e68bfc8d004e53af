"""ZeRO-2/3 of a stage composed from the unsharded stage each of its ranks runs (no ZeRO scenario profiled).

A replica of a ZeRO-2/3 ``data+tensor`` stage runs the tensor stage at the replica's batch with every tensor rank's
shards sharded again over its data group; no profile measures it. This module composes its quantities from the
unsharded stage's scaled tables and the shards' layout ([Note: ZeRO-3 composed from an unsharded stage] and, where
the stage recomputes, [Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py; ZeRO-2 replayed on them,
predict/zero2_replay.py). predict/zero_stage.py asks it for a data x tensor stage's peaks; the scenario-based ZeRO
of data stages stays there. A span's composition is kept per predictor (``MemoryPredictor.kept``): the search asks each span
with every later-stage count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from hybridplan.predict.batch_scaling import PEAK, measured_at
from hybridplan.predict.rank_replay import RankReplay
from hybridplan.predict.zero2_replay import (Zero2Transients, gathered_backward_transient, recomputed_first_backward,
                                            unsharded_backward_bound, zero2_rows)
from hybridplan.predict.zero3_transients import (RecomputedBackwards, first_backward_prefetch_floor, prefetched_bytes,
                                                 recomputed_backwards, reduce_scatter_floor, sharded_backward_floor,
                                                 sharded_forward_transient)
from hybridplan.predict.zero_layout import ZeroLayout
from hybridplan.profiling.quantities import INDEX

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["composed_zero3_quantities", "composed_zero3_replay", "composed_zero2_replay", "recomputed_moments",
           "recomputed_zero2_first", "recomputed_floors", "gathered_again", "scattered_gradients", "first_layer_scatter"]


def composed_zero3_quantities(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
                              layout: ZeroLayout, data: int) -> np.ndarray | None:
    """The quantities of a ZeRO-3 stage over ``data`` ranks composed from the unsharded stage ``kind`` x ``degree``
    that each rank runs (a replica of a data x tensor stage: the tensor stage at the replica's batch), whose
    parameters ``layout`` holds ([Note: ZeRO-3 composed from an unsharded stage] in predict/zero3_transients.py): the unsharded
    stage's, its forward by [Note: the sharded forward from the data stage] and its backwards by [Note: the sharded
    backward's floor] (``static``, ``gradient`` and the step are each rank's: :meth:`ZeroLayout.unsharded_shift`),
    under GPipe the later one without the prefetched layer ([Note: a backward after a backward]). None where the
    profile does not predict the unsharded stage, its prefixes or its suffixes."""
    q = predictor.kept(("zero3", predictor.span_class(start, stop), kind, degree, layout, data),
              lambda: _composed_zero3_quantities(predictor, start, stop, kind, degree, layout, data))
    return None if q is None else q.copy()


def _composed_zero3_quantities(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
                               layout: ZeroLayout, data: int) -> np.ndarray | None:
    """:func:`composed_zero3_quantities`, composed (not kept)."""
    q = predictor.span_quantities(start, stop, kind, degree)
    table = predictor._scaled_table(kind, degree)
    if q is None or table is None or predictor.method == "capture":
        return None
    prefixes, q = table[start, start + 1:stop + 1], q[:PEAK].copy()
    suffixes = {name: table[start:stop, stop, INDEX[name]] for name in ("first_backward_transient", "backward_transient")}
    if np.isnan(prefixes[:, :PEAK]).any() or any(np.isnan(v).any() for v in suffixes.values()):
        return None
    gathered = layout.gathered_bytes(start, stop, data)
    q[INDEX["forward_transient"]] = sharded_forward_transient(prefixes[:, INDEX["forward_transient"]].tolist(),
                                                              prefixes[:, INDEX["activation"]].tolist(), gathered,
                                                              keep=False)
    ending, head = None, None
    if stop == predictor.num_layers:  # [Note: the layers before the head] in predict/zero3_transients.py
        head, received = _head_phase(predictor, kind, degree)
        ending = _ending_backwards(table, start, stop, layout, data, head, received,
                                   gpipe=predictor.schedule == "gpipe")
    if predictor.recompute:  # [Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py
        moments = recomputed_moments(table, start, stop, layout, data)
        prefetch_later = predictor.schedule != "gpipe"
        if ending is not None and head is not None:  # [Note: the layers before the head], recomputed
            before = _moments_before_head(table, start, stop, layout, data, received)
            first, later = _recomputed_ending(table, moments, before, stop, gathered, head, ending,
                                              prefetch_later=prefetch_later)
        else:
            first, later = recomputed_floors(table, moments, start, stop, gathered, prefetch_later=prefetch_later,
                                             scattered=scattered_gradients(layout, start, stop, data))
            if ending is not None:  # and at least the layers before the head as not recomputed
                first, later = max(first, ending["first_backward_transient"]), max(later, ending["backward_transient"])
        q[INDEX["first_backward_transient"]], q[INDEX["backward_transient"]] = first, later
        return _first_layer_floored(q, layout, start, stop, data)
    if ending is not None:
        for name, value in ending.items():
            q[INDEX[name]] = value
        return _first_layer_floored(q, layout, start, stop, data)
    scattered = reduce_scatter_floor(suffixes["first_backward_transient"].tolist(), gathered,
                                     layout.layer_bytes(start, stop), layout.shard_bytes(start, stop, data),
                                     layout.scatter_extra(start, stop, data))
    for name, suffix in suffixes.items():
        q[INDEX[name]] = max(sharded_backward_floor(suffix.tolist(), gathered), scattered)
    if predictor.schedule == "gpipe":
        q[INDEX["backward_transient"]] -= prefetched_bytes(suffixes["backward_transient"].tolist(), gathered)
    return _first_layer_floored(q, layout, start, stop, data)


def _first_layer_floored(q: np.ndarray, layout: ZeroLayout, start: int, stop: int, data: int) -> np.ndarray:
    """``q`` with its backwards at least the model's first layer's reduce-scatter ([Note: the first layer's
    reduce-scatter] in :func:`first_layer_scatter`)."""
    for name, first in (("first_backward_transient", True), ("backward_transient", False)):
        q[INDEX[name]] = max(q[INDEX[name]], first_layer_scatter(layout, start, stop, data, first=first))
    return q


def _head_phase(predictor: MemoryPredictor, kind: str, degree: int) -> tuple[float | None, float]:
    """The head's backward phase of a ``kind`` x ``degree`` stage's rank ([Note: the head's backward phase] in
    profiling/loss_memory.py; None where the profile lacks it, or has it only for another recompute setting) and
    the bytes of the gradient it hands back (0 where not recorded: profiles before 28 Nov)."""
    heads = (predictor.head_backward or {}).get(str(degree))  # measured as the stage runs, recomputed or not
    if heads is None or heads.get("recompute", False) != predictor.recompute:
        return None, 0.0
    rows = predictor._rows(kind, degree)
    return measured_at(heads["samples"], heads["bytes"], rows), float(heads.get("input_bytes", 0)) * rows


def _ending_backwards(table: np.ndarray, start: int, stop: int, layout: ZeroLayout, data: int, head: float | None,
                      received: float = 0.0, *, gpipe: bool) -> dict[str, float]:
    """The first and later backward transients of a ZeRO-3 span over ``data`` ranks that ends the model, from the
    unsharded stage's scaled span ``table`` ([Note: the layers before the head] in predict/zero3_transients.py):
    the larger of the head's moment (its suffix, and ``head``, its own phase measured alone, with its gathered
    bytes and the layer before it prefetched; without ``head`` the suffix with them) and
    the floors of the span less the head, on the suffixes of ``[start, stop - 1)`` less the head's activations,
    with the head's gradient shard (first backward) and the head's reduce-scatter input (:func:`_head_input_held`),
    and without ``received`` (the gradient the head hands back) before the layer before the head; under GPipe the
    later backward without the prefetched layer ([Note: a backward after a backward])."""
    last, gathered = stop - 1, layout.gathered_bytes(start, stop, data)
    rest, g_head = gathered[:-1], gathered[-1]
    prev = next((size for size in reversed(rest) if size), 0)
    scatter = layout.scatter_extra(start, stop, data)
    held, extra = _head_input_held(gathered, scatter)
    out = {}
    for name, shard in (("first_backward_transient", layout.shard_bytes(last, stop, data)[0]), ("backward_transient", 0)):
        floor = scattered = -math.inf  # the span less the head: none where the head is alone
        suffix = _suffixes_less_head(table, start, stop, name, shard, received)
        if rest:
            shards = layout.shard_bytes(start, last, data) if shard else [0] * len(rest)  # later: in the level
            first_rest = _suffixes_less_head(table, start, stop, "first_backward_transient", shard, received)
            scattered = reduce_scatter_floor(first_rest, rest, layout.layer_bytes(start, last), shards, extra)
            if shard:  # a first backward: the later layers' shards, not their whole gradients (:func:`recomputed_floors`)
                suffix = [v - c for v, c in zip(suffix, scattered_gradients(layout, start, last, data))]
            floor = sharded_backward_floor(suffix, rest, extra=held)
        after_backward = gpipe and name == "backward_transient"  # nothing prefetched: [Note: a backward after a backward]
        fetched, before = (prefetched_bytes(suffix, rest) if rest else 0, 0) if after_backward else (0, prev)
        own = float(table[last, stop, INDEX[name]])
        if head is None:  # the loss's phase taken for the head's where the loss sets the suffix: an over-count
            moment = max(own + g_head + before, float(table[last, stop, INDEX["first_backward_transient"]]) + g_head
                         + before + scatter[-1])
        else:
            moment = max(own, head + g_head + before)  # its reduce-scatter's cast below its measured phase
        out[name] = max(moment, floor - fetched, scattered - fetched)
    return out


def _suffixes_less_head(table: np.ndarray, start: int, stop: int, name: str, shard: int,
                        received: float) -> list[float]:
    """The suffixes ``name`` of ``[start, stop - 1)`` in the unsharded stage's scaled span ``table`` as a rank of a
    ZeRO-3 span ending the model runs them ([Note: the layers before the head] in predict/zero3_transients.py):
    above a level without the head's activations, with ``shard`` (the head's gradient shard in a first backward),
    and before the layer before the head without ``received``: the profiled stage ending there holds the gradient
    it receives to its backward's end, the head's is freed once that layer has used it."""
    last = stop - 1
    freed = table[start, stop, INDEX["activation"]] - (table[start, last, INDEX["activation"]] if last > start else 0.0)
    suffix = table[start:last, last, INDEX[name]] - freed + shard
    suffix[:-1] -= received
    return suffix.tolist()


def _head_input_held(gathered: list[int], scatter: list[int]) -> tuple[list[int], list[int]]:
    """Per layer before the head of a span ending the model (``gathered``: its layers' gathered bytes, the head's
    last; ``scatter``: their reduce-scatter terms, :meth:`ZeroLayout.scatter_extra`), the head's reduce-scatter
    input held while it runs, and that with the layer's own term: the head's gathered bytes from the layer before
    the head down to the last one with parameters, whose post-backward
    frees it (FSDP2 frees it at the next unit's; a layer without parameters is none), or to the span's start where
    none has any. The MLP's layers 2-5 (Linear, ReLU, head): the input held while layer 2's backward runs, freed
    after its reduce-scatter (traced op by op, simulated devices)."""
    rest = gathered[:-1]
    with_params = [j for j, size in enumerate(rest) if size]
    frees = with_params[-1] if with_params else 0
    held = [gathered[-1] if j >= frees else 0 for j in range(len(rest))]
    return held, [e + h for e, h in zip(scatter, held)]


def _ending_prefetch_floor(table: np.ndarray, start: int, stop: int, layout: ZeroLayout, data: int,
                           received: float) -> float:
    """:func:`first_backward_prefetch_floor` of a ZeRO-3 span over ``data`` ranks that ends the model: on the span
    less the head (:func:`_suffixes_less_head`, the head's reduce-scatter input as :func:`_head_input_held` holds
    it), the head gathered again ([Note: a first backward after several forwards] and [Note: the layers before
    the head] in predict/zero3_transients.py). The whole span's suffixes there are the loss's phase."""
    last, gathered = stop - 1, layout.gathered_bytes(start, stop, data)
    if last == start:
        return -math.inf
    return first_backward_prefetch_floor(
        _suffixes_less_head(table, start, stop, "first_backward_transient", layout.shard_bytes(last, stop, data)[0],
                            received),
        gathered[:-1], layout.layer_bytes(start, last), layout.shard_bytes(start, last, data),
        _head_input_held(gathered, layout.scatter_extra(start, stop, data))[1], again=gathered[-1])


def recomputed_moments(table: np.ndarray, start: int, stop: int, layout: ZeroLayout, data: int, *,
                       shards_over: int | None = None) -> RecomputedBackwards:
    """Each layer's backward moment of a recomputed ZeRO-3 span over ``data`` ranks, from the unsharded recomputed
    stage's scaled span ``table`` (:func:`recomputed_backwards`; its suffixes known: the caller checked);
    ``shards_over``: the ranks the gradient shards are over where more (a wider stage's)."""
    first, later = (table[start:stop, stop, INDEX[name]].tolist()
                    for name in ("first_backward_transient", "backward_transient"))
    return recomputed_backwards(first, later, layout.gathered_bytes(start, stop, data), layout.layer_bytes(start, stop),
                                layout.shard_bytes(start, stop, shards_over or data))


def first_layer_scatter(layout: ZeroLayout, start: int, stop: int, data: int, *, first: bool,
                        kept: bool = False) -> float:
    """What a ZeRO-3 rank (``kept``: ZeRO-2) of a span starting the model holds above its level while the model's
    first layer's gradients are reduce-scattered; -inf for a span after it, or a first layer without parameters.

    [Note: the first layer's reduce-scatter] The model's first layer (a language model's embedding) takes no input
    that needs a gradient, and its backward is the span's last. Measured on simulated devices, its reduce-scatter
    holds at once the layer's gathered bytes ``G``, its whole gradients ``W`` and the reduce-scatter's output with
    its mixed-precision copy (``scatter_copies`` shards of ``G``): ``G + W + 3G/d`` in bf16, with the later layers'
    shards in a first backward; ZeRO-2 keeps ``G`` in its level (and frees the later layers'), so it holds that less
    the gathered bytes. The layer's own phase, from which the composition takes its moment, is its gradients and
    the received output gradient, below that: Llama-3-8B's embedding alone as data 2 x tensor 2 (bf16, ZeRO-2 or
    ZeRO-3, recomputed or not) was 11% to 18% low, Llama-3-70B's 5.27% (benchmarks/instant_planning); with the floor
    within 0.05%, the same spans with one or two decoder layers more unchanged (their blocks' moments are higher).
    Later layers are left to their moments: the same floor on every layer put recomputed Mixtral-8x7B blocks 8% to
    14% high (what a block frees before its reduce-scatter is not this).
    """
    g, whole, shards = (layout.gathered_bytes(start, stop, data), layout.layer_bytes(start, stop),
                        layout.shard_bytes(start, stop, data))
    if start or not g[0]:
        return -math.inf
    held = whole[0] + layout.scatter_copies * g[0] / data + (sum(shards[1:]) if first else 0)
    return held - sum(g[1:]) if kept else held + g[0]


def recomputed_zero2_first(table: np.ndarray | None, start: int, stop: int, layout: ZeroLayout, data: int,
                           ranks: int, several: bool) -> float | None:
    """A recomputed ZeRO-2 stage's first backward over ``ranks`` ([Note: a recomputed ZeRO-2 first backward] in
    predict/zero2_replay.py), from the unsharded recomputed stage's scaled span ``table`` at ``data`` ranks (its
    gathered bytes: a wider stage adds their growth after); ``several``: it follows two forwards or more. None where
    the suffixes are unknown."""
    if table is None:
        return None
    if np.isnan(table[start:stop, stop, [INDEX["first_backward_transient"], INDEX["backward_transient"]]]).any():
        return None
    gathered = layout.gathered_bytes(start, stop, data)
    moments = recomputed_moments(table, start, stop, layout, data, shards_over=ranks)
    return recomputed_first_backward(moments.first, gathered,
                                     gathered_again(moments, gathered) if several else -math.inf)


def recomputed_floors(table: np.ndarray, moments: RecomputedBackwards, start: int, stop: int, gathered: list[int], *,
                       prefetch_later: bool, scattered: list[float]) -> tuple[float, float]:
    """A recomputed ZeRO-3 span's first and later backward transients ([Note: a recomputed ZeRO-3 stage] in
    predict/zero3_transients.py): the largest layer's moment, with the prefetched layer where the backward follows
    a forward (a first backward always; a later one where ``prefetch_later``), and at least the floor of [Note: the
    sharded backward's floor] on the unsharded stage's suffixes (less the prefetched layer where it is not held).
    ``scattered[k]``: what the unsharded first suffix of layers ``k..`` holds beyond ZeRO-3, the later layers' whole
    gradients less their shards (:func:`scattered_gradients`), taken off before the first backward's floor. Left
    on, the floor held every later layer's whole gradients: Mixtral-8x7B's layers [0, 17) as data 4 x tensor 8
    (bf16, one row a replica) floored the first backward at 6,338,422,272 bytes where the layers' moments and the
    simulated device hold 4,161,093,632 (+9.14% on the device)."""
    out = []
    for name, values, prefetch in (("first_backward_transient", moments.first, True),
                                    ("backward_transient", moments.later, prefetch_later)):
        suffix = table[start:stop, stop, INDEX[name]].tolist()
        if name == "first_backward_transient":
            suffix = [v - c for v, c in zip(suffix, scattered)]
        floor = sharded_backward_floor(suffix, gathered) - (0 if prefetch else prefetched_bytes(suffix, gathered))
        out.append(max(floor, *(v + (p if prefetch else 0) for v, p in zip(values, moments.prefetched))))
    return out[0], out[1]


def gathered_again(moments: RecomputedBackwards, gathered: list[int]) -> float:
    """A recomputed ZeRO-3 span's first backward after two forwards or more: its first layer with parameters, with
    the previous micro-batch's last one gathered again ([Note: a first backward after several forwards] in
    predict/zero3_transients.py); -inf where fewer than two layers have parameters.

    >>> gathered_again(RecomputedBackwards([150, 100], [140, 100], [0, 40]), [40, 20])  # 150 + 20
    170
    """
    layers = [j for j, size in enumerate(gathered) if size]
    return moments.first[layers[0]] + gathered[layers[-1]] if len(layers) >= 2 else -math.inf


def scattered_gradients(layout: ZeroLayout, start: int, stop: int, data: int) -> list[float]:
    """Per layer ``k`` of ``[start, stop)``: the whole gradients of the layers after it less the shards ZeRO-3 over
    ``data`` ranks keeps of them, what an unsharded stage's first backward suffix of layers ``k..`` holds beyond a
    ZeRO-3 rank's ([Note: the sharded backward's floor] in predict/zero3_transients.py).

    >>> scattered_gradients(ZeroLayout([[[4, 2, 2]], [[4, 2, 2]], [[4, 4, 2]]]), 0, 3, 2)  # 16 - 8 and 32 - 16
    [24.0, 16.0, 0.0]
    """
    whole, shards = layout.layer_bytes(start, stop), layout.shard_bytes(start, stop, data)
    out, total = [], 0.0
    for w, sh in zip(reversed(whole), reversed(shards)):
        out.append(total)
        total += w - sh
    return out[::-1]


def _moments_before_head(table: np.ndarray, start: int, stop: int, layout: ZeroLayout, data: int,
                         received: float) -> RecomputedBackwards | None:
    """The backward moments of a recomputed ZeRO-3 span's layers before the head where the span ends the model
    (None where the head is alone): :func:`recomputed_backwards` on the suffixes of the span less the head as a
    rank runs them (:func:`_suffixes_less_head`), each with the head's reduce-scatter input it holds
    (:func:`_head_input_held`). The whole span's suffixes there are the loss's phase, which runs while no layer
    before the head is gathered: Llama-3-70B's layers [45, 82) as data 16 x tensor 8 (bf16, one row of 8,192 tokens
    a replica) composed each block's later moment as the loss's 2,101,346,304 bytes with its gathered bytes and the
    next one's, 2,791,915,520 with the prefetched block, where the simulated device holds the loss's phase alone
    (+7.95% on the device); less the head, the blocks' largest moment is 396,338,688 bytes above the level, and the
    device is predicted 0.21% low (its static bytes)."""
    last = stop - 1
    if last == start:
        return None
    gathered = layout.gathered_bytes(start, stop, data)
    held = _head_input_held(gathered, layout.scatter_extra(start, stop, data))[0]
    first = _suffixes_less_head(table, start, stop, "first_backward_transient", layout.shard_bytes(last, stop, data)[0],
                                received)
    later = _suffixes_less_head(table, start, stop, "backward_transient", 0, received)
    found = recomputed_backwards(first, later, gathered[:-1], layout.layer_bytes(start, last),
                                 layout.shard_bytes(start, last, data))
    return RecomputedBackwards([v + h for v, h in zip(found.first, held)], [v + h for v, h in zip(found.later, held)],
                               found.prefetched)


def _recomputed_ending(table: np.ndarray, moments: RecomputedBackwards, before: RecomputedBackwards | None, stop: int,
                       gathered: list[int], head: float, ending: dict[str, float], *,
                       prefetch_later: bool) -> tuple[float, float]:
    """A recomputed ZeRO-3 span's first and later backward transients where it ends the model ([Note: the layers
    before the head] in predict/zero3_transients.py): its layers' moments before the head (``before``:
    :func:`_moments_before_head`); the head's, the larger of its suffix (the loss's phase where the loss sets it)
    and ``head``, its own phase measured recomputed, with its gathered bytes and the prefetched layer (``moments``'
    last); and at least ``ending``, the span composed as not recomputed (in place of the whole span's floor, which
    adds the gathered bytes to the loss's phase)."""
    out = []
    for name, prefetch in (("first_backward_transient", True), ("backward_transient", prefetch_later)):
        own = max(float(table[stop - 1, stop, INDEX[name]]), head + gathered[-1] + (moments.prefetched[-1] if prefetch else 0))
        layers = [] if before is None else [v + (p if prefetch else 0) for v, p in zip(
            before.first if name == "first_backward_transient" else before.later, before.prefetched)]
        out.append(max(ending[name], own, *layers))
    return out[0], out[1]


def composed_zero2_replay(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
                          layout: ZeroLayout, data: int, several: bool) -> RankReplay | None:
    """The ranks of a ZeRO-2 stage over ``data`` ranks composed from an unsharded stage ([Note: ZeRO-3
    composed from an unsharded stage] in predict/zero3_transients.py): :func:`zero2_peak`'s replay of the composed ZeRO-3
    quantities (:func:`composed_zero3_quantities`) with the transients of [Note: predicting ZeRO-2 from the ZeRO-3
    scenario], each suffix's ZeRO-3 backward composed likewise, and at least ZeRO-3's where the stage recomputes or
    ends the model (``several``: as :func:`composed_zero3_replay`); None where not predicted."""
    composed = predictor.kept(("zero2", predictor.span_class(start, stop), kind, degree, layout, data),  # with and without ``several``
                              lambda: _composed_zero2(predictor, start, stop, kind, degree, layout, data))
    if composed is None:
        return None
    ranks, transients, total = composed
    replay = RankReplay.of(zero2=list(zero2_rows(ranks, transients, total)))
    if predictor.recompute or stop == predictor.num_layers:  # at least ZeRO-3's: [Note: a recomputed ZeRO-3
        # stage], [Note: the layers before the head] in predict/zero3_transients.py
        sharded = composed_zero3_replay(predictor, start, stop, kind, degree, layout, data, several)
        replay = replay if sharded is None else replay.with_plain(sharded)
    return replay


def _composed_zero2(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int, layout: ZeroLayout,
                    data: int) -> tuple[list[np.ndarray], Zero2Transients, int] | None:
    """What :func:`composed_zero2_replay` replays, whatever the later-stage count: each rank's quantities, the ZeRO-2
    transients and the stage's gathered bytes."""
    q = composed_zero3_quantities(predictor, start, stop, kind, degree, layout, data)
    plain = predictor.span_quantities(start, stop, kind, degree)
    table = predictor._scaled_table(kind, degree)
    if q is None or plain is None or table is None:
        return None
    gathered = layout.gathered_bytes(start, stop, data)
    total = sum(gathered)
    prefixes = table[start, start + 1:stop + 1]
    gathering = sharded_forward_transient(prefixes[:, INDEX["forward_transient"]].tolist(),
                                          prefixes[:, INDEX["activation"]].tolist(), gathered, keep=True)

    def gathered_backward(name: str) -> float:  # each suffix's composed ZeRO-3 backward, its layers gathered
        suffixes = [sharded_backward_floor(table[j:stop, stop, INDEX[name]].tolist(), gathered[j - start:])
                    for j in range(start, stop)]
        return min(gathered_backward_transient(suffixes, gathered, 0.0),
                   unsharded_backward_bound(float(plain[INDEX[name]]), gathered, data, copies=layout.scatter_copies))

    if predictor.recompute:  # [Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py
        moments = recomputed_moments(table, start, stop, layout, data)
        first = recomputed_first_backward(moments.first, gathered, -math.inf)  # kept for any count of forwards
        if first == -math.inf:  # no layer with parameters sets its suffix: the floor's, as not recomputed
            first = gathered_backward("first_backward_transient")
        later = max(v - sum(gathered[k:]) for k, v in enumerate(moments.later))
        q[INDEX["backward_transient"]] = recomputed_floors(table, moments, start, stop, gathered, prefetch_later=False,
                                                            scattered=scattered_gradients(layout, start, stop, data))[1]
    else:
        first, later = gathered_backward("first_backward_transient"), gathered_backward("backward_transient")
    first = max(first, first_layer_scatter(layout, start, stop, data, first=True, kept=True))  # [Note: the first
    later = max(later, first_layer_scatter(layout, start, stop, data, first=False, kept=True))  # layer's reduce-scatter]
    transients = Zero2Transients(gathering_forward=max(float(q[INDEX["activation"]]) + total, gathering),
                                 gathered_forward=float(plain[INDEX["forward_transient"]]),
                                 first_backward=first, gathered_backward=later)
    if predictor.schedule != "gpipe" and not predictor.recompute:  # ZeRO-2's backward that finds the layers resharded follows a backward
        q[INDEX["backward_transient"]] -= prefetched_bytes(table[start:stop, stop, INDEX["backward_transient"]].tolist(),
                                                           gathered)
    return _per_rank(q, layout, start, stop, data, foreach=predictor.device_type == "cuda"), transients, total


def composed_zero3_replay(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
                          layout: ZeroLayout, data: int, several: bool) -> RankReplay | None:
    """The ranks of a ZeRO-3 stage over ``data`` ranks composed from an unsharded stage
    (:func:`composed_zero3_quantities`), its first backward raised to FSDP2's spurious prefetch where it follows two
    forwards or more (``several``: :func:`~hybridplan.predict.rank_replay.several_forwards`; [Note: a first backward
    after several forwards] in predict/zero3_transients.py), each rank's chunks moving its ``static`` and step; None
    where not predicted."""
    ranks = _composed_zero3_ranks(predictor, start, stop, kind, degree, layout, data, several)
    return None if ranks is None else RankReplay.of(plain=ranks)


def _composed_zero3_ranks(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
                          layout: ZeroLayout, data: int, several: bool) -> list[np.ndarray] | None:
    """Each rank's quantities of :func:`composed_zero3_replay`'s stage; ``several``: its first backward follows two
    forwards or more."""
    q = composed_zero3_quantities(predictor, start, stop, kind, degree, layout, data)
    table = predictor._scaled_table(kind, degree)
    if q is None or table is None:
        return None
    if several and predictor.recompute:  # [Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py
        moments = recomputed_moments(table, start, stop, layout, data)
        q[INDEX["first_backward_transient"]] = max(float(q[INDEX["first_backward_transient"]]),
                                                   gathered_again(moments, layout.gathered_bytes(start, stop, data)))
    elif several:  # [Note: a first backward after several forwards] in predict/zero3_transients.py
        floor = (_ending_prefetch_floor(table, start, stop, layout, data, _head_phase(predictor, kind, degree)[1])
                 if stop == predictor.num_layers else
                 first_backward_prefetch_floor(table[start:stop, stop, INDEX["first_backward_transient"]].tolist(),
                                               layout.gathered_bytes(start, stop, data), layout.layer_bytes(start, stop),
                                               layout.shard_bytes(start, stop, data),
                                               layout.scatter_extra(start, stop, data)))
        q[INDEX["first_backward_transient"]] = max(float(q[INDEX["first_backward_transient"]]), floor)
    return _per_rank(q, layout, start, stop, data, foreach=predictor.device_type == "cuda")


def _per_rank(q: np.ndarray, layout: ZeroLayout, start: int, stop: int, data: int, *,
              foreach: bool) -> list[np.ndarray]:
    """The composed stage's quantities on each of its ``data`` ranks: the unsharded stage's ``static``,
    ``gradient`` and step moved to the rank's chunks (:meth:`ZeroLayout.unsharded_shift`); with ``foreach`` (CUDA
    devices) the step at least the rank's stored shards.

    [Note: a ZeRO-3 step on CUDA] AdamW steps a ZeRO-3 rank's fp32 shards with its foreach kernels on CUDA devices
    (torch's default there; not on CPU, where the two temporaries of the largest chunk were measured), which hold a
    temporary of every shard at once: the data ZeRO-3 scenario's step measures the stage's stored shard bytes exactly
    (Mixtral-8x7B's [17, 19) at data x4, bf16: 2,902,540,288 bytes both). Shifted from the unsharded stage's step
    (its own step is per parameter) it was far below: Mixtral's [17, 34) as data 4 x tensor 8, 117,444,608 bytes
    composed, 2,920,902,656 simulated."""
    out = []
    for r in range(data):
        static, gradient, step = layout.unsharded_shift(start, stop, data, r)
        v = q.copy()
        v[INDEX["static"]] += static
        v[INDEX["gradient"]] += gradient
        v[INDEX["step_transient"]] += step
        if foreach:
            v[INDEX["step_transient"]] = max(float(v[INDEX["step_transient"]]), layout.stored_bytes(start, stop, data))
        out.append(v)
    return out
