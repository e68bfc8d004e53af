"""ZeRO-2's peak: the ZeRO-3 stage's actions replayed with whether its layers are gathered (no run).

[Note: predicting ZeRO-2 from the ZeRO-3 scenario] FSDP2 with ``reshard_after_forward=False`` shards exactly what
ZeRO-3 shards between iterations (same static bytes: P/d + moments of the chunks; same reduce-scattered
gradients), and differs only in WHEN a layer's parameters are gathered: a forward that finds them resharded
gathers each layer and keeps it (``gathered_bytes``: every rank's padded chunk) until the layer's next backward,
which frees it (``reshard_after_backward``). So each action is one of five kinds, each with a transient that
the ZeRO-3 and data scenarios measured or that follows from them and the parameter shapes (no profiling run is
added; measured on gpt-tiny, wresnet-tiny and the MLP in the timelines of ``hybridplan run --backend sim``):

- a forward after the iteration start or a backward *gathers*: it keeps ``activation + G`` (G: the stage's
  gathered bytes); its transient is ZeRO-3's forward at each layer plus the layers before it, still gathered
  (:func:`~hybridplan.predict.zero3_transients.sharded_forward_transient` with ``keep``; [Note: the sharded
  forward from the data stage] in predict/zero3_transients.py);
- a forward after a forward finds every layer gathered: no all-gather, exactly the unsharded data stage's
  forward (its transient, measured equal in every timeline tried);
- a backward after a forward (the first backward; 1F1B's steady state) finds them gathered and frees each after
  its backward: ZeRO-3's backward transient at the layer that sets it less that layer's and the later layers'
  gathered bytes, which ZeRO-2 holds in its level or has freed by then (:func:`gathered_backward_transient`, from
  the suffixes);
- a backward after a backward (GPipe; 1F1B's cool-down) finds them resharded: ZeRO-3's backward, measured equal;
- the step: ZeRO-3's.

:func:`zero2_peak` replays a stage's actions with that one state more (gathered or not). Exact on the MLP's profiled
span, within 0.06% on gpt-tiny's blocks (layers 0-2 and 3-5 on 2 replicas, both schedules); composed spans
inherit the ZeRO-3 scenario's composition errors (a prefix or suffix the campaign did not measure is composed by
M_a like any span), and the backwards that find the layers resharded are ZeRO-3's ([Note: a backward after a
backward] in predict/zero3_transients.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hybridplan.plan.schedule import stage_actions
from hybridplan.predict.batch_scaling import PEAK
from hybridplan.profiling.quantities import INDEX

__all__ = ["Zero2Transients", "zero2_peak", "zero2_peaks", "zero2_rows", "zero2_values", "zero2_terms", "gathered_backward_transient", "unsharded_backward_bound",
           "kept_forward_transient", "recomputed_first_backward"]


@dataclass(frozen=True)
class Zero2Transients:
    """A ZeRO-2 stage's transients (bytes above the level an action starts from), one per kind of action
    ([Note: predicting ZeRO-2 from the ZeRO-3 scenario]); the other quantities are the ZeRO-3 stage's."""

    gathering_forward: float
    """A forward that all-gathers its layers and keeps them (the first after the iteration starts or a backward)."""
    gathered_forward: float
    """A forward whose layers are already gathered: the unsharded data stage's forward transient."""
    first_backward: float
    """The first backward (its layers always gathered: it follows a forward)."""
    gathered_backward: float
    """A later backward that follows a forward (1F1B's steady state): its layers are gathered."""


def zero2_peak(q: np.ndarray, transients: Zero2Transients, gathered: float, schedule: str, stages_after: int,
               num_microbatches: int) -> float:
    """Peak bytes of a ZeRO-2 stage: its actions replayed with whether its layers are gathered.

    ``q``: the rank's quantity vector (profiling/quantities.py), the ZeRO-3 stage's; ``gathered``: the bytes of
    every layer of the stage all-gathered. Like profiling/schedule_memory.py's replay, with one more state:
    a forward that finds the layers resharded gathers and keeps them (``gathered`` more), the next backward
    frees them.

    >>> q = np.array([100, 0, 10, 6, 3, 20, 8, 2])  # static, data, activation, gradient, then the transients
    >>> t = Zero2Transients(gathering_forward=7, gathered_forward=3, first_backward=4, gathered_backward=2)
    >>> zero2_peak(q, t, 50, "gpipe", 0, 2)  # F0 gathers: 100 + 7; F1: 160 + 3; B0: 170 + 4; B1: 116 + 8
    174.0
    """
    return zero2_peaks([q], transients, gathered, schedule, stages_after, num_microbatches)[0]


def zero2_peaks(qs: Sequence[np.ndarray], transients: Zero2Transients, gathered: float, schedule: str,
                stages_after: int, num_microbatches: int) -> list[float]:
    """:func:`zero2_peak` of each rank's quantity vector in ``qs`` (one product for all ranks)."""
    return zero2_values(zero2_rows(qs, transients, gathered), schedule, stages_after, num_microbatches).tolist()


def zero2_rows(qs: Sequence[np.ndarray], transients: Zero2Transients, gathered: float) -> np.ndarray:
    """The rows :func:`zero2_values` replays: each rank's quantities ``q[:PEAK]``, then the transients and the
    gathered bytes."""
    x = np.empty((len(qs), PEAK + 5))
    x[:, :PEAK] = [np.asarray(q[:PEAK], dtype=float) for q in qs]
    x[:, PEAK:] = [transients.gathering_forward, transients.gathered_forward, transients.first_backward,
                   transients.gathered_backward, gathered]
    return x


def zero2_values(x: np.ndarray, schedule: str, stages_after: int, num_microbatches: int) -> np.ndarray:
    """The ZeRO-2 peak of each row of ``x`` (:func:`zero2_rows`), rows of any stages at once."""
    terms = zero2_terms(schedule, stages_after, num_microbatches)
    finite = np.isfinite(x)
    values = np.where(finite, x, 0.0) @ terms.T
    if not finite.all():  # as the action-by-action replay: an infinite quantity makes the moments that use it
        # infinite, and a moment that needs an unknown one (NaN: a span the profile does not predict, or +inf - inf)
        # is no candidate (there ``max(peak, nan)`` keeps the peak); one the moments do not use changes nothing
        used = terms != 0
        with np.errstate(invalid="ignore"):
            for r, j in zip(*np.nonzero(~finite)):
                values[r, used[:, j]] += x[r, j] * terms[used[:, j], j]
        values[np.isnan(values)] = -math.inf
    out: np.ndarray = np.max(values, axis=1)
    return out


@lru_cache(maxsize=1024)
def _zero2_terms(schedule: str, after: int, num_microbatches: int) -> np.ndarray:
    """:func:`zero2_terms` for a warm-up depth ``after`` (computed once)."""
    i = {name: INDEX[name] for name in ("static", "data", "activation", "gradient", "first_backward_transient",
                                       "backward_transient", "step_transient")}
    gathering, gathered_fwd, first_bwd, gathered_bwd, gathered = range(PEAK, PEAK + 5)
    level = np.zeros(PEAK + 5)
    level[i["static"]] = level[i["data"]] = 1.0
    rows: list[np.ndarray] = []

    def at(*terms: int) -> None:
        row = level.copy()
        for t in terms:
            row[t] += 1.0
        rows.append(row)

    held, first = False, True
    for action in stage_actions(schedule, after + 1, 0, num_microbatches):
        if action.kind == "F":
            at(gathered_fwd if held else gathering)
            level[i["activation"]] += 1.0
            level[gathered] += 0.0 if held else 1.0
            held = True
        elif first:
            at(first_bwd if held else i["first_backward_transient"])
            level[i["gradient"]] += 1.0
            level[i["activation"]] -= 1.0
            level[gathered] -= 1.0 if held else 0.0
            held, first = False, False
        else:
            at(gathered_bwd if held else i["backward_transient"])
            level[i["activation"]] -= 1.0
            level[gathered] -= 1.0 if held else 0.0
            held = False
    level[i["data"]] -= 1.0
    at(i["step_transient"])
    out = np.array(rows)
    out.setflags(write=False)
    return out


def zero2_terms(schedule: str, stages_after: int, num_microbatches: int) -> np.ndarray:
    """Coefficient rows ``C`` with :func:`zero2_peak` ``= max(C @ x)``, ``x`` the rank's quantities ``q[:PEAK]``
    then the transients (gathering forward, gathered forward, first backward, gathered backward) and the gathered
    bytes: the replay is linear in them for a given action list (as profiling/schedule_memory.py ``peak_terms`` is
    for the plain replay), so a search that asks thousands of spans and ranks replays the schedule once."""
    after = 0 if schedule == "gpipe" else min(stages_after, num_microbatches)
    return _zero2_terms(schedule, after, num_microbatches)


def gathered_backward_transient(suffix_backward: Sequence[float], gathered: Sequence[int], floor: float) -> float:
    """A ZeRO-2 backward whose layers are gathered, from the ZeRO-3 backward transients of the span's suffixes.

    ``suffix_backward[j]`` is the ZeRO-3 transient of the span's layers ``j..`` (a backward runs them last to
    first, so a suffix's backward is the span's until it reaches layer ``j``). Where adding layer ``j`` raises
    it, the peak is at ``j`` (its all-gather: ``gathered[j]``) or at ``j + 1``, whose backward prefetches ``j``
    (FSDP2's backward prefetch of the previous unit): either way ZeRO-3 then holds ``j``'s layers gathered and
    the layers after, already resharded, none; their own all-gathers aside. ZeRO-2 holds every layer's gathered
    parameters from the start of the backward (in its level) and frees each after its backward, so at that
    point it is below ZeRO-3 by the gathered bytes of layers ``j..``: in both cases ``gathered[j:]``.

    >>> gathered_backward_transient([50, 70, 40], [10, 20, 5], 0)  # layer 1 (raising 40 to 70): 70 - 25
    45
    """
    best, highest = floor, -math.inf
    for j in range(len(suffix_backward) - 1, -1, -1):
        if suffix_backward[j] > highest:
            best, highest = max(best, suffix_backward[j] - sum(gathered[j:])), suffix_backward[j]
    return best


def recomputed_first_backward(first_moments: Sequence[float], gathered: Sequence[int], again: float) -> float:
    """A recomputed ZeRO-2 stage's first backward, its layers gathered, from the recomputed ZeRO-3 moments of its
    layers ([Note: a recomputed ZeRO-3 stage] in predict/zero3_transients.py, without the prefetched layer).

    [Note: a recomputed ZeRO-2 first backward] At layer ``k`` a ZeRO-3 rank holds the layer's phase, the later
    layers' gradient shards, the reduce-scatter input of the layer after it and layer ``k`` gathered
    (``first_moments[k]``). A ZeRO-2 rank runs the same backward with every layer gathered in its level: layer ``k``'s
    gathered bytes are no transient, and the later layers', freed after their backwards, are below the level. So it
    holds ``first_moments[k] - sum(gathered[k:])``. After several forwards FSDP2 gathers the previous micro-batch's
    last layer again at the span's first layer (``again``: that layer's ZeRO-3 moment with it, :func:`~hybridplan.
    predict.composed_zero.gathered_again`; -inf otherwise): ZeRO-2 frees that layer after its backward and gathers it
    again too. Measured (simulated devices, traced by FSDP2's hooks): gpt-tiny's blocks 2-3 as data x2 ZeRO-2
    recomputed under GPipe peak at block 2's backward with block 3 gathered again, 540,288 bytes above the level, and
    blocks 1-3, 2-5 at 432,128 and 340,352, each to the byte; Llama-2-7B's layers [0, 4) and [2, 4) and
    Llama-3-70B's [51, 53) over 8 ranks likewise. The rule on the ZeRO-3 scenario's suffixes
    (:func:`gathered_backward_transient`) read its rise at block 2 as block 2's own and took 540,288 for all three
    (Llama-2-7B's layers [0, 4) +1.97% on the device, benchmarks/instant_planning).

    >>> recomputed_first_backward([150, 100], [40, 20], 170)  # layer 0: 150 - 60, again 170 - 60; layer 1: 100 - 20
    110
    """
    best = max((m - sum(gathered[k:]) for k, m in enumerate(first_moments)), default=-math.inf)
    first = next((k for k, size in enumerate(gathered) if size), None)
    return best if first is None else max(best, again - sum(gathered[first:]))


def unsharded_backward_bound(data_transient: float, gathered: Sequence[int], degree: int, *, copies: int = 1) -> float:
    """The most a ZeRO-2 backward whose layers are gathered holds above its level, from the unsharded data
    stage's backward transient: it runs the same backward on the same (gathered) parameters, frees each layer's
    parameters once the layer is done, and instead of keeping a layer's whole gradient reduce-scatters it into a
    ``1/degree`` shard, which the data stage does not hold. So at layer ``j`` it holds at most the data stage's
    bytes plus ``gathered[j] / degree`` less the layers after ``j``, already freed.

    >>> unsharded_backward_bound(100, [40, 0, 8], 2)  # the first layer: 40 / 2 - 8 = 12, more than the last's 8 / 2
    112.0
    """
    return data_transient + max(copies * size / degree - sum(gathered[j + 1:]) for j, size in enumerate(gathered))


def kept_forward_transient(prefix_forward: Sequence[float], alone_forward: Sequence[float],
                           activation_before: Sequence[float], gathered: Sequence[int]) -> float:
    """ZeRO-2's gathering forward from the ZeRO-3 scenario's forwards ([Note: ZeRO-2's gathering forward, measured]).

    ``prefix_forward[k]``: the ZeRO-3 forward transient of the span's first ``k + 1`` layers; ``alone_forward[k]``:
    layer ``k``'s measured alone; ``activation_before[k]``: the activations of the layers before ``k``;
    ``gathered[k]``: layer ``k``'s gathered bytes. NaN terms are skipped (-inf where none is known).

    [Note: ZeRO-2's gathering forward, measured] The rule of [Note: the sharded forward from the data stage]
    (predict/zero3_transients.py: the data stage's transient plus twice the layer's gathered bytes) was measured on
    dense tiny models; a Mixtral-8x7B block holds 753,400,832 bytes more in its ZeRO-3 forward than the rule says
    (2,283,357,696 data + 2 x 2,902,540,288 gathered; 8,841,839,104 simulated: data x2, micro-batches of 4 rows of
    2,048 tokens, bf16), so ZeRO-2 recomputed spans of Mixtral, whose gathering forward sets the peak, were predicted
    2.1% low (two blocks) and 7.7% low (two blocks and the head; benchmarks/instant_planning). The ZeRO-3 scenario
    measures that forward: where its prefix rises at ``k``, layer ``k`` sets it; elsewhere layer ``k``'s moment is at
    most the prefix's and at most the layer alone above the activations before it. ZeRO-2 runs the same forward with
    the layers before ``k`` still gathered, so it holds that moment plus their gathered bytes. The predictor takes the
    larger of this and the rule (the rule stays where the scenario's spans are composed low). Mixtral's two blocks:
    8,841,839,104 + 2,902,540,288 = 11,744,379,392 bytes, as simulated.

    >>> kept_forward_transient([80.0, 80.0], [80.0, 80.0], [0.0, 5.0], [30, 30])  # layer 1: min(80, 85) + 30
    110.0
    >>> kept_forward_transient([80.0, 95.0], [80.0, 90.0], [0.0, 5.0], [30, 30])  # the prefix rises at layer 1
    125.0
    """
    best, kept, highest = -math.inf, 0, -math.inf
    for prefix, alone, before, size in zip(prefix_forward, alone_forward, activation_before, gathered):
        moment = prefix if prefix > highest else min(prefix, alone + before)
        if not math.isnan(moment):
            best = max(best, moment + kept)
        highest, kept = max(highest, prefix), kept + size
    return best
