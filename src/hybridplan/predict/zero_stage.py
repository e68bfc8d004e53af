"""A ZeRO stage's per-rank peaks, predicted from a memory predictor's profile.

predict/zero_layout.py holds what ZeRO shards (the layout maths from the parameters' shapes) and
predict/zero3_transients.py and predict/zero2_replay.py the rules, with their Notes ([Note: predicting ZeRO from a
profile] in predict/zero_layout.py and those it names); this module applies them to the profiled scenarios' quantities
that a :class:`~hybridplan.predict.memory.MemoryPredictor` scales to the plan's batch: a ZeRO-1 stage as its data (or,
under data x tensor, tensor) scenario with each rank's ``static`` and step transient moved, ZeRO-3 from the
``data<d>-zero3`` scenario with the fp32 rules applied, ZeRO-2 replayed from both scenarios; a ZeRO-2/3 data x tensor
stage, which no scenario measures, is composed from the unsharded tensor stage by predict/composed_zero.py. The
functions take the predictor (its statistics, scaled tables and targets) rather than living in it, so that memory.py
keeps the unsharded composition (scaling, degree fits, composite stages) and this module the ZeRO one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from hybridplan.plan import StagePlan
from hybridplan.predict.batch_scaling import PEAK, loss_backward_bytes, loss_floor, span_in_units
from hybridplan.predict.composed_zero import (composed_zero2_replay, composed_zero3_replay, gathered_again,
                                             recomputed_floors, recomputed_moments, recomputed_zero2_first,
                                             scattered_gradients)
from hybridplan.predict.rank_replay import RankReplay, forwards_first, several_forwards
from hybridplan.predict.zero2_replay import (Zero2Transients, gathered_backward_transient, kept_forward_transient,
                                            unsharded_backward_bound, zero2_rows)
from hybridplan.predict.zero3_transients import (loss_phases, prefetched_bytes, sharded_backward_floor,
                                                 sharded_forward_transient)
from hybridplan.predict.zero_layout import ZeroLayout
from hybridplan.profiling.quantities import INDEX
from hybridplan.profiling.statistics import SpanStatistics

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["zero_peaks", "zero_tensor_peaks", "zero_replay", "kept_replay", "depends_on_forwards", "tensor_shards",
           "zero_ranks"]


def zero_peaks(predictor: MemoryPredictor, start: int, stop: int, kind: str, zero: int, degree: int,
               stages_after: int) -> list[float] | None:
    """Each rank's predicted peak of a ZeRO stage (None if the profile cannot say; [Note: predicting ZeRO from a
    profile] in predict/zero_layout.py): the profiled stage's quantities with the rank's ``static`` and step transient,
    replayed; a fitted degree moves the fitted peak by the static difference alone."""
    return _replayed(predictor, start, stop, kind, zero, degree, 0, stages_after)


def zero_tensor_peaks(predictor: MemoryPredictor, start: int, stop: int, zero: int, degree: int, tensor_degree: int,
                      stages_after: int) -> list[float] | None:
    """Each data-group rank's predicted peak of a ZeRO-1, ZeRO-2 or ZeRO-3 data x tensor stage of ``degree`` devices (every
    tensor rank alike; [Note: ZeRO-1 of a data x tensor stage] in predict/zero_layout.py, [Note: ZeRO-3 composed
    from an unsharded stage] and, recomputed, [Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py), or
    None where the profile cannot say: no shard shapes recorded at ``tensor_degree``, or a batch the replicas cannot
    split."""
    return _replayed(predictor, start, stop, "data+tensor", zero, degree, tensor_degree, stages_after)


def _replayed(predictor: MemoryPredictor, start: int, stop: int, kind: str, zero: int, degree: int,
              tensor_degree: int, stages_after: int) -> list[float] | None:
    """:func:`zero_replay`'s ranks replayed at a position, the replay kept for the span's other positions; a 1F1B
    position that runs every forward first as under GPipe ([Note: a 1F1B stage that runs every forward first] in
    predict/rank_replay.py)."""
    if forwards_first(predictor.schedule, stages_after, predictor.num_microbatches):
        predictor = predictor.retargeted(schedule="gpipe")
    several = several_forwards(predictor.schedule, stages_after, predictor.num_microbatches)
    replay = kept_replay(predictor, start, stop, kind, zero, degree, tensor_degree, several)
    return None if replay is None else replay.peaks(predictor.schedule, stages_after, predictor.num_microbatches)


def kept_replay(predictor: MemoryPredictor, start: int, stop: int, kind: str, zero: int, degree: int,
                tensor_degree: int, several: bool) -> RankReplay | None:
    """:func:`zero_replay`, made once per predictor and span class (:meth:`MemoryPredictor.span_class`): the
    positions of a span, the spans of a class, and a search's stage tables and plan predictions all ask it."""
    key = ("zero replay", predictor.span_class(start, stop), kind, zero, degree, tensor_degree,
           depends_on_forwards(predictor, kind, zero) and several)
    replay: RankReplay | None = predictor.kept(key, lambda: zero_replay(
        predictor, start, stop, kind, zero, degree, tensor_degree, several=several))
    return replay


def depends_on_forwards(predictor: MemoryPredictor, kind: str, zero: int) -> bool:
    """Whether the ranks of a ZeRO stage of ``kind`` differ with ``several`` (:func:`~hybridplan.predict.rank_replay.
    several_forwards`): a composed ZeRO-2/3 stage's first backward, and a recomputed ZeRO-2/3 data stage's ([Note: a
    recomputed ZeRO-3 stage] in predict/zero3_transients.py, [Note: a recomputed ZeRO-2 first backward])."""
    return (kind == "data+tensor" and zero in (2, 3)) or (kind == "data" and zero in (2, 3) and predictor.recompute)


def zero_replay(predictor: MemoryPredictor, start: int, stop: int, kind: str, zero: int, degree: int,
                tensor_degree: int = 0, *, several: bool = True) -> RankReplay | None:
    """The ranks of a ZeRO stage as rows to replay at any position ([Note: a ZeRO stage's rows are the same at every
    position] in predict/rank_replay.py): a data stage's from its ZeRO scenarios (:func:`zero_peaks`), a data x
    tensor stage's (``kind="data+tensor"``, ``degree`` devices of ``tensor_degree``) composed from its tensor stage
    (:func:`zero_tensor_peaks`); ``several``: its first backward follows two forwards or more. None where the profile
    cannot say."""
    if kind == "data+tensor":
        layout, replica = tensor_shards(predictor, tensor_degree), predictor._replica(degree, tensor_degree)
        if zero not in (1, 2, 3) or layout is None or replica is None:
            return None
        data = degree // tensor_degree
        if zero in (2, 3):  # [Note: ZeRO-3 composed from an unsharded stage] in predict/zero3_transients.py
            composed = composed_zero2_replay if zero == 2 else composed_zero3_replay
            return composed(replica, start, stop, "tensor", tensor_degree, layout, data, several)
        return _shifted(replica, start, stop, "tensor", tensor_degree, layout.shifts(start, stop, zero, data))
    source, whole = predictor._zero_source(kind, zero), predictor.zero_layout
    if source is None or whole is None:
        return None
    wider = predictor._wider_data("data-zero3", degree) if zero in (2, 3) else None
    if zero == 2:
        if wider is not None and predictor._wider_data("data", degree) is not None:  # the same Note, ZeRO-2's replay
            narrow, profiled = wider
            return _zero2_replay(narrow, start, stop, profiled, over=degree, several=several)
        return _zero2_replay(predictor, start, stop, degree, several=several)
    if wider is not None:  # [Note: a ZeRO-3 stage wider than the profiled ones]
        narrow, profiled = wider
        return _shifted(narrow, start, stop, source, profiled,
                        [whole.wider_zero3_shift(start, stop, profiled, degree, r) for r in range(degree)],
                        partial(_wider_zero3_quantities, narrow, over=degree, several=several))
    refine = None
    if zero == 3:
        refine = (partial(_zero3_quantities, predictor, several=several) if _ruled(predictor, stop)
                  else partial(_unruled_quantities, predictor))
    return _shifted(predictor, start, stop, source, degree, whole.shifts(start, stop, zero, degree), refine)


def tensor_shards(predictor: MemoryPredictor, tensor_degree: int) -> ZeroLayout | None:
    """The layout of one tensor rank's shards at ``tensor_degree`` (:meth:`ZeroLayout.of_tensor_shards`); None
    without parameter shapes or where the profile did not record that degree."""
    return None if predictor.zero_layout is None else predictor.zero_layout.of_tensor_shards(tensor_degree)


def _shifted(predictor: MemoryPredictor, start: int, stop: int, kind: str, degree: int,
             shifts: Sequence[tuple[int, ...]],
             refine: Callable[[int, int, int, np.ndarray], np.ndarray] | None = None) -> RankReplay | None:
    """The ranks of the profiled stage ``kind`` x ``degree`` with its ``static``, step transient and (a third
    element, if any) ``gradient`` moved by each shift (one per device): its quantities, replayed with them; a
    fitted degree (or CAPTURE's peak statistic) moves the peak by the static shift alone. ``refine`` (ZeRO-3's
    rules) rewrites the quantities before the replay."""
    measured = (kind, degree) in predictor.stats or predictor._wider_data(kind, degree) is not None
    q = predictor.span_quantities(start, stop, kind, degree) if measured else None
    if q is None or predictor.method == "capture":
        return RankReplay.positional(lambda after: predictor.stage_memory(start, stop, kind, degree, after),
                                     [shift[0] for shift in shifts])
    if refine is not None:
        q = refine(start, stop, degree, q)
    rows: dict[tuple[int, ...], np.ndarray] = {}  # a stage's ranks mostly hold equal shares
    for shift in dict.fromkeys(shifts):
        rows[shift] = v = np.array(q[:PEAK], dtype=float)
        for name, moved in zip(("static", "step_transient", "gradient"), shift):
            v[INDEX[name]] += moved
    return RankReplay.of(plain=[rows[shift] for shift in shifts])


def zero_ranks(predictor: MemoryPredictor, stage: StagePlan) -> tuple[ZeroLayout | None, int, Callable[[int], int]]:
    """What shards a ZeRO stage's state, over how many ranks, and each device's rank there: the stage's
    parameters over all its devices for a data stage, a tensor rank's shards over its data group for a data x
    tensor stage (a group's ranks follow the global ranks: dist.new_group sorts them)."""
    if stage.kind != "data+tensor":
        return predictor.zero_layout, stage.degree, sorted(stage.devices).index
    t = stage.tensor_degree
    return (tensor_shards(predictor, t), stage.data_degree,
            lambda device: sorted(stage.data_group(stage.devices.index(device) % t)).index(device))


def _ruled(predictor: MemoryPredictor, stop: int) -> bool:
    """Whether a ZeRO-3 data stage ending at ``stop`` takes the ZeRO-3 rules (:func:`_zero3_quantities`) or its
    scenario's quantities as they stand: in mixed precision not where it holds the model's last layer, whose
    loss rules ([Note: the loss runs outside every FSDP unit] in predict/zero3_transients.py) were measured in
    fp32 and, applied there in bf16 while this was decided, predicted gpt-tiny's layers 7-10 on 2 ranks +5.68%
    (1F1B) and +2.39% (GPipe) high, where the scenario's own quantities are +1.85% and +0.45% (benchmarks/zero_bf16
    ``--models gpt-tiny --spans 7-10 --kinds data --zero 3``; [Note: the reduce-scatter in mixed precision])."""
    layout = predictor.zero_layout
    return layout is not None and (not layout.mixed or stop < predictor.num_layers)


def _loss_floored(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray) -> np.ndarray:
    """A ZeRO-3 span's scenario quantities ``q`` as they stand (a stage :func:`_ruled` leaves unruled), with the
    loss's backward floor where the span ends the model: the loss runs outside every FSDP unit and holds what a data
    device holds, so its backward's bytes at the replica's rows are under every backward there ([Note: the loss's
    backward floor]). Without it (the floor was applied only inside the rules) Llama-2-7B's last decoder layer and
    head as data x2 ZeRO-3 in bf16 were predicted 8.73% low: the scenario's line through 1 and 2 rows a replica, where
    the head's phase and then the loss's set the later backward, extrapolated to 4 rows short of the loss's 2 GB
    (benchmarks/instant_planning)."""
    if stop != predictor.num_layers:
        return q
    return loss_floor(q, predictor.loss_backward, predictor._rows("data-zero3", degree))


def scatter_input_floor(later_backward: Sequence[float], after_activation: Sequence[float],
                        gathered: Sequence[int]) -> float:
    """The least a ZeRO-3 later backward of a span holds above its level, from its prefixes run as stages of their own
    (:func:`_unruled_quantities`): ``later_backward[j]``, the prefix of its first ``j + 1`` layers' later backward;
    ``after_activation[j]``, the activations of the layers after that prefix; ``gathered[k]``: layer ``k``'s gathered
    bytes, the size of its reduce-scatter input. The prefix runs once the layers after it freed their activations,
    holding the next layer's reduce-scatter input. NaN terms are skipped (-inf where none is known).

    >>> scatter_input_floor([100.0, 300.0], [40.0, 10.0], [5, 7, 20])  # 300 - 10 + 20 (the last layer's input)
    310.0
    """
    known = [b - a + g for b, a, g in zip(later_backward, after_activation, gathered[1:])
             if not (math.isnan(b) or math.isnan(a))]
    return max(known, default=-math.inf)


def _unruled_quantities(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray) -> np.ndarray:
    """A ZeRO-3 span's scenario quantities as they stand (:func:`_ruled` leaves it unruled), with the loss's backward
    floor (:func:`_loss_floored`) and the reduce-scatter input a later backward holds between its parts.

    A later backward of ``[start, stop)`` runs ``[start, b)``'s backward once ``[b, stop)``'s activations are freed,
    holding layer ``b``'s reduce-scatter input (FSDP2 keeps one until the next layer's post-backward: [Note: a
    recomputed ZeRO-3 stage] in predict/zero3_transients.py), which the scenario's span ``[start, b)``, a stage of its
    own, never held: so at least ``B(start, b) - A(b, stop) + gathered(b)``. Mixtral-8x7B's two blocks and head as
    data x4 ZeRO-3 recomputed in bf16: 8,889,843,200 from the spans ([Note: a composed span holds at least its
    measured parts] in profiling/statistics.py) + the head's 262,144,000 = 9,151,987,200 bytes, the simulated device
    9,151,995,904 (-1.19% on the device before)."""
    q = _loss_floored(predictor, start, stop, degree, q)
    table, layout = predictor._scaled_table("data-zero3", degree), predictor.zero_layout
    if table is None or layout is None:
        return q
    i, act = INDEX["backward_transient"], INDEX["activation"]
    floor = scatter_input_floor(table[start, start + 1:stop, i].tolist(), table[start + 1:stop, stop, act].tolist(),
                                layout.gathered_bytes(start, stop, degree))
    if not math.isnan(q[i]):
        q[i] = max(q[i], floor)
    return q


def _zero3_quantities(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray, *,
                      several: bool = True) -> np.ndarray:
    """A ZeRO-3 span's scenario quantities ``q`` with the rules applied: its forward transient from the
    data stage's prefixes, its backwards raised to their floor (``several``: the first one follows two forwards or
    more), and under GPipe its later backward without the prefetched layer ([Note: predicting ZeRO from a profile]
    in predict/zero_layout.py)."""
    q = _floored_backwards(predictor, start, stop, degree, q.copy(), several=several)
    if predictor.schedule == "gpipe":
        q[INDEX["backward_transient"]] -= _unfetched(predictor, start, stop, degree)
    forward = _sharded_forward(predictor, start, stop, degree, keep=False,
                               last_added=_last_forward_added(predictor, stop, degree, kept=False))
    if forward is not None:
        q[INDEX["forward_transient"]] = forward
    return _loss_floored(predictor, start, stop, degree, q)  # the loss holds nothing gathered


def _wider_zero3_quantities(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray, *,
                            over: int, several: bool = True) -> np.ndarray:
    """A ZeRO-3 span's quantities over ``over`` ranks from the scenario over ``degree`` (``q``, scaled to the
    replica's rows): its rules applied as at ``degree`` (fp32), then every transient raised by the most a layer's
    gathered bytes grow from ``degree`` to ``over`` ranks.

    [Note: a ZeRO-3 stage wider than the profiled ones] ``hybridplan profile --zero`` profiles ZeRO-3 up to a
    node's devices, so ZeRO-3 (FSDP) across nodes has a degree no profile measured, and a fit across degrees
    would let every byte fall with the degree (activations do not). Each of its D ranks runs what a rank of the
    widest profiled ZeRO-3 stage (d ranks) runs on the same rows per micro-batch ([Note: a data stage wider than
    the profiled ones] in predict/memory.py): the same activations, received buffers and schedule position, the
    same layers all-gathered whole one (forward) or two (backward, the next prefetched) at a time. What differs
    is a function of the parameter shapes (:meth:`~hybridplan.predict.zero_layout.ZeroLayout.wider_zero3_shift`):
    the stored chunks and their reduce-scattered gradients (padded to the first rank's), the AdamW state of the
    rank's own chunks, the step's two temporaries of its largest chunk; and the gathered bytes, whose padding
    (each parameter as D chunks of ``ceil(dim0 / D)`` rows) can grow with D: every transient is raised by the
    largest growth of one layer, a bound where two layers are gathered at once and their rows both pad. So the
    stage is the d stage at the global batch ``B * d / D``, moved by these, under the same rules as at d (ZeRO-2
    too: its replay from the data and ZeRO-3 scenarios at d, with the layers it keeps gathered counted at D). One
    thing is kept at d's size: a first backward's transient holds the gradient shards reduce-scattered before its
    peak, which the span statistics do not place, so a peak set there errs high by at most the shards' difference
    (tests/predict/test_zero_stage.py: the MLP's layers 0-2 over 4 ranks from 2, exactly one layer's shard high,
    1,056 bytes).
    Measured (tests/predict/test_wider_data.py, the MLP's ZeRO-3 over 4 and 8 ranks on two nodes from data2-zero3,
    simulated devices): 1F1B to the byte on every rank (the head's 10 rows padded to 12 and 16: +264 and +792
    bytes); GPipe 412 and 396 bytes high (1.9%, 2.1%), below the 2,012 the x2 stage's own prediction errs by.
    benchmarks/extended_accuracy's data x8 ZeRO-3 stages: wresnet-tiny to the byte (1F1B) and +1.38% (GPipe),
    gpt-tiny +3.40% and +4.74%: the data4-zero3 scenario's own error on the composed whole-model span (its
    first backward composed 38% high, hidden at x4 by the later backward that holds the gradients; at x8 the
    shards shrink and it sets the peak), not this composition's (docs/prediction.md)."""
    layout = predictor.zero_layout
    out = (_zero3_quantities(predictor, start, stop, degree, q.copy(), several=several) if _ruled(predictor, stop)
           else _unruled_quantities(predictor, start, stop, degree, q.copy()))
    if layout is None:
        return out
    growth = max((wide - narrow for wide, narrow in zip(layout.gathered_bytes(start, stop, over),
                                                        layout.gathered_bytes(start, stop, degree))), default=0)
    for name in ("forward_transient", "first_backward_transient", "backward_transient"):
        out[INDEX[name]] += growth
    return out


def _last_forward_added(predictor: MemoryPredictor, stop: int, degree: int, *, kept: bool) -> float | None:
    """What a sharded forward adds at the model's last layer to the data stage's transient there ([Note: the loss
    runs outside every FSDP unit] in predict/zero3_transients.py), None where the span ends before it or its phases
    are unknown: the head's phase holds its gathered bytes twice (the all-gather's buffer and the copy), the loss's
    none under ZeRO-3 and, ``kept`` (ZeRO-2, which reshards nothing after the forward), the gathered head once
    (twice put Llama-3-70B's head alone as data x8 ZeRO-2 9.62% high: benchmarks/instant_planning)."""
    head = _loss_phases(predictor, degree, "forward_transient", 2) if stop == predictor.num_layers else None
    if head is None:
        return None
    (module, loss), gathered = head, _last_gathered(predictor, degree)
    return 2 * gathered if loss == -math.inf else max(module + 2 * gathered, loss + kept * gathered) - max(module, loss)


def _last_gathered(predictor: MemoryPredictor, degree: int) -> int:
    """The model's last layer's gathered bytes over ``degree`` ranks (0 without parameter shapes)."""
    layout, last = predictor.zero_layout, predictor.num_layers
    return 0 if layout is None else layout.gathered_bytes(last - 1, last, degree)[0]


def _loss_phases(predictor: MemoryPredictor, degree: int, name: str, copies: int) -> tuple[float, float] | None:
    """The model's last layer's ``(head, loss)`` phases of transient ``name`` at the target batch, from that layer
    measured alone in the data and ZeRO-3 scenarios (:func:`~hybridplan.predict.zero3_transients.loss_phases`; FSDP holds
    ``copies`` x its gathered bytes in the head's phase); None where either scenario lacks it at two sizes or the
    layer has no parameters ([Note: the loss runs outside every FSDP unit] in predict/zero3_transients.py)."""
    gathered = _last_gathered(predictor, degree)
    data, zero3 = predictor.stats.get(("data", degree)), predictor.stats.get(("data-zero3", degree))
    if not gathered or not data or not zero3:
        return None
    last, i = predictor.num_layers - 1, INDEX[name]

    def alone(stats: list[SpanStatistics]) -> dict[int, float]:
        found = {s.microbatch_size: span_in_units(s, last, last + 1) for s in stats}
        return {b: float(v[i]) for b, v in found.items() if v is not None and not np.isnan(v[i])}

    plain, sharded = alone(data), alone(zero3)
    sizes = sorted(b for b in plain if b in sharded)[:2]
    if len(sizes) < 2:
        return None
    return loss_phases(sizes, [plain[b] for b in sizes], [sharded[b] for b in sizes], copies * gathered,
                       predictor.microbatch_size)


def _kept_zero3_forward(table: np.ndarray, start: int, stop: int, gathered: list[int]) -> float:
    """ZeRO-2's gathering forward from the ZeRO-3 scenario's scaled span ``table`` (:func:`~hybridplan.predict.
    zero2_replay.kept_forward_transient`)."""
    fwd, act = INDEX["forward_transient"], INDEX["activation"]
    return kept_forward_transient(table[start, start + 1:stop + 1, fwd].tolist(),
                                  [float(table[k, k + 1, fwd]) for k in range(start, stop)],
                                  [0.0, *table[start, start + 1:stop, act].tolist()], gathered)


def _sharded_forward(predictor: MemoryPredictor, start: int, stop: int, degree: int, *, keep: bool,
                     last_added: float | None = None) -> float | None:
    """A ZeRO-3 forward's transient (``keep``: ZeRO-2's gathering forward) from the data scenario's prefixes
    ([Note: the sharded forward from the data stage] in predict/zero3_transients.py); None where they are unknown.
    ``last_added``: what FSDP adds at the span's last layer, the model's ([Note: the loss runs outside every FSDP
    unit] in predict/zero3_transients.py)."""
    if predictor.zero_layout is None or ("data", degree) not in predictor.stats:
        return None
    table = predictor._scaled_table("data", degree)  # every span at once: the search asks for every span
    prefixes = None if table is None else table[start, start + 1:stop + 1]
    if prefixes is None or np.isnan(prefixes[:, :PEAK]).any():
        return None
    return sharded_forward_transient(prefixes[:, INDEX["forward_transient"]].tolist(),
                                     prefixes[:, INDEX["activation"]].tolist(),
                                     predictor.zero_layout.gathered_bytes(start, stop, degree), keep=keep,
                                     last_added=last_added)


def _floored_backwards(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray, *,
                       several: bool = True) -> np.ndarray:
    """``q`` (a ZeRO-3 span's quantities) with its backward transients raised to their floor from the data
    scenario's suffixes ([Note: the sharded backward's floor] in predict/zero3_transients.py), where those are known; at the
    model's last layer from its head's and loss's phases ([Note: the loss runs outside every FSDP unit] in
    predict/zero3_transients.py); recomputed, each layer's moment, and with ``several`` (the first backward follows
    two forwards or more) the span's first layer with its last one gathered again ([Note: a first backward after
    several forwards] there)."""
    table = predictor._scaled_table("data", degree, refined=False)  # the head's phase apart from the loss's
    if table is None or predictor.zero_layout is None:
        return q
    gathered = predictor.zero_layout.gathered_bytes(start, stop, degree)
    # a first backward of the data stage holds the whole gradients of the suffix's later layers, which ZeRO-3 has
    # reduce-scattered into shards by then ([Note: the sharded backward's floor])
    scattered = np.array(scattered_gradients(predictor.zero_layout, start, stop, degree))
    out = q.copy()
    for name in ("first_backward_transient", "backward_transient"):
        suffix = table[start:stop, stop, INDEX[name]]
        if name == "first_backward_transient":
            suffix = suffix - scattered
        loss = _loss_phases(predictor, degree, name, 1) if stop == predictor.num_layers else None
        if not np.isnan(suffix).any():
            out[INDEX[name]] = max(out[INDEX[name]], sharded_backward_floor(suffix.tolist(), gathered, loss=loss))
    suffixes = table[start:stop, stop, [INDEX["first_backward_transient"], INDEX["backward_transient"]]]
    if predictor.recompute and stop < predictor.num_layers and not np.isnan(suffixes).any():
        # [Note: a recomputed ZeRO-3 stage]: each layer's moment (its own phase, gathered bytes, the next layer's
        # reduce-scatter input), as the data x tensor stages compose them (predict/composed_zero.py), under the
        # profile's later backwards (after a forward: the layer before prefetched; GPipe's is taken off in
        # :func:`_zero3_quantities`). Without it Llama-2-7B's layers 20-24 as data x2 ZeRO-3 recomputed were
        # 3.59% low: the suffix floor misses the next layer's reduce-scatter input (benchmarks/instant_planning).
        moments = recomputed_moments(table, start, stop, predictor.zero_layout, degree)
        first, later = recomputed_floors(table, moments, start, stop, gathered, prefetch_later=True,
                                         scattered=scattered.tolist())
        if several:  # as a composed stage's: Llama-2-7B's layers [4, 7) as data x2 ZeRO-3 recomputed after 8
            # forwards, 337,657,856 bytes low without it
            first = max(first, gathered_again(moments, gathered))
        out[INDEX["first_backward_transient"]] = max(out[INDEX["first_backward_transient"]], first)
        out[INDEX["backward_transient"]] = max(out[INDEX["backward_transient"]], later)
    return out


def _unfetched(predictor: MemoryPredictor, start: int, stop: int, degree: int) -> int:
    """How much lower a ZeRO-3 backward after a backward is than the profile's later backward, taken under a
    schedule whose later backwards follow forwards ([Note: a backward after a backward] in predict/zero3_transients.py):
    from the suffixes' backwards after a backward where the profile measured them (profiling/execution.py [Note: a
    ZeRO-3 stage's steady backward]), whose highest is at the layer that sets the backward; after a forward, the
    prefetched layer can lift an earlier suffix above it. Asked at every position: computed once."""
    def unfetched() -> int:
        table = predictor._scaled_table("data-zero3", degree, after_backward=True)
        if predictor.profile_schedule in (None, "gpipe") or table is None or predictor.zero_layout is None:
            return 0
        suffix = [table[j, stop, INDEX["backward_transient"]] for j in range(start, stop)]
        return prefetched_bytes([-math.inf if math.isnan(v) else float(v) for v in suffix],
                                predictor.zero_layout.gathered_bytes(start, stop, degree))
    return int(predictor.kept(("unfetched", start, stop, degree), unfetched))


def _after_backward(predictor: MemoryPredictor, start: int, stop: int, degree: int, q: np.ndarray) -> float:
    """A ZeRO-2 backward after a backward, which finds its layers resharded: ZeRO-3's backward after a backward
    ([Note: predicting ZeRO-2 from the ZeRO-3 scenario] in predict/zero2_replay.py), the scenario's quantities ``q``
    with the ZeRO-3 rules applied as under GPipe, whose later backwards all follow a backward."""
    if not _ruled(predictor, stop):  # the scenario's later backward, taken after forwards
        return float(q[INDEX["backward_transient"]]) - _unfetched(predictor, start, stop, degree)
    return float(_zero3_quantities(predictor.retargeted(schedule="gpipe"), start, stop, degree, q, several=False)[
        INDEX["backward_transient"]])


def _zero2_replay(predictor: MemoryPredictor, start: int, stop: int, degree: int, *,
                  over: int | None = None, several: bool = True) -> RankReplay | None:
    """Each rank's ZeRO-2 row ([Note: predicting ZeRO-2 from the ZeRO-3 scenario] in predict/zero2_replay.py): the
    ZeRO-3 scenario's quantities, its prefixes' forward and suffixes' backward transients, the data scenario's
    forward transient and the gathered parameter bytes; None without both scenarios at ``degree``.
    ``over``: the stage's ranks where more than ``degree`` ([Note: a ZeRO-3 stage wider than the profiled ones]:
    ``predictor`` is then at the replica's batch, each rank's shards, AdamW state and step moved to ``over`` ranks,
    the layers gathered over them); ``several``: its first backward follows two forwards or more."""
    layout = predictor.zero_layout
    if (layout is None or predictor.method == "capture"
            or not {("data-zero3", degree), ("data", degree)} <= set(predictor.stats)):
        return None
    q = predictor.span_quantities(start, stop, "data-zero3", degree)
    plain = predictor.span_quantities(start, stop, "data", degree)
    if q is None or plain is None:
        return None
    gathered = layout.gathered_bytes(start, stop, degree)
    total = sum(gathered)
    table = predictor._scaled_table("data-zero3", degree)
    if table is None:
        return None

    def column(spans: list[tuple[int, int]], name: str) -> list[float]:  # unknown spans raise nothing
        found = [table[a, b, INDEX[name]] for a, b in spans]
        return [-math.inf if math.isnan(v) else float(v) for v in found]

    gathering = _sharded_forward(predictor, start, stop, degree, keep=True,
                                last_added=_last_forward_added(predictor, stop, degree, kept=True))
    if gathering is None:
        return None
    gathering = max(gathering, _kept_zero3_forward(table, start, stop, gathered))
    suffixes = [(j, stop) for j in range(start, stop)]
    activation = float(q[INDEX["activation"]])
    transients = Zero2Transients(
        gathering_forward=max(activation + total, gathering),
        gathered_forward=float(plain[INDEX["forward_transient"]]),
        first_backward=min(gathered_backward_transient(column(suffixes, "first_backward_transient"), gathered, 0.0),
                           unsharded_backward_bound(float(plain[INDEX["first_backward_transient"]]), gathered, degree,
                                                  copies=layout.scatter_copies)),
        gathered_backward=min(gathered_backward_transient(column(suffixes, "backward_transient"), gathered, 0.0),
                              unsharded_backward_bound(float(plain[INDEX["backward_transient"]]), gathered, degree,
                                                  copies=layout.scatter_copies)),
    )
    ranks = over or degree
    if predictor.recompute and stop < predictor.num_layers:  # [Note: a recomputed ZeRO-2 first backward]
        first = recomputed_zero2_first(predictor._scaled_table("data", degree), start, stop, layout, degree, ranks,
                                       several)
        transients = transients if first is None else replace(transients, first_backward=first)
    if ranks != degree:
        wide = layout.gathered_bytes(start, stop, ranks)
        growth = max((w - g for w, g in zip(wide, gathered)), default=0)
        transients = replace(transients, gathering_forward=transients.gathering_forward + sum(wide) - total,
                             first_backward=transients.first_backward + growth,
                             gathered_backward=transients.gathered_backward + growth)
        total = sum(wide)
    after_backward = _after_backward(predictor, start, stop, degree, q)
    vectors = []
    for r in range(ranks):
        v = q[:PEAK].copy()
        v[INDEX["backward_transient"]] = after_backward  # its only use
        if ranks == degree:
            v[INDEX["static"]] += layout.static_delta(start, stop, 2, degree, r)
        else:
            for name, moved in zip(("static", "step_transient", "gradient"), layout.wider_zero3_shift(start, stop, degree, ranks, r)):
                v[INDEX[name]] += moved
            for name in ("first_backward_transient", "backward_transient"):
                v[INDEX[name]] += growth
        vectors.append(v)
    if stop == predictor.num_layers and predictor.loss_backward is not None:  # every backward starts with the loss's,
        # outside every FSDP unit: its floor ([Note: the loss's backward floor]; :func:`_loss_floored`)
        vectors = [_loss_floored(predictor, start, stop, degree, v) for v in vectors]
        floor = loss_backward_bytes(predictor.loss_backward, predictor._rows("data-zero3", degree))
        transients = replace(transients, first_backward=max(transients.first_backward, floor),
                             gathered_backward=max(transients.gathered_backward, floor))
    return RankReplay.of(zero2=list(zero2_rows(vectors, transients, total)))
