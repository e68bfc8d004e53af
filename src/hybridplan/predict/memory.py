"""Per-device peak memory of any plan, from a profile database (CAPTURE seed 000 III-B, extended).

For a stage ``[a, b)`` run as ``kind`` x ``degree`` at some position of a plan:

1. its quantities (profiling/quantities.py) at each profiled batch size: measured if that exact span
   was profiled, else ``M_i(a) + sum M_a(a+1..b-1)`` (profiling/statistics.py);
2. scaled to the plan's batch by the straight line through the two profiled sizes (seed 000 III-B2):
   per micro-batch quantities against the micro-batch size, the data share against the global batch;
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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybridplan.errors import PlanError, ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.plan.schedule import in_flight_count
from hybridplan.predict.reserved import ReservedExcess, reserved_peak_from, reserved_excess
from hybridplan.predict.stash import StashAdjustment
from hybridplan.predict.zero import (ZeroLayout, Zero2Transients, gathered_backward_transient, loss_phases,
                                     prefetched_bytes, sharded_backward_floor, sharded_forward_transient,
                                     unsharded_backward_bound, zero2_peak)
from hybridplan.profiling.quantities import INDEX, QUANTITIES
from hybridplan.profiling.schedule_memory import peak_terms
from hybridplan.profiling.statistics import SpanStatistics

if TYPE_CHECKING:
    from hybridplan.profiling.database import ProfileDB

__all__ = ["MemoryPredictor", "DevicePrediction", "PlanPrediction", "DEGREE_FITS", "EXTRAPOLATION_LIMIT"]

DEGREE_FITS = ("log", "inverse")

EXTRAPOLATION_LIMIT = 4.0
"""How far beyond the largest profiled batch a prediction goes before :meth:`MemoryPredictor.scaling_note`
warns: a campaign profiles B/2 and B/4 (seed 000 III-A2), so its own target is 2x the largest profiled
batch; 4x is twice as far as the campaign itself extrapolates."""
_PEAK = len(QUANTITIES)  # column of the measured peak in SpanStatistics vectors


@dataclass
class DevicePrediction:
    """Predicted memory of one device.

    [Note: predicting a CUDA device] From a profile taken on (simulated or real) CUDA devices, the peak is in
    the caching allocator's terms (blocks and cuBLAS workspaces: runtime/gpu_memory.py), what
    ``max_memory_allocated`` shows. The allocator's RESERVED peak is that peak plus the excess the profile
    measured (reserved beyond the tensor peak rounded up to 2 MiB) for the nearest profiled span of the stage's
    scenario, rounded up to whole 2 MiB ([Note: predicting the reserved peak] in predict/reserved.py). The
    memory outside the allocator is added from the plan (``estimate_overhead_bytes``: the context, every library
    a zoo model may load, the device's NCCL communicators), so ``total_bytes`` = reserved + outside is what must
    fit the device. A CUDA profile written before reserved peaks were recorded does not predict the reserved
    peak (``reserved_peak_bytes`` None); its ``total_bytes`` is tensor peak + outside, a lower bound.
    """

    device: int
    stage: int
    peak_memory_bytes: int
    in_flight: int
    quantities: dict[str, int] = field(default_factory=dict)
    overhead_bytes: int | None = None
    """CUDA: memory outside the caching allocator, estimated (runtime/gpu_memory.py); None on a CPU."""
    reserved_peak_bytes: int | None = None
    """CUDA: the allocator's predicted reserved peak; None on a CPU or from a profile that did not record reserved
    peaks (see [Note: predicting a CUDA device])."""
    total_bytes: int | None = None
    """CUDA: ``reserved_peak_bytes + overhead_bytes`` (``peak_memory_bytes + overhead_bytes``, a lower bound, when
    the reserved peak is not predicted), the device memory the plan needs; None on a CPU."""

    @property
    def needed_bytes(self) -> int:
        """What must fit the device's capacity: the total on CUDA, the tensor peak on a CPU."""
        return self.peak_memory_bytes if self.total_bytes is None else self.total_bytes


@dataclass
class PlanPrediction:
    """Predicted per-device peaks of a plan."""

    devices: list[DevicePrediction]
    method: str

    @property
    def peak_memory_bytes(self) -> int:
        return max(d.peak_memory_bytes for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "peak_memory_bytes": self.peak_memory_bytes, "devices": [asdict(d) for d in self.devices]}


def _span_in_units(stats: SpanStatistics, start: int, stop: int) -> np.ndarray | None:
    """A span given in original layers, looked up in statistics that may be on merged layers."""
    if stats.bounds is None:
        return stats.span(start, stop)
    try:
        return stats.span(stats.bounds.index(start), stats.bounds.index(stop))
    except ValueError:  # not on the merged layers' boundaries
        return None


def _table_in_layers(stats: SpanStatistics, num_layers: int) -> np.ndarray:
    """``[L, L+1, Q]`` span table in original layers (NaN where merged statistics cannot say)."""
    table = stats.all_spans()
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
    did); where it never did, the start is kept.
    """
    tb0, tb = INDEX["first_backward_transient"], INDEX["backward_transient"]
    ga = lambda v: v[..., INDEX["gradient"]] - v[..., INDEX["activation"]]  # noqa: E731
    x1, x2 = v1[..., tb0] - ga(v1), v2[..., tb0] - ga(v2)
    end1, end2 = v1[..., tb0] > v1[..., tb], v2[..., tb0] > v2[..., tb]
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(
            end1 & end2,
            x1 + (x2 - x1) * (b - b1) / (b2 - b1),
            np.where(end2, x2 * b / b2, np.where(end1, x1 * b / b1, -np.inf)),
        )
        return np.maximum(target[..., tb], ga(target) + x)


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
    ) -> None:
        if degree_fit not in DEGREE_FITS:
            raise ProfileError(f"unknown degree fit {degree_fit!r}", fix=f"use one of {list(DEGREE_FITS)}")
        if method not in ("quantities", "capture"):
            raise ProfileError(f"unknown prediction method {method!r}", fix="use 'quantities' or 'capture'")
        if global_batch_size % num_microbatches:
            raise PlanError(f"global batch {global_batch_size} does not split into {num_microbatches} micro-batches")
        self.stats = stats
        self.num_layers = num_layers
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
        """The profiled devices' type: "cuda" adds the memory outside the allocator ([Note: predicting a CUDA device])."""
        self.recomputed = recomputed
        """[Note: recompute chosen per stage] The predictor of a second profile of the same model and cluster, taken
        with recompute (``hybridplan profile --activation-checkpointing``): it predicts the stages a plan marks
        ``"recompute": "full"``, this one the others. A stage's memory depends on its own layers, kind, degree,
        schedule position and recompute, not on whether its neighbours recompute (what crosses a boundary has the
        model's shapes either way), so the two profiles compose stage by stage; profiling both doubles the runs."""
        self.zero_layout = zero_layout
        """The profiled model's parameter shapes, which say what ZeRO shards ([Note: predicting ZeRO from a
        profile] in predict/zero.py); None for a profile that did not record them."""
        self.reserved = reserved
        """CUDA: the excess the profile measured above the tensor peak, which predicts the allocator's reserved peak
        ([Note: predicting the reserved peak] in predict/reserved.py); None: not predicted."""
        self._stash = StashAdjustment(self.stash, num_layers=num_layers, schedule=schedule, profile_schedule=profile_schedule)
        self._tables: dict[tuple[str, int], np.ndarray] = {}
        self._replicas: dict[int, MemoryPredictor] = {}

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
        """A predictor from a profile database file; unset targets default to the campaign's.

        ``recompute_db``: a profile of the same model and cluster taken with recompute, which predicts the stages
        a plan recomputes ([Note: recompute chosen per stage]).

        Raises:
            ProfileError: if ``recompute_db`` was not taken with recompute, or profiles another model or cluster.
        """
        from hybridplan.profiling.database import ProfileDB

        with ProfileDB(path) as db:
            predictor = cls.from_profile(db, schedule=schedule, global_batch_size=global_batch_size,
                                         num_microbatches=num_microbatches, degree_fit=degree_fit, method=method)
            identity = db.identity
        if recompute_db is None:
            return predictor
        with ProfileDB(recompute_db) as other:
            recomputed = cls.from_profile(other, schedule=predictor.schedule,
                                          global_batch_size=predictor.global_batch_size,
                                          num_microbatches=predictor.num_microbatches, degree_fit=degree_fit,
                                          method=method)
            other_identity = other.identity
        where = f"--recompute-db {str(recompute_db)!r}"
        if not recomputed.recompute:
            raise ProfileError(f"{where} was profiled without recompute",
                               fix="give a profile taken with 'hybridplan profile ... --activation-checkpointing'")
        if predictor.recompute:
            raise ProfileError(f"{str(path)!r} was itself profiled with recompute; {where} adds nothing",
                               fix="give the profile taken without recompute as --db")
        def training(ident: dict) -> dict:  # the run options that shape memory, recompute and backend aside
            options = ident.get("run_options") or {}
            return {k: v for k, v in options.items() if k not in ("activation_checkpointing", "backend")}

        identity["training"], other_identity["training"] = training(identity), training(other_identity)
        for key in ("model", "model_config", "num_layers", "cluster", "seed", "training"):
            if identity.get(key) != other_identity.get(key):
                raise ProfileError(f"{where} profiles another {key} than {str(path)!r}"
                                   f" ({other_identity.get(key)!r} vs {identity.get(key)!r})",
                                   fix="profile the same model on the same cluster with --activation-checkpointing")
        predictor.recomputed = recomputed
        return predictor

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
        """A predictor from an open profile database; unset targets default to the campaign's.

        Raises:
            ProfileError: if the database holds no memory campaign.
        """
        db.require_memory()
        meta = db.meta
        shapes = meta.get("parameter_shapes")
        return cls(
            db.statistics,
            num_layers=meta["num_layers"],
            schedule=schedule or meta["schedule"],
            global_batch_size=global_batch_size or meta["global_batch_size"],
            num_microbatches=num_microbatches or meta["num_microbatches"],
            degree_fit=degree_fit,
            method=method,
            profile_schedule=meta["schedule"],
            stash=db.weight_stash,
            recompute=bool(db.run_options.get("activation_checkpointing", False)),
            device_type=db.run_options.get("device_type", "cpu"),
            zero_layout=None if shapes is None else ZeroLayout(shapes, meta.get("tensor_shard_shapes"),
                                                               precision=db.run_options.get("precision", "fp32")),
            reserved=reserved_excess(db),
        )

    @property
    def microbatch_size(self) -> int:
        return self.global_batch_size // self.num_microbatches

    def scaling_note(self) -> str | None:
        """One line if the target batch lies far beyond the profiled ones (:data:`EXTRAPOLATION_LIMIT`), else None.

        The batch scaling is a straight line through two measured sizes; far beyond them nothing was
        measured, so the prediction is an extrapolation a user should know about (and may re-profile for).
        """
        sizes = [s for per_size in self.stats.values() for s in per_size]
        if not sizes:
            return None
        big_global = max(s.batch_size for s in sizes)
        big_micro = max(s.microbatch_size for s in sizes)
        ratio = max(self.global_batch_size / big_global, self.microbatch_size / big_micro)
        if ratio <= EXTRAPOLATION_LIMIT:
            return None
        return (f"warning: global batch {self.global_batch_size} (micro-batches of {self.microbatch_size}) is {ratio:.3g}x"
                f" the largest profiled ({big_global}, micro-batches of {big_micro}): the batch scaling is extrapolated"
                " that far from its two measured sizes; profile near this batch for a measured answer")

    # ------------------------------------------------------------------ per stage
    def _scenario(self, kind: str, degree: int) -> tuple[str, int]:
        return ("none", 1) if degree == 1 else (kind, degree)

    def _zero_source(self, kind: str, zero: int) -> str | None:
        """The profiled kind a ZeRO stage is predicted from ([Note: predicting ZeRO from a profile]), or None
        where the profile cannot say (ZeRO of a data x tensor stage, ZeRO-2 in mixed precision, no parameter shapes
        recorded)."""
        if self.zero_layout is None or kind != "data" or (zero == 2 and self.zero_layout.precision != "fp32"):
            return None
        return {1: "data", 2: "data-zero3", 3: "data-zero3"}.get(zero)

    def profiled_degrees(self, kind: str) -> list[int]:
        """Degrees profiled for ``kind`` (with statistics at two batch sizes)."""
        return sorted(d for (k, d), s in self.stats.items() if k == kind and len(s) >= 2)

    def _scaled(self, values: list[np.ndarray], sizes: list[SpanStatistics]) -> np.ndarray:
        """Linear fit through the two profiled batch sizes, evaluated at the target (seed 000 III-B2).

        ``values`` hold one array per profiled size whose LAST axis runs over the statistics (a span's
        vector, or a whole ``[L, L+1, Q]`` table).
        """
        (s1, v1), (s2, v2) = sorted(zip(sizes, values), key=lambda p: p[0].microbatch_size)[:2]
        b1, b2, b = s1.microbatch_size, s2.microbatch_size, self.microbatch_size
        t = (b - b1) / (b2 - b1)
        out = v1 + (v2 - v1) * t
        # The data share grows with the global batch, not the micro-batch.
        g = (self.global_batch_size - s1.batch_size) / (s2.batch_size - s1.batch_size)
        d = INDEX["data"]
        out[..., d] = v1[..., d] + (v2[..., d] - v1[..., d]) * g
        out[..., INDEX["first_backward_transient"]] = _first_backward(v1, v2, out, b1, b2, b)
        return out

    def span_quantities(self, start: int, stop: int, kind: str, degree: int) -> np.ndarray | None:
        """Quantities (and, last, the measured-peak statistic) of a profiled scenario, scaled to the target batch."""
        sizes = self.stats.get(self._scenario(kind, degree))
        wider = None if sizes else self._wider_data(kind, degree)
        if wider is not None:  # [Note: a data stage wider than the profiled ones]
            return wider[0].span_quantities(start, stop, "data", wider[1])
        if not sizes or len(sizes) < 2:
            return None
        found = [_span_in_units(s, start, stop) for s in sizes]
        vectors = [v for v in found if v is not None]
        if len(vectors) < len(found):
            return None
        return self._stash.apply(self._scaled(vectors, sizes), start, stop, kind, degree)

    def _profiled_peak(self, start: int, stop: int, kind: str, degree: int, stages_after: int) -> float | None:
        q = self.span_quantities(start, stop, kind, degree)
        if q is None:
            return None
        if self.method == "capture":
            return float(q[_PEAK])
        return float(np.max(peak_terms(self.schedule, stages_after, self.num_microbatches) @ q[:_PEAK]))

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
            peaks = (self.zero_tensor_peaks(start, stop, zero, degree, tensor_degree, stages_after) if kind == "data+tensor"
                     else self.zero_peaks(start, stop, kind, zero, degree, stages_after))
            return math.inf if peaks is None else max(peaks)
        if kind == "data+tensor":
            replica = self._replica(degree, tensor_degree)
            return math.inf if replica is None else replica.stage_memory(start, stop, "tensor", tensor_degree, stages_after)
        if degree == 1 or (kind, degree) in self.stats:
            value = self._profiled_peak(start, stop, kind, degree, stages_after)
            return math.inf if value is None else value
        wider = self._wider_data(kind, degree)
        if wider is not None:  # [Note: a data stage wider than the profiled ones]
            return wider[0].stage_memory(start, stop, "data", wider[1], stages_after)
        degrees = self.profiled_degrees(kind)
        if len(degrees) < 2 or (kind == "data-zero3" and degree > degrees[-1]):  # see _check_zero
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

    def zero_peaks(self, start: int, stop: int, kind: str, zero: int, degree: int, stages_after: int) -> list[float] | None:
        """Each rank's predicted peak of a ZeRO stage (None if the profile cannot say; [Note: predicting ZeRO from a
        profile]): the profiled stage's quantities with the rank's ``static`` and step transient, replayed; a
        fitted degree moves the fitted peak by the static difference alone."""
        source, layout = self._zero_source(kind, zero), self.zero_layout
        if source is None or layout is None:
            return None
        if zero == 2:
            return self._zero2_peaks(start, stop, degree, stages_after)
        shifts = [layout.shift(start, stop, zero, degree, r) for r in range(degree)]
        refine = self._zero3_quantities if zero == 3 and layout.precision == "fp32" else None
        return self._shifted_peaks(start, stop, source, degree, stages_after, shifts, refine)

    def zero_tensor_peaks(self, start: int, stop: int, zero: int, degree: int, tensor_degree: int,
                          stages_after: int) -> list[float] | None:
        """Each data-group rank's predicted peak of a ZeRO-1 data x tensor stage of ``degree`` devices (every tensor
        rank alike; [Note: ZeRO-1 of a data x tensor stage] in predict/zero.py), or None where the profile cannot
        say: ZeRO-2/3, no shard shapes recorded at ``tensor_degree``, or a batch the replicas cannot split."""
        layout, replica = self._tensor_shards(tensor_degree), self._replica(degree, tensor_degree)
        if zero != 1 or layout is None or replica is None:
            return None
        data = degree // tensor_degree
        shifts = [layout.shift(start, stop, zero, data, r) for r in range(data)]
        return replica._shifted_peaks(start, stop, "tensor", tensor_degree, stages_after, shifts)

    def _tensor_shards(self, tensor_degree: int) -> ZeroLayout | None:
        return None if self.zero_layout is None else self.zero_layout.of_tensor_shards(tensor_degree)

    def _shifted_peaks(self, start: int, stop: int, kind: str, degree: int, stages_after: int,
                       shifts: list[tuple[int, int]],
                       refine: Callable[[int, int, int, np.ndarray], np.ndarray] | None = None) -> list[float] | None:
        """The peaks of the profiled stage ``kind`` x ``degree`` with its ``static`` and step transient moved by each
        ``(static, step)`` shift (one per device): its quantities replayed with them; a fitted degree (or CAPTURE's
        peak statistic) moves the peak by the static shift alone. ``refine`` (ZeRO-3's rules) rewrites the quantities
        before the replay. None if the stage is not predicted."""
        measured = (kind, degree) in self.stats or self._wider_data(kind, degree) is not None
        q = self.span_quantities(start, stop, kind, degree) if measured else None
        if q is None or self.method == "capture":
            base = self.stage_memory(start, stop, kind, degree, stages_after)
            if not math.isfinite(base):
                return None
            return [base + static for static, _ in shifts]
        terms = peak_terms(self.schedule, stages_after, self.num_microbatches)
        if refine is not None:
            q = refine(start, stop, degree, q)
        out = []
        for static, step in shifts:
            v = q[:_PEAK].copy()
            v[INDEX["static"]] += static
            v[INDEX["step_transient"]] += step
            out.append(float(np.max(terms @ v)))
        return out

    def _zero_ranks(self, stage: StagePlan) -> tuple[ZeroLayout | None, int, Callable[[int], int]]:
        """What shards a ZeRO stage's state, over how many ranks, and each device's rank there: the stage's
        parameters over all its devices for a data stage, a tensor rank's shards over its data group for a data x
        tensor stage (a group's ranks follow the global ranks: dist.new_group sorts them)."""
        if stage.kind != "data+tensor":
            return self.zero_layout, stage.degree, sorted(stage.devices).index
        t = stage.tensor_degree
        return (self._tensor_shards(t), stage.data_degree,
                lambda device: sorted(stage.data_group(stage.devices.index(device) % t)).index(device))

    def _zero3_quantities(self, start: int, stop: int, degree: int, q: np.ndarray) -> np.ndarray:
        """A ZeRO-3 span's scenario quantities ``q`` with the fp32 rules applied: its forward transient from the
        data stage's prefixes, its backwards raised to their floor, and under GPipe its later backward without the
        prefetched layer ([Note: predicting ZeRO from a profile] in predict/zero.py)."""
        q = self._floored_backwards(start, stop, degree, q.copy())
        if self.schedule == "gpipe":
            q[INDEX["backward_transient"]] -= self._unfetched(start, stop, degree)
        last_added = None
        if stop == self.num_layers:  # [Note: the loss runs outside every FSDP unit] in predict/zero.py
            head = self._loss_phases(degree, "forward_transient", 2)
            if head is not None:
                module, loss = head
                gathered = 2 * self._last_gathered(degree)
                last_added = gathered if loss == -math.inf else max(module + gathered, loss) - max(module, loss)
        forward = self._sharded_forward(start, stop, degree, keep=False, last_added=last_added)
        if forward is not None:
            q[INDEX["forward_transient"]] = forward
        return q

    def _last_gathered(self, degree: int) -> int:
        """The model's last layer's gathered bytes over ``degree`` ranks (0 without parameter shapes)."""
        return 0 if self.zero_layout is None else self.zero_layout.gathered_bytes(self.num_layers - 1, self.num_layers,
                                                                                  degree)[0]

    def _loss_phases(self, degree: int, name: str, copies: int) -> tuple[float, float] | None:
        """The model's last layer's ``(head, loss)`` phases of transient ``name`` at the target batch, from that layer
        measured alone in the data and ZeRO-3 scenarios (:func:`~hybridplan.predict.zero.loss_phases`; FSDP holds
        ``copies`` x its gathered bytes in the head's phase); None where either scenario lacks it at two sizes or the
        layer has no parameters ([Note: the loss runs outside every FSDP unit] in predict/zero.py)."""
        gathered = self._last_gathered(degree)
        data, zero3 = self.stats.get(("data", degree)), self.stats.get(("data-zero3", degree))
        if not gathered or not data or not zero3:
            return None
        last, i = self.num_layers - 1, INDEX[name]

        def alone(stats: list[SpanStatistics]) -> dict[int, float]:
            found = {s.microbatch_size: _span_in_units(s, last, last + 1) for s in stats}
            return {b: float(v[i]) for b, v in found.items() if v is not None and not np.isnan(v[i])}

        plain, sharded = alone(data), alone(zero3)
        sizes = sorted(b for b in plain if b in sharded)[:2]
        if len(sizes) < 2:
            return None
        return loss_phases(sizes, [plain[b] for b in sizes], [sharded[b] for b in sizes], copies * gathered,
                           self.microbatch_size)

    def _sharded_forward(self, start: int, stop: int, degree: int, *, keep: bool,
                         last_added: float | None = None) -> float | None:
        """A ZeRO-3 forward's transient (``keep``: ZeRO-2's gathering forward) from the data scenario's prefixes
        ([Note: the sharded forward from the data stage] in predict/zero.py); None where they are unknown.
        ``last_added``: what FSDP adds at the span's last layer, the model's ([Note: the loss runs outside every FSDP
        unit])."""
        if self.zero_layout is None or ("data", degree) not in self.stats:
            return None
        table = self._scaled_table("data", degree)  # every span at once: the search asks for every span
        prefixes = None if table is None else table[start, start + 1:stop + 1]
        if prefixes is None or np.isnan(prefixes[:, :_PEAK]).any():
            return None
        return sharded_forward_transient(prefixes[:, INDEX["forward_transient"]].tolist(),
                                         prefixes[:, INDEX["activation"]].tolist(),
                                         self.zero_layout.gathered_bytes(start, stop, degree), keep=keep,
                                         last_added=last_added)

    def _floored_backwards(self, start: int, stop: int, degree: int, q: np.ndarray) -> np.ndarray:
        """``q`` (a ZeRO-3 span's quantities) with its backward transients raised to their floor from the data
        scenario's suffixes ([Note: the sharded backward's floor] in predict/zero.py), where those are known; at the
        model's last layer from its head's and loss's phases ([Note: the loss runs outside every FSDP unit])."""
        table = self._scaled_table("data", degree)
        if table is None or self.zero_layout is None:
            return q
        gathered = self.zero_layout.gathered_bytes(start, stop, degree)
        out = q.copy()
        for name in ("first_backward_transient", "backward_transient"):
            suffix = table[start:stop, stop, INDEX[name]]
            loss = self._loss_phases(degree, name, 1) if stop == self.num_layers else None
            if not np.isnan(suffix).any():
                out[INDEX[name]] = max(out[INDEX[name]], sharded_backward_floor(suffix.tolist(), gathered, loss=loss))
        return out

    def _unfetched(self, start: int, stop: int, degree: int) -> int:
        """How much lower a ZeRO-3 backward after a backward is than the profile's later backward, taken under a
        schedule whose later backwards follow forwards ([Note: a backward after a backward] in predict/zero.py)."""
        table = self._scaled_table("data-zero3", degree)
        if self.profile_schedule in (None, "gpipe") or table is None or self.zero_layout is None:
            return 0
        suffix = [table[j, stop, INDEX["backward_transient"]] for j in range(start, stop)]
        return prefetched_bytes([-math.inf if math.isnan(v) else float(v) for v in suffix],
                                self.zero_layout.gathered_bytes(start, stop, degree))

    def _zero2_peaks(self, start: int, stop: int, degree: int, stages_after: int) -> list[float] | None:
        """Each rank's ZeRO-2 peak ([Note: predicting ZeRO-2 from the ZeRO-3 scenario] in predict/zero.py): the
        ZeRO-3 scenario's quantities, its prefixes' forward and suffixes' backward transients, the data scenario's
        forward transient and the gathered parameter bytes, replayed; None without both scenarios at ``degree``."""
        layout = self.zero_layout
        if layout is None or self.method == "capture" or not {("data-zero3", degree), ("data", degree)} <= set(self.stats):
            return None
        q = self.span_quantities(start, stop, "data-zero3", degree)
        plain = self.span_quantities(start, stop, "data", degree)
        if q is None or plain is None:
            return None
        gathered = layout.gathered_bytes(start, stop, degree)
        total = sum(gathered)

        table = self._scaled_table("data-zero3", degree)
        if table is None:
            return None

        def column(spans: list[tuple[int, int]], name: str) -> list[float]:  # unknown spans raise nothing
            found = [table[a, b, INDEX[name]] for a, b in spans]
            return [-math.inf if math.isnan(v) else float(v) for v in found]

        gathering = self._sharded_forward(start, stop, degree, keep=True)
        if gathering is None:
            return None
        suffixes = [(j, stop) for j in range(start, stop)]
        activation = float(q[INDEX["activation"]])
        transients = Zero2Transients(
            gathering_forward=max(activation + total, gathering),
            gathered_forward=float(plain[INDEX["forward_transient"]]),
            first_backward=min(gathered_backward_transient(column(suffixes, "first_backward_transient"), gathered, 0.0),
                               unsharded_backward_bound(float(plain[INDEX["first_backward_transient"]]), gathered, degree)),
            gathered_backward=min(gathered_backward_transient(column(suffixes, "backward_transient"), gathered, 0.0),
                                  unsharded_backward_bound(float(plain[INDEX["backward_transient"]]), gathered, degree)),
        )
        out = []
        for r in range(degree):
            v = q[:_PEAK].copy()
            v[INDEX["backward_transient"]] -= self._unfetched(start, stop, degree)  # its only use: after a backward
            v[INDEX["static"]] += layout.static_delta(start, stop, 2, degree, r)
            out.append(zero2_peak(v, transients, total, self.schedule, stages_after, self.num_microbatches))
        return out

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
        return self._at_batch(self.global_batch_size // data)

    def _at_batch(self, global_batch_size: int) -> MemoryPredictor:
        """This predictor at another global batch (same micro-batch count), kept for the next stage that asks."""
        if global_batch_size not in self._replicas:
            self._replicas[global_batch_size] = self.retargeted(global_batch_size=global_batch_size)
        return self._replicas[global_batch_size]

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
        batch]); ZeRO-1 then moves each rank's optimizer share for D ranks as for any ZeRO-1 stage
        (:meth:`zero_peaks`). CAPTURE's degree fit through data x2 and x4 (seed 000's log fit, which
        ``method="capture"`` keeps) lets every byte fall with the degree, while a replica's parameters, gradients
        and optimizer state do not: measured on 2x4 (benchmarks/extended_accuracy, 10 data x8 stages of
        gpt-tiny, wresnet-tiny and moe-tiny, unsharded and ZeRO-1, simulated devices) the fit was 9.2% to 82.7%
        below the measured peak, this composition 0.00% on 8 of them and 0.09% and 0.13% on moe-tiny's two under
        GPipe (on MoE 1.3B on H100s, a data x8 stage fitted at 9.82 GiB measured 16.35 GiB). ZeRO-3 and ZeRO-2
        shard with the degree, so they are not composed this way (:meth:`_check_zero`).

        None where this does not apply: another kind, a profiled or not wider degree, ``method="capture"``, or a
        micro-batch that does not split ``degree`` ways.
        """
        if kind != "data" or self.method == "capture" or self.microbatch_size % degree:
            return None
        profiled = self.profiled_degrees("data")
        if not profiled or degree <= profiled[-1] or ("data", degree) in self.stats:
            return None
        d = profiled[-1]
        return self._at_batch(self.global_batch_size * d // degree), d

    def stage_memory_matrix(self, kind: str, degree: int, stages_after: int, num_layers: int, *,
                            tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        """``[start, stop]`` -> stage_memory for every span at once (``inf`` where not predictable)."""
        L = num_layers
        out = np.full((L, L + 1), math.inf)
        if recompute and not self.recompute:
            if self.recomputed is None:
                return out
            return self.recomputed.stage_memory_matrix(kind, degree, stages_after, L, tensor_degree=tensor_degree,
                                                       zero=zero)
        if zero:
            source = kind if kind == "data+tensor" else self._zero_source(kind, zero)
            if source is None or self.zero_layout is None:
                return out
            base = self.stage_memory_matrix(source, degree, stages_after, L, tensor_degree=tensor_degree)
            for start, stop in zip(*np.nonzero(np.isfinite(base))):
                out[start, stop] = self.stage_memory(int(start), int(stop), kind, degree, stages_after,
                                                     tensor_degree=tensor_degree, zero=zero)
            return out
        if kind == "data+tensor":
            replica = self._replica(degree, tensor_degree)
            return out if replica is None else replica.stage_memory_matrix("tensor", tensor_degree, stages_after, L)
        if kind in ("data", "data-zero3") and degree > 1 and self.microbatch_size % degree:
            return out
        wider = None if (kind, degree) in self.stats else self._wider_data(kind, degree)
        if wider is not None:  # [Note: a data stage wider than the profiled ones]
            return wider[0].stage_memory_matrix("data", wider[1], stages_after, L)
        if degree != 1 and (kind, degree) not in self.stats:
            degrees = self.profiled_degrees(kind)
            if len(degrees) < 2 or (kind == "data-zero3" and degree > degrees[-1]):  # see _check_zero
                return out
            d1, d2 = degrees[-2], degrees[-1]
            p1 = self.stage_memory_matrix(kind, d1, stages_after, L)
            p2 = self.stage_memory_matrix(kind, d2, stages_after, L)
            with np.errstate(invalid="ignore"):
                if self.degree_fit == "log":
                    fitted = p1 + (p2 - p1) * math.log(degree / d1) / math.log(d2 / d1)
                else:
                    beta = (p1 - p2) / (1 / d1 - 1 / d2)
                    fitted = p2 - beta / d2 + beta / degree
            return np.where(np.isfinite(p1) & np.isfinite(p2), fitted, math.inf)
        table = self._scaled_table(kind, degree)
        if table is None:
            return out
        if self.method == "capture":
            values = table[..., _PEAK]
        else:
            values = np.max(table[..., :_PEAK] @ peak_terms(self.schedule, stages_after, self.num_microbatches).T, axis=-1)
        return np.where(np.isnan(values), math.inf, values)

    def _scaled_table(self, kind: str, degree: int) -> np.ndarray | None:
        key = self._scenario(kind, degree)
        if key not in self._tables:
            sizes = self.stats.get(key)
            if not sizes or len(sizes) < 2:
                return None
            spans = [_table_in_layers(s, self.num_layers) for s in sizes]
            table = self._stash.apply(self._scaled(spans, sizes), None, None, *key)
            if table is None:
                return None
            self._tables[key] = table
        return self._tables[key]

    def retargeted(self, *, schedule: str | None = None, global_batch_size: int | None = None,
                   num_microbatches: int | None = None) -> MemoryPredictor:
        """This predictor's profile at other targets (unset ones kept)."""
        return MemoryPredictor(
            self.stats,
            num_layers=self.num_layers,
            schedule=schedule or self.schedule,
            global_batch_size=global_batch_size or self.global_batch_size,
            num_microbatches=num_microbatches or self.num_microbatches,
            degree_fit=self.degree_fit,
            method=self.method,
            profile_schedule=self.profile_schedule,
            stash=self.stash,
            recompute=self.recompute,
            recomputed=None if self.recomputed is None else self.recomputed.retargeted(
                schedule=schedule, global_batch_size=global_batch_size, num_microbatches=num_microbatches),
            device_type=self.device_type,
            zero_layout=self.zero_layout,
            reserved=self.reserved,
        )

    def on_units(self, bounds: list[int]) -> UnitView:
        """This predictor seen on merged layers (for the search; see profiling/merger.py)."""
        return UnitView(self, bounds)

    # ------------------------------------------------------------------ plans
    def predict(self, plan: Plan) -> PlanPrediction:
        """Per-device predicted peaks of ``plan``.

        Raises:
            PlanError: if the plan does not fit the profiled model.
            ProfileError: if a stage cannot be predicted from the profile (naming it and why).
        """
        plan.validate(num_layers=self.num_layers)
        if (plan.schedule, plan.global_batch_size, plan.num_microbatches) != (
            self.schedule,
            self.global_batch_size,
            self.num_microbatches,
        ):
            return self.retargeted(schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                   num_microbatches=plan.num_microbatches).predict(plan)
        self._check_measured_kinds(plan)
        devices = []
        for i, stage in enumerate(plan.stages):
            after = plan.num_stages - 1 - i
            # [Note: a data x tensor stage is a tensor stage at a smaller batch] Each of the d replicas of a
            # "data+tensor" stage runs exactly what a t-way tensor stage runs with micro-batches of b/d samples:
            # the same layer shards and optimizer state, activations and received buffers of b/d rows, the
            # same schedule position; its gradient all-reduce leaves no buffer behind. So it is the tensor
            # stage predicted at the global batch B/d (same micro-batch count).
            base = self.recomputed if stage.recompute == "full" and not self.recompute else self
            if base is None:  # _check_measured_kinds refuses this first; kept for a caller that skipped it
                raise ProfileError(f"stage {i} ({stage.describe()}) recomputes, but no recompute profile was given",
                                   fix="pass --recompute-db, a profile taken with --activation-checkpointing")
            source, degree = base, stage.degree
            kind: str = stage.kind
            if stage.zero:  # [Note: predicting ZeRO from a profile] (predict/zero.py); refused by now if unpredictable
                kind = base._zero_source(kind, stage.zero) or kind
            if kind == "data+tensor":
                replica = base._replica(stage.degree, stage.tensor_degree)
                if replica is not None:
                    source, kind, degree = replica, "tensor", stage.tensor_degree
            value = source.stage_memory(stage.start, stage.stop, kind, degree, after)
            if not math.isfinite(value):
                raise ProfileError(
                    f"stage {i} ({stage.describe()}) cannot be predicted: {source._why_missing(stage.start, stage.stop, kind, degree)}",
                    fix="profile the missing scenario (hybridplan profile ... --scenarios), or change the plan",
                )
            q = source.span_quantities(stage.start, stage.stop, kind, degree)
            breakdown = {} if q is None else {name: int(round(v)) for name, v in zip(QUANTITIES, q[:_PEAK])}
            flight = in_flight_count(plan.schedule, plan.num_stages, i, plan.num_microbatches)
            peaks = None
            if stage.zero:
                peaks = (base.zero_tensor_peaks(stage.start, stage.stop, stage.zero, stage.degree, stage.tensor_degree,
                                                after) if stage.kind == "data+tensor"
                         else base.zero_peaks(stage.start, stage.stop, stage.kind, stage.zero, degree, after))
            layout, world, rank_of = base._zero_ranks(stage)
            if stage.zero and stage.kind == "data" and peaks is None:  # ZeRO-2 needs the quantities ("capture" keeps only peaks)
                raise ProfileError(f"stage {i} ({stage.describe()}) cannot be predicted: ZeRO-{stage.zero} needs the"
                                   f" data{degree} and data{degree}-zero3 scenarios' quantities",
                                   fix="predict with the default method (quantities), or profile with --zero")
            for d in stage.devices:
                mine, peak = breakdown, value
                if peaks is not None and layout is not None:
                    r = rank_of(d)
                    peak = peaks[r]
                    if breakdown:
                        static, step = layout.shift(stage.start, stage.stop, stage.zero, world, r)
                        mine = {**breakdown, "static": breakdown["static"] + static,
                                "step_transient": breakdown["step_transient"] + step}
                rounded = int(round(peak))
                outside = self.outside_bytes(plan, d)
                excess = None if outside is None or source.reserved is None else source.reserved.excess(
                    stage.start, stage.stop, kind, degree, source.microbatch_size)
                reserved = None if excess is None else reserved_peak_from(rounded, excess)
                held = rounded if reserved is None else reserved  # what the allocator holds, at least
                devices.append(DevicePrediction(d, i, rounded, flight, mine, overhead_bytes=outside,
                                                reserved_peak_bytes=reserved,
                                                total_bytes=None if outside is None else held + outside))
        devices.sort(key=lambda d: d.device)
        return PlanPrediction(devices, self.method)

    def outside_bytes(self, plan: Plan | None, device: int = 0) -> int | None:
        """CUDA: the memory ``device`` of ``plan`` holds outside the allocator (plan None: without any NCCL
        communicator, a floor for every plan); None for a CPU profile. See [Note: predicting a CUDA device]."""
        if self.device_type != "cuda":
            return None
        from hybridplan.runtime.gpu_memory import LIBRARY_BYTES, estimate_overhead_bytes, CUDA_CONTEXT_BYTES

        if plan is None:
            return CUDA_CONTEXT_BYTES + sum(LIBRARY_BYTES.values())
        return estimate_overhead_bytes(plan, device, set(LIBRARY_BYTES))

    def _check_measured_kinds(self, plan: Plan) -> None:
        """Refuse stages the profile did not measure in kind: ZeRO sharding, or recompute asked of a stage when
        the profile ran without it (their memory differs from what the statistics hold, so a prediction would be
        silently wrong). A profile taken with recompute predicts every stage recomputed, as its runs did."""
        for i, stage in enumerate(plan.stages):
            base = self.recomputed if stage.recompute == "full" and not self.recompute and self.recomputed else self
            if stage.zero:
                self._check_zero(i, stage, base)
            if stage.recompute == "full" and not self.recompute and self.recomputed is None:
                raise ProfileError(
                    f"stage {i} ({stage.describe()}) recomputes its activations; the profile was taken without recompute",
                    fix="profile the model again with --activation-checkpointing and give that database as"
                    " --recompute-db, or drop \"recompute\" from the stage",
                )

    @staticmethod
    def _check_zero(i: int, stage: Any, base: MemoryPredictor) -> None:
        """Refuse a ZeRO stage the profile cannot predict, saying why ([Note: predicting ZeRO from a profile])."""
        where = f"stage {i} ({stage.describe()})"
        instead = "count it exactly on simulated devices instead ('hybridplan run --backend sim --plan PLAN ...': no GPU needed)"
        if stage.kind == "data+tensor":
            MemoryPredictor._check_zero_tensor(where, stage, base, instead)
            return
        if stage.kind != "data":
            raise ProfileError(f"{where}: ZeRO-{stage.zero} of a {stage.kind} stage is not yet predicted from a profile",
                               fix=instead)
        if base.zero_layout is None:
            raise ProfileError(f"{where}: the profile does not record the parameter shapes ZeRO shards",
                               fix="run the same 'hybridplan profile' command on the database again: it resumes and"
                               " records them")
        if stage.zero == 2 and base.zero_layout.precision != "fp32":
            raise ProfileError(f"{where}: ZeRO-2 is not predicted from a {base.zero_layout.precision} profile: its rules"
                               " count the gathered parameters at the recorded fp32 sizes, and FSDP's mixed precision"
                               " gathers low-precision copies, which no profile measured", fix=instead)
        if stage.zero in (2, 3) and not base.profiled_degrees("data-zero3"):
            raise ProfileError(f"{where}: the profile has no ZeRO-3 scenario (ZeRO-{stage.zero} is predicted from it)",
                               fix="profile again with --zero (adds the data<d>-zero3 scenarios), or " + instead)
        zero3 = base.profiled_degrees("data-zero3")
        if stage.zero == 3 and zero3 and stage.degree > zero3[-1]:
            raise ProfileError(
                f"{where}: ZeRO-3 over {stage.degree} devices is above the profiled ZeRO-3 degrees {zero3}, and a ZeRO-3"
                " stage's parameter and gradient shards and gathering buffers change with its degree, so it is neither"
                " composed from a narrower stage ([Note: a data stage wider than the profiled ones]) nor fitted",
                fix="use ZeRO-1 or no ZeRO for a stage this wide (composed from the profile), or " + instead)
        if stage.zero == 2 and not {("data-zero3", stage.degree), ("data", stage.degree)} <= set(base.stats):
            raise ProfileError(f"{where}: ZeRO-2 is predicted from the data{stage.degree} and data{stage.degree}-zero3"
                               " scenarios, and the profile lacks one (no fit across degrees for ZeRO-2)",
                               fix=f"profile with --zero on a mesh with {stage.degree} devices per node, or " + instead)

    @staticmethod
    def _check_zero_tensor(where: str, stage: StagePlan, base: MemoryPredictor, instead: str) -> None:
        """Refuse a ZeRO data x tensor stage the profile cannot predict ([Note: ZeRO-1 of a data x tensor stage])."""
        t = stage.tensor_degree
        if stage.zero >= 2:
            raise ProfileError(f"{where}: ZeRO-{stage.zero} of a data x tensor stage is not predicted from a profile: FSDP"
                               f" gathers each layer's tensor shards there, which neither the tensor{t} scenario (no FSDP)"
                               " nor a data<d>-zero3 scenario (whole layers gathered) measures", fix=instead)
        if base.zero_layout is None or (base._tensor_shards(t) is None and t in base.profiled_degrees("tensor")):
            raise ProfileError(f"{where}: the profile does not record the tensor x{t} parameter shards ZeRO-1 shards",
                               fix="run the same 'hybridplan profile' command on the database again: it resumes and"
                               " records them")

    def _why_missing(self, start: int, stop: int, kind: str, degree: int) -> str:
        key = self._scenario(kind, degree)
        name = "pipeline" if key[0] == "none" else f"{key[0].split('-')[0]}{key[1]}" + (
            f"-{key[0].split('-')[1]}" if "-" in key[0] else "")
        sizes = self.stats.get(key)
        if not sizes:
            profiled = self.profiled_degrees(kind)
            if degree > 1 and degree > max(profiled, default=0) and len(profiled) < 2:
                return f"the profile has no {name} statistics, nor {kind} statistics at two degrees to fit it from"
            return f"the profile has no {name} statistics"
        if len(sizes) < 2:
            return f"{name} was profiled at one batch size only"
        if self._stash.sign and self._stash.apply(np.zeros(len(QUANTITIES)), start, stop, kind, degree) is None:
            return (f"the profile was taken under {self.profile_schedule!r} and has no weight-stash sizes for these"
                    f" layers to predict {self.schedule!r} (run 'hybridplan profile' again on the database: it resumes"
                    " and records them)")
        for s in sizes:
            if s.bounds is not None and (start not in s.bounds or stop not in s.bounds):
                return f"{name} was profiled on merged layers starting at {s.bounds[:-1]}; this stage does not align with them"
            if _span_in_units(s, start, stop) is None:
                missing = [l for l in range(start, stop) if np.isnan(s.mi[l]).any() and l == start] + [
                    l for l in range(start + 1, stop) if np.isnan(s.ma[l]).any()
                ]
                return f"{name} statistics at batch {s.batch_size} lack layer(s) {missing or list(range(start, stop))}"
        return "unknown"


class UnitView:
    """A :class:`MemoryPredictor` on merged layers: unit ``i`` is original layers ``[bounds[i], bounds[i+1])``.

    Implements the search's stage-memory protocol in unit indices; :meth:`to_original` maps a plan
    found on units back to the model's layers.
    """

    def __init__(self, predictor: MemoryPredictor, bounds: list[int]) -> None:
        self.predictor = predictor
        self.bounds = list(bounds)
        self.position_horizon = predictor.position_horizon

    @property
    def num_layers(self) -> int:
        return len(self.bounds) - 1

    def stage_memory(self, start: int, stop: int, kind: str, degree: int, stages_after: int, *,
                     tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> float:
        return self.predictor.stage_memory(self.bounds[start], self.bounds[stop], kind, degree, stages_after,
                                           tensor_degree=tensor_degree, zero=zero, recompute=recompute)

    def allowed(self, start: int, stop: int, kind: str, degree: int, *, tensor_degree: int = 0, zero: int = 0,
                recompute: bool = False) -> bool:
        return self.predictor.allowed(self.bounds[start], self.bounds[stop], kind, degree, tensor_degree=tensor_degree,
                                      zero=zero, recompute=recompute)

    def stage_memory_matrix(self, kind: str, degree: int, stages_after: int, num_layers: int, *,
                            tensor_degree: int = 0, zero: int = 0, recompute: bool = False) -> np.ndarray:
        full = self.predictor.stage_memory_matrix(kind, degree, stages_after, self.predictor.num_layers,
                                                  tensor_degree=tensor_degree, zero=zero, recompute=recompute)
        b = np.array(self.bounds)
        return full[np.ix_(b[:-1], b)]

    def to_original(self, plan: Plan) -> Plan:
        """``plan`` with unit indices turned into the model's layer indices."""
        stages = tuple(replace(s, start=self.bounds[s.start], stop=self.bounds[s.stop]) for s in plan.stages)
        return Plan(plan.schedule, plan.global_batch_size, plan.num_microbatches, stages, plan.extra)
