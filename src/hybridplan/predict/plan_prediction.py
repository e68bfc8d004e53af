"""A plan's per-device peaks from the predictor's stage predictions: each stage at its position, on the source
its kind names (a recompute profile, a ZeRO scenario, the tensor scenario at a data x tensor replica's batch),
its ZeRO ranks' shards, and on CUDA what the allocator reserves and what lies outside it.

:meth:`MemoryPredictor.predict <hybridplan.predict.memory.MemoryPredictor.predict>` calls
:func:`predict_plan`; the stage predictions themselves (steps 1 to 4 of predict/memory.py) stay there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hybridplan.errors import ProfileError
from hybridplan.plan import Plan
from hybridplan.plan.schedule import in_flight_count
from hybridplan.predict.batch_scaling import PEAK
from hybridplan.predict.plan_checks import check_measured_kinds, why_missing
from hybridplan.predict.prediction import DevicePrediction, PlanPrediction
from hybridplan.predict.reserved import reserved_peak_from
from hybridplan.predict.composed_zero import composed_zero3_quantities
from hybridplan.predict.zero_stage import tensor_shards, zero_peaks, zero_ranks, zero_tensor_peaks
from hybridplan.profiling.quantities import QUANTITIES

if TYPE_CHECKING:
    from hybridplan.predict.memory import MemoryPredictor

__all__ = ["predict_plan"]


def predict_plan(predictor: MemoryPredictor, plan: Plan) -> PlanPrediction:
    """Per-device predicted peaks of ``plan`` (:meth:`MemoryPredictor.predict
    <hybridplan.predict.memory.MemoryPredictor.predict>`, which documents the errors)."""
    plan.validate(num_layers=predictor.num_layers)
    if (plan.schedule, plan.global_batch_size, plan.num_microbatches) != (
        predictor.schedule,
        predictor.global_batch_size,
        predictor.num_microbatches,
    ):
        return predictor.retargeted(schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                    num_microbatches=plan.num_microbatches).predict(plan)
    check_measured_kinds(predictor, plan)
    devices = []
    outside_of = predictor.outside_bytes_by_device(plan)
    for i, stage in enumerate(plan.stages):
        after = plan.num_stages - 1 - i
        # [Note: a data x tensor stage is a tensor stage at a smaller batch] Each of the d replicas of a
        # "data+tensor" stage runs exactly what a t-way tensor stage runs with micro-batches of b/d samples:
        # the same layer shards and optimizer state, activations and received buffers of b/d rows, the
        # same schedule position; its gradient all-reduce leaves no buffer behind. So it is the tensor
        # stage predicted at the global batch B/d (same micro-batch count).
        base = predictor.recomputed if stage.recompute == "full" and not predictor.recompute else predictor
        if base is None:  # check_measured_kinds refuses this first; kept for a caller that skipped it
            raise ProfileError(f"stage {i} ({stage.describe()}) recomputes, but no recompute profile was given",
                               fix="pass --recompute-db, a profile taken with --activation-checkpointing")
        source, degree = base, stage.degree
        kind: str = stage.kind
        if stage.zero:  # [Note: predicting ZeRO from a profile] (predict/zero_layout.py); refused by now if unpredictable
            kind = base._zero_source(kind, stage.zero) or kind
        if kind == "data+tensor":
            replica = base._replica(stage.degree, stage.tensor_degree)
            if replica is not None:
                source, kind, degree = replica, "tensor", stage.tensor_degree
        value = source.stage_memory(stage.start, stage.stop, kind, degree, after)
        if not math.isfinite(value):
            raise ProfileError(
                f"stage {i} ({stage.describe()}) cannot be predicted: {why_missing(source, stage.start, stage.stop, kind, degree)}",
                fix="profile the missing scenario (hybridplan profile ... --scenarios), or change the plan",
            )
        q = source.span_quantities(stage.start, stage.stop, kind, degree)
        composed = stage.kind == "data+tensor" and stage.zero >= 2  # [Note: ZeRO-3 composed from an unsharded stage]
        shards = tensor_shards(base, stage.tensor_degree) if composed else None
        if q is not None and shards is not None:
            q = composed_zero3_quantities(source, stage.start, stage.stop, kind, degree, shards, stage.data_degree)
        breakdown = {} if q is None else {name: int(round(v)) for name, v in zip(QUANTITIES, q[:PEAK])}
        flight = in_flight_count(plan.schedule, plan.num_stages, i, plan.num_microbatches)
        peaks = None
        if stage.zero:
            peaks = (zero_tensor_peaks(base, stage.start, stage.stop, stage.zero, stage.degree, stage.tensor_degree,
                                       after) if stage.kind == "data+tensor"
                     else zero_peaks(base, stage.start, stage.stop, stage.kind, stage.zero, degree, after))
        layout, world, rank_of = zero_ranks(base, stage)
        wider = base._wider_data("data-zero3", stage.degree) if stage.zero == 3 and stage.kind == "data" else None
        if stage.zero and stage.kind == "data" and peaks is None:  # ZeRO-2 needs the quantities ("capture" keeps only peaks)
            raise ProfileError(f"stage {i} ({stage.describe()}) cannot be predicted: ZeRO-{stage.zero} needs the"
                               f" data{degree} and data{degree}-zero3 scenarios' quantities",
                               fix="predict with the default method (quantities), or profile with --zero")
        excess = None if outside_of is None or source.reserved is None else source.reserved.excess(
            stage.start, stage.stop, kind, degree, source.microbatch_size)  # the stage's, every device alike
        ranks: dict[int, tuple[dict[str, int], int, int | None]] = {}  # a rank's devices (its tensor ranks) alike
        for d in stage.devices:
            r = rank_of(d) if peaks is not None and layout is not None else -1
            if r not in ranks:
                mine, peak = breakdown, value
                if r >= 0 and peaks is not None and layout is not None:
                    peak = peaks[r]
                    if breakdown:
                        static, step = layout.shift(stage.start, stage.stop, stage.zero, world, r)
                        gradient = 0
                        if composed:  # the unsharded stage's static, gradient and step, moved to the rank's chunks
                            static, gradient, step = layout.unsharded_shift(stage.start, stage.stop, world, r)
                        elif wider is not None:  # [Note: a ZeRO-3 stage wider than the profiled ones] (zero_stage.py)
                            static, step, gradient = layout.wider_zero3_shift(stage.start, stage.stop, wider[1], world, r)
                        mine = {**breakdown, "static": breakdown["static"] + static,
                                "gradient": breakdown["gradient"] + gradient,
                                "step_transient": breakdown["step_transient"] + step}
                rounded = int(round(peak))
                ranks[r] = mine, rounded, None if excess is None else reserved_peak_from(rounded, excess)
            mine, rounded, reserved = ranks[r]
            outside = None if outside_of is None else outside_of[d]
            held = rounded if reserved is None else reserved  # what the allocator holds, at least
            devices.append(DevicePrediction(d, i, rounded, flight, mine, overhead_bytes=outside,
                                            reserved_peak_bytes=reserved,
                                            total_bytes=None if outside is None else held + outside))
    devices.sort(key=lambda d: d.device)
    return PlanPrediction(devices, predictor.method)

