"""Per-device peak memory of any plan, from a profile database (CAPTURE seed 000 III-B, extended).

For a stage ``[a, b)`` run as ``kind`` x ``degree`` at some position of a plan:

1. its quantities (profiling/quantities.py) at each profiled batch size: measured if that exact span
   was profiled, else ``M_i(a) + sum M_a(a+1..b-1)`` (profiling/statistics.py);
2. scaled to the plan's batch by the straight line through the two profiled sizes (seed 000 III-B2):
   per micro-batch quantities against the micro-batch size, the data share against the global batch
   (predict/batch_scaling.py, which also looks spans up in statistics on merged layers);
3. replayed through the stage's actions under the plan's schedule at its position
   (profiling/schedule_memory.py): this is what makes 1F1B predictions as accurate as GPipe's;
4. for a tensor degree that was not profiled (above 4), the stage peak is fitted through the two
   profiled degrees with seed 000's logarithmic function ``P(d) = P(2) + (P(4) - P(2)) log2(d / 2)``,
   or ``P(d) = alpha + beta / d`` (``degree_fit="inverse"``, the analytical form seed 000 motivates
   its choice with); a data degree above the profiled ones is composed from the largest profiled data
   stage at a smaller batch instead ([Note: a data stage wider than the profiled ones]).

``method="capture"`` reproduces seed 000 instead: the measured stage *peaks* composed by M_i/M_a and
scaled by batch, blind to the schedule position (for comparisons).

"flush" and "2bw" run 1F1B's actions, so the replay is 1F1B's; a 2BW plan predicted from a profile taken
under another schedule (or the reverse) gets its weight stash added to (removed from) ``static``: see
[Note: predicting PipeDream-2BW] in predict/stash.py.

This module holds :class:`MemoryPredictor`: its construction from a profile, steps 3 and 4 and the composite
stages (data x tensor, wider data, recompute per stage). Beside it, by concept: a plan's prediction from its
stages' (predict/plan_prediction.py, [Note: a data x tensor stage is a tensor stage at a smaller batch]), every span at
once for the search (predict/span_tables.py), the batch scaling and its extrapolation warning
(predict/batch_scaling.py), a ZeRO stage's per-rank peaks
(predict/zero_stage.py, on predict/zero_layout.py's layout and the rules of predict/zero3_transients.py and
predict/zero2_replay.py), the plans a profile cannot predict and why
(predict/plan_checks.py), the result types (predict/prediction.py) and the view on merged layers the search
uses (predict/unit_view.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybridplan.errors import PlanError, ProfileError
from hybridplan.plan import Plan
from hybridplan.predict.batch_scaling import (EXTRAPOLATION_LIMIT, PEAK, extrapolation_note, loss_floor,
                                             scaled_to_batch, span_in_units, table_in_layers, with_replica_rows)
from hybridplan.predict.plan_prediction import predict_plan
from hybridplan.predict.prediction import PlanPrediction
from hybridplan.predict.span_tables import stage_memory_matrix
from hybridplan.predict.reserved import ReservedExcess
from hybridplan.predict.stash import StashAdjustment
from hybridplan.predict.unit_view import UnitView
from hybridplan.predict.zero_layout import ZeroLayout
from hybridplan.predict.zero_stage import zero_peaks, zero_tensor_peaks
from hybridplan.profiling.schedule_memory import peak_terms
from hybridplan.profiling.statistics import SpanStatistics

if TYPE_CHECKING:
    from hybridplan.profiling.database import ProfileDB

__all__ = ["MemoryPredictor", "DEGREE_FITS", "EXTRAPOLATION_LIMIT"]

DEGREE_FITS = ("log", "inverse")


class MemoryPredictor:
    """Predicts per-device peak memory for plans of one model and batch configuration.

    Args:
        stats: ``{(kind, degree): [SpanStatistics, ...]}`` with two profiled batch sizes per scenario
            (kind "none" with degree 1 is pipeline-only).
        num_layers: the model's layer count.
        schedule: "gpipe", "1f1b", "flush" or "2bw".
        global_batch_size: the target global batch.
        num_microbatches: the target micro-batch count.
        degree_fit: "log" (seed 000) or "inverse".
        method: "quantities" (default) or "capture" (seed 000's peak statistics).
        profile_schedule: the schedule the profile was taken under (None: the target's family; see
            [Note: predicting PipeDream-2BW] in predict/stash.py).
        stash: ``{(kind, degree): {layer: bytes}}`` of a 2BW weight stash per layer ("none" x 1 stands for
            every replicated stage), needed when exactly one of ``schedule`` and ``profile_schedule`` is "2bw".
    """

    def __init__(
        self,
        stats: dict[tuple[str, int], list[SpanStatistics]],
        *,
        num_layers: int,
        schedule: str,
        global_batch_size: int,
        num_microbatches: int,
        degree_fit: str = "log",
        method: str = "quantities",
        profile_schedule: str | None = None,
        stash: Mapping[tuple[str, int], Mapping[int, int]] | None = None,
        recompute: bool = False,
        recomputed: MemoryPredictor | None = None,
        device_type: str = "cpu",
        zero_layout: ZeroLayout | None = None,
        reserved: ReservedExcess | None = None,
        loss_backward: Mapping[str, Sequence[float]] | None = None,
        head_backward: Mapping[str, Mapping[str, Any]] | None = None,
        layer_classes: Sequence[str] | None = None,
    ) -> None:
        if degree_fit not in DEGREE_FITS:
            raise ProfileError(f"unknown degree fit {degree_fit!r}", fix=f"use one of {list(DEGREE_FITS)}")
        if method not in ("quantities", "capture"):
            raise ProfileError(f"unknown prediction method {method!r}", fix="use 'quantities' or 'capture'")
        if global_batch_size % num_microbatches:
            raise PlanError(f"global batch {global_batch_size} does not split into {num_microbatches} micro-batches")
        self.stats = stats
        self.num_layers = num_layers
        self.layer_classes = list(layer_classes) if layer_classes is not None and len(layer_classes) == num_layers else None
        """Where the profile guarantees it (a simulated campaign of one-layer neighbour chains over layers with
        signatures: [Note: identical spans predict alike] in predict/span_tables.py), each layer's signature."""
        self.matrices: dict[str, np.ndarray] | None = None
        """Stage matrices already computed, by :meth:`stage_memory_matrix`'s arguments (None: none kept); a
        search over a profile seen before reads them from disk (workflows/table_cache.py)."""
        self.schedule = schedule
        self.global_batch_size = global_batch_size
        self.num_microbatches = num_microbatches
        self.degree_fit = degree_fit
        self.method = method
        self.position_horizon = num_microbatches if schedule != "gpipe" else 1
        self.profile_schedule = profile_schedule
        self.stash = stash or {}
        self.recompute = recompute
        self.device_type = device_type
        """The profiled devices' type: "cuda" adds the memory outside the allocator ([Note: predicting a CUDA
        device] in predict/prediction.py)."""
        self.recomputed = recomputed
        """[Note: recompute chosen per stage] The predictor of a second profile of the same model and cluster, taken
        with recompute (``hybridplan profile --activation-checkpointing``): it predicts the stages a plan marks
        ``"recompute": "full"``, this one the others. A stage's memory depends on its own layers, kind, degree,
        schedule position and recompute, not on whether its neighbours recompute (what crosses a boundary has the
        model's shapes either way), so the two profiles compose stage by stage; profiling both doubles the runs."""
        self.zero_layout = zero_layout
        """The profiled model's parameter shapes, which say what ZeRO shards ([Note: predicting ZeRO from a
        profile] in predict/zero_layout.py); None for a profile that did not record them."""
        self.reserved = reserved
        """CUDA: the excess the profile measured above the tensor peak, which predicts the allocator's reserved peak
        ([Note: predicting the reserved peak] in predict/reserved.py); None: not predicted."""
        self.loss_backward = loss_backward
        """The loss's backward bytes measured alone at two sample counts, the floor of the backward transients of a
        stage that ends the model ([Note: the loss's backward floor] in profiling/loss_memory.py); None for a
        profile that did not record them (the batch scaling alone)."""
        self.head_backward = head_backward
        """Per tensor degree (a string key), the head's backward phase measured alone at several sample counts
        ([Note: the head's backward phase] in profiling/loss_memory.py); None for a profile that did not record it."""
        self.source: str | None = None
        """The profile database it was read from (:meth:`from_profile`), named by errors about what it lacks."""
        self._stash = StashAdjustment(self.stash, num_layers=num_layers, schedule=schedule, profile_schedule=profile_schedule)
        self._tables: dict[tuple[tuple[str, int], bool, bool], np.ndarray] = {}
        self._targets: dict[tuple[str, int, int], MemoryPredictor] = {}
        self._kept: dict[tuple[Any, ...], Any] = {}
        """What :meth:`kept` made, by key."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_db(
        cls,
        path: str | Path,
        *,
        schedule: str | None = None,
        global_batch_size: int | None = None,
        num_microbatches: int | None = None,
        degree_fit: str = "log",
        method: str = "quantities",
        recompute_db: str | Path | None = None,
    ) -> MemoryPredictor:
        """A predictor from a profile database file; unset targets default to the campaign's
        (predict/profile_loading.py).

        ``recompute_db``: a profile of the same model and cluster taken with recompute, which predicts the stages
        a plan recomputes ([Note: recompute chosen per stage]).

        Raises:
            ProfileError: if ``recompute_db`` was not taken with recompute, or profiles another model or cluster.
        """
        from hybridplan.predict.profile_loading import predictor_from_db

        return predictor_from_db(cls, path, schedule=schedule, global_batch_size=global_batch_size,
                                 num_microbatches=num_microbatches, degree_fit=degree_fit, method=method,
                                 recompute_db=recompute_db)

    @classmethod
    def from_profile(
        cls,
        db: ProfileDB,
        *,
        schedule: str | None = None,
        global_batch_size: int | None = None,
        num_microbatches: int | None = None,
        degree_fit: str = "log",
        method: str = "quantities",
    ) -> MemoryPredictor:
        """A predictor from an open profile database; unset targets default to the campaign's
        (predict/profile_loading.py).

        Raises:
            ProfileError: if the database holds no memory campaign.
        """
        from hybridplan.predict.profile_loading import predictor_from_profile

        return predictor_from_profile(cls, db, schedule=schedule, global_batch_size=global_batch_size,
                                      num_microbatches=num_microbatches, degree_fit=degree_fit, method=method)

    @property
    def microbatch_size(self) -> int:
        return self.global_batch_size // self.num_microbatches

    def scaling_note(self) -> str | None:
        """One line if the target batch lies far beyond the profiled ones, else None (:func:`extrapolation_note`)."""
        return extrapolation_note(self.stats, self.global_batch_size, self.microbatch_size)

    # ------------------------------------------------------------------ per stage
    def _scenario(self, kind: str, degree: int) -> tuple[str, int]:
        return ("none", 1) if degree == 1 else (kind, degree)

    def _zero_source(self, kind: str, zero: int) -> str | None:
        """The profiled kind a ZeRO stage is predicted from ([Note: predicting ZeRO from a profile]), or None
        where the profile cannot say (ZeRO of a data x tensor stage, no parameter shapes recorded)."""
        if self.zero_layout is None or kind != "data":
            return None
        return {1: "data", 2: "data-zero3", 3: "data-zero3"}.get(zero)

    def profiled_degrees(self, kind: str) -> list[int]:
        """Degrees profiled for ``kind`` (with statistics at two batch sizes)."""
        return sorted(d for (k, d), s in self.stats.items() if k == kind and len(s) >= 2)

    def span_quantities(self, start: int, stop: int, kind: str, degree: int, *,
                        refined: bool = True) -> np.ndarray | None:
        """Quantities (and, last, the measured-peak statistic) of a profiled scenario, scaled to the target batch;
        ``refined``: a data replica's per-row quantities from the pipeline scenario where it measured the replica's
        rows ([Note: a data replica's rows were profiled] in predict/batch_scaling.py) and a span that ends the model
        with its backward transients floored by the loss's (:meth:`_loss_floor`). Kept per span: a search asks each
        one at every position (a copy is returned, which the caller may change)."""
        q = self.kept(("span quantities", start, stop, kind, degree, refined),
                      lambda: self._span_quantities(start, stop, kind, degree, refined))
        return None if q is None else q.copy()

    def kept(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()`` once per predictor and ``key``: what a span's prediction needs before its position enters (a
        search asks each span, or span class, at every position: made once, not again)."""
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def span_class(self, start: int, stop: int) -> tuple[Any, ...]:
        """What the prediction of the span ``[start, stop)`` is a function of, to key what is :meth:`kept` for it:
        its layers' classes and whether it starts or ends the model where the profile records classes ([Note:
        identical spans predict alike] in predict/span_tables.py: a plan's stages of 2 decoder layers are one
        class wherever they sit), else the span itself."""
        if self.layer_classes is None:
            return (start, stop)
        return (tuple(self.layer_classes[start:stop]), start == 0, stop == self.num_layers)

    def _span_quantities(self, start: int, stop: int, kind: str, degree: int, refined: bool) -> np.ndarray | None:
        """:meth:`span_quantities`, computed."""
        sizes = self.stats.get(self._scenario(kind, degree))
        wider = None if sizes else self._wider_data(kind, degree)
        if wider is not None:  # [Note: a data stage wider than the profiled ones]
            return wider[0].span_quantities(start, stop, kind, wider[1], refined=refined)
        if not sizes or len(sizes) < 2:
            return None
        found = [span_in_units(s, start, stop) for s in sizes]
        vectors = [v for v in found if v is not None]
        if len(vectors) < len(found):
            return None
        scaled = scaled_to_batch(vectors, sizes, global_batch_size=self.global_batch_size,
                                 microbatch_size=self.microbatch_size)
        pipeline = self._pipeline_at_replica_rows(kind, degree) if refined else None
        measured = None if pipeline is None else span_in_units(pipeline, start, stop)
        if measured is not None:  # [Note: a data replica's rows were profiled]
            scaled = with_replica_rows(scaled, measured)
        if stop == self.num_layers:  # [Note: the loss's backward floor]
            scaled = loss_floor(scaled, self._loss_floor(kind, refined), self._rows(kind, degree))
        return self._stash.apply(scaled, start, stop, kind, degree)

    def _pipeline_at_replica_rows(self, kind: str, degree: int) -> SpanStatistics | None:
        """The pipeline scenario's statistics at the rows a replica of a data x ``degree`` stage computes, where it
        was profiled there ([Note: a data replica's rows were profiled] in predict/batch_scaling.py: a campaign's
        pipeline sizes are the rows of data x2 and x4 replicas at its target); None otherwise, and for CAPTURE's
        method (its peak statistic is not per row)."""
        if kind != "data" or degree < 2 or self.method == "capture":
            return None
        rows = self.microbatch_size / degree
        return next((s for s in self.stats.get(("none", 1), []) if s.microbatch_size == rows), None)

    def _loss_floor(self, kind: str, refined: bool) -> Mapping[str, Sequence[float]] | None:
        """The loss's backward bytes that floor a span ending the model ([Note: the loss's backward floor] in
        profiling/loss_memory.py), or None: not ``refined`` (the data scenario as ZeRO-3's rules read it: they
        separate the head's phase from the loss's themselves, [Note: the loss runs outside every FSDP unit] in
        predict/zero3_transients.py, and a suffix raised to the loss's phase would hide the layers before the head from their
        floor), or the ZeRO-3 scenario, which predict/zero_stage.py floors once its rules are applied."""
        return self.loss_backward if refined and kind != "data-zero3" else None

    def _rows(self, kind: str, degree: int) -> float:
        """Rows of a micro-batch one device of a ``kind`` x ``degree`` stage computes: a data replica its share, a
        tensor (or pipeline-only) device all of them."""
        return self.microbatch_size / degree if kind in ("data", "data-zero3") else float(self.microbatch_size)

    def _profiled_peak(self, start: int, stop: int, kind: str, degree: int, stages_after: int) -> float | None:
        q = self.span_quantities(start, stop, kind, degree)
        if q is None:
            return None
        if self.method == "capture":
            return float(q[PEAK])
        return float(np.max(peak_terms(self.schedule, stages_after, self.num_microbatches) @ q[:PEAK]))

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int, *,
                     tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> float:
        """Predicted per-device peak bytes of a stage (``inf`` if the profile cannot predict it); a "data+tensor"
        stage of ``degree`` devices gives its ``tensor_degree`` too ([Note: a data x tensor stage is a tensor
        stage at a smaller batch]); a ZeRO stage its level, and the value is its largest device's. A recomputed
        stage is predicted by the recompute profile ([Note: recompute chosen per stage]; ``inf`` without one)."""
        if recompute and not self.recompute:
            if self.recomputed is None:
                return math.inf
            return self.recomputed.stage_memory(start, stop, kind, degree, stages_after, tensor_degree=tensor_degree,
                                                zero=zero)
        if zero:
            peaks = (zero_tensor_peaks(self, start, stop, zero, degree, tensor_degree, stages_after)
                     if kind == "data+tensor" else zero_peaks(self, start, stop, kind, zero, degree, stages_after))
            return math.inf if peaks is None else max(peaks)
        if kind == "data+tensor":
            replica = self._replica(degree, tensor_degree)
            return math.inf if replica is None else replica.stage_memory(start, stop, "tensor", tensor_degree, stages_after)
        if degree == 1 or (kind, degree) in self.stats:
            value = self._profiled_peak(start, stop, kind, degree, stages_after)
            return math.inf if value is None else value
        wider = self._wider_data(kind, degree)
        if wider is not None:  # [Note: a data stage wider than the profiled ones]
            return wider[0].stage_memory(start, stop, kind, wider[1], stages_after)
        degrees = self.profiled_degrees(kind)
        if len(degrees) < 2 or (kind == "data-zero3" and degree > degrees[-1]):  # see predict/plan_checks.py
            return math.inf
        d1, d2 = degrees[-2], degrees[-1]
        p1 = self._profiled_peak(start, stop, kind, d1, stages_after)
        p2 = self._profiled_peak(start, stop, kind, d2, stages_after)
        if p1 is None or p2 is None:
            return math.inf
        if self.degree_fit == "log":
            return p1 + (p2 - p1) * math.log(degree / d1) / math.log(d2 / d1)
        beta = (p1 - p2) / (1 / d1 - 1 / d2)
        return p2 - beta / d2 + beta / degree

    def allowed(self, start: int, stop: int, kind: str, degree: int, *, tensor_degree: int = 0, zero: int = 0,
                recompute: bool = False) -> bool:
        """Whether the profile predicts this stage config (and its batch split is possible)."""
        if kind in ("data", "data-zero3") and degree > 1 and self.microbatch_size % degree:
            return False
        return math.isfinite(self.stage_memory(start, stop, kind, degree, 0, tensor_degree=tensor_degree, zero=zero,
                                               recompute=recompute))

    def _replica(self, degree: int, tensor_degree: int) -> MemoryPredictor | None:
        """The predictor of one replica of a "data+tensor" stage (None if the micro-batch does not split)."""
        if tensor_degree < 2 or degree % tensor_degree:
            return None
        data = degree // tensor_degree
        if self.microbatch_size % data:
            return None
        return self.retargeted(global_batch_size=self.global_batch_size // data)

    def _wider_data(self, kind: str, degree: int) -> tuple[MemoryPredictor, int] | None:
        """A data stage of ``degree`` above every profiled data degree, as ``(predictor, d)``: the largest profiled
        degree ``d`` at the global batch ``B * d / degree``.

        [Note: a data stage wider than the profiled ones] ``hybridplan profile`` profiles data degrees up to a
        node's devices, so a data stage across nodes (data x8 on 2x4 with --allow-cross-node) has a degree no
        profile measured. Each of its D replicas runs exactly what a replica of a data x d stage runs when both
        see the same rows per micro-batch: the whole stage's parameters, gradients and optimizer state, b/D rows
        of activations and received buffers, the same schedule position; the gradient all-reduce leaves no
        buffer behind. So it is the data x d stage at the global batch B*d/D (same micro-batch count), as a data
        x tensor stage is its tensor stage at B/d ([Note: a data x tensor stage is a tensor stage at a smaller
        batch]); ZeRO-1 then moves each rank's optimizer share for D ranks as for any ZeRO-1 stage (``zero_peaks``
        in predict/zero_stage.py). CAPTURE's degree fit through data x2 and x4 (seed 000's log fit, which
        ``method="capture"`` keeps) lets every byte fall with the degree, while a replica's parameters, gradients
        and optimizer state do not: measured on 2x4 (benchmarks/extended_accuracy, 10 data x8 stages of
        gpt-tiny, wresnet-tiny and moe-tiny, unsharded and ZeRO-1, simulated devices) the fit was 9.2% to 82.7%
        below the measured peak, this composition 0.00% on 8 of them and 0.09% and 0.13% on moe-tiny's two under
        GPipe (on MoE 1.3B on H100s, a data x8 stage fitted at 9.82 GiB measured 16.35 GiB). A ZeRO-3 stage
        (``kind="data-zero3"``) is the widest profiled ZeRO-3 stage at that batch too, its shards then moved to
        ``degree`` ranks: [Note: a ZeRO-3 stage wider than the profiled ones] in predict/zero_stage.py. ZeRO-2 is
        not composed this way (``_check_zero`` in predict/plan_checks.py).

        None where this does not apply: another kind, a profiled or not wider degree, ``method="capture"``, or a
        micro-batch that does not split ``degree`` ways.
        """
        if kind not in ("data", "data-zero3") or self.method == "capture" or self.microbatch_size % degree:
            return None
        profiled = self.profiled_degrees(kind)
        if not profiled or degree <= profiled[-1] or (kind, degree) in self.stats:
            return None
        d = profiled[-1]
        return self.retargeted(global_batch_size=self.global_batch_size * d // degree), d

    def stage_memory_matrix(self, kind: str, degree: int, stages_after: int, num_layers: int, *,
                            tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        """``[start, stop]`` -> stage_memory for every span at once (``inf`` where not predictable;
        predict/span_tables.py); kept in :attr:`matrices` when that is a dict."""
        key = f"{kind}|{degree}|{stages_after}|{num_layers}|{tensor_degree}|{zero}|{int(recompute)}"
        if self.matrices is not None and key in self.matrices:
            return self.matrices[key].copy()
        out = stage_memory_matrix(self, kind, degree, stages_after, num_layers, tensor_degree=tensor_degree,
                                  zero=zero, recompute=recompute)
        if self.matrices is not None:
            self.matrices[key] = out.copy()
        return out

    def _scaled_table(self, kind: str, degree: int, *, refined: bool = True,
                      after_backward: bool = False) -> np.ndarray | None:
        """Every span's scaled quantities ``[L, L+1, Q]`` (``refined``: as in :meth:`span_quantities`; ``after_backward``:
        as in :meth:`~hybridplan.profiling.statistics.SpanStatistics.all_spans`)."""
        key = self._scenario(kind, degree)
        if (key, refined, after_backward) not in self._tables:
            sizes = self.stats.get(key)
            if not sizes or len(sizes) < 2:
                return None
            spans = [table_in_layers(s, self.num_layers, after_backward=after_backward) for s in sizes]
            scaled = scaled_to_batch(spans, sizes, global_batch_size=self.global_batch_size,
                                     microbatch_size=self.microbatch_size)
            pipeline = self._pipeline_at_replica_rows(kind, degree) if refined else None
            if pipeline is not None:  # [Note: a data replica's rows were profiled]
                scaled = with_replica_rows(scaled, table_in_layers(pipeline, self.num_layers))
            L = self.num_layers  # [Note: the loss's backward floor]: the spans ending the model
            scaled[:, L] = loss_floor(scaled[:, L], self._loss_floor(kind, refined), self._rows(kind, degree))
            table = self._stash.apply(scaled, None, None, *key)
            if table is None:
                return None
            self._tables[key, refined, after_backward] = table
        return self._tables[key, refined, after_backward]

    def retargeted(self, *, schedule: str | None = None, global_batch_size: int | None = None,
                   num_microbatches: int | None = None) -> MemoryPredictor:
        """This predictor's profile at other targets (unset ones kept). Kept per target: a search predicts many
        plans at each micro-batch size, and what a predictor made for one (:meth:`kept`, its stage matrices) serves
        the next."""
        target = (schedule or self.schedule, global_batch_size or self.global_batch_size,
                  num_microbatches or self.num_microbatches)
        if target == (self.schedule, self.global_batch_size, self.num_microbatches):
            return self
        if target not in self._targets:
            self._targets[target] = MemoryPredictor(
                self.stats,
                num_layers=self.num_layers,
                schedule=target[0],
                global_batch_size=target[1],
                num_microbatches=target[2],
                degree_fit=self.degree_fit,
                method=self.method,
                profile_schedule=self.profile_schedule,
                stash=self.stash,
                recompute=self.recompute,
                recomputed=None if self.recomputed is None else self.recomputed.retargeted(
                    schedule=target[0], global_batch_size=target[1], num_microbatches=target[2]),
                device_type=self.device_type,
                zero_layout=self.zero_layout,
                reserved=self.reserved,
                loss_backward=self.loss_backward,
                head_backward=self.head_backward,
                layer_classes=self.layer_classes,
            )
        return self._targets[target]

    def on_units(self, bounds: list[int]) -> UnitView:
        """This predictor seen on merged layers (for the search; see profiling/merger.py)."""
        return UnitView(self, bounds)

    # ------------------------------------------------------------------ plans
    def predict(self, plan: Plan) -> PlanPrediction:
        """Per-device predicted peaks of ``plan`` (predict/plan_prediction.py).

        Raises:
            PlanError: if the plan does not fit the profiled model.
            ProfileError: if a stage cannot be predicted from the profile (naming it and why).
        """
        return predict_plan(self, plan)

    def outside_bytes(self, plan: Plan | None, device: int = 0) -> int | None:
        """CUDA: the memory ``device`` of ``plan`` holds outside the allocator (plan None: without any NCCL
        communicator, a floor for every plan); None for a CPU profile. See [Note: predicting a CUDA device] in
        predict/prediction.py."""
        if self.device_type != "cuda":
            return None
        from hybridplan.runtime.gpu_memory import LIBRARY_BYTES, estimate_overhead_bytes, CUDA_CONTEXT_BYTES

        if plan is None:
            return CUDA_CONTEXT_BYTES + sum(LIBRARY_BYTES.values())
        return estimate_overhead_bytes(plan, device, set(LIBRARY_BYTES))

    def outside_bytes_by_device(self, plan: Plan) -> dict[int, int] | None:
        """:meth:`outside_bytes` of every device of ``plan`` at once (None for a CPU profile)."""
        if self.device_type != "cuda":
            return None
        from hybridplan.runtime.gpu_memory import LIBRARY_BYTES, overhead_bytes_by_device

        return overhead_bytes_by_device(plan, set(LIBRARY_BYTES))
