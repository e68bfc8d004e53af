"""What each device of a plan holds at its peak, split as far as a prediction or validation file allows.

Three files hold per-device memory of a plan; each says a different amount, and a bar shows exactly that:

- ``hybridplan predict --json`` (``PlanPrediction.to_dict``): per device the tensor peak and the stage's eight
  quantities (profiling/quantities.py); on CUDA also the allocator's reserved peak and the memory outside the
  allocator. The peak is the largest of a few linear forms of the quantities, one per action of the schedule
  (profiling/schedule_memory.py ``peak_terms``); the form that gives the peak splits it into parameters and
  optimizer state (``static``; on CUDA it also holds the cuBLAS workspaces, [Note: workspaces are per device]),
  gradients, activations of the micro-batches in flight plus the batch, and the temporaries of the action at the
  peak. Where no form gives the file's peak (a ZeRO rank's peak, method "capture", no quantities) the tensor
  peak is one unsplit segment: a split is never made up.
- ``hybridplan estimate-memory --json``: per device the simulated tensor peak, reserved peak and outside bytes,
  for each estimated plan; the one equal to the plan is drawn.
- ``hybridplan validate --out``: per device the measured peak (and on CUDA the measured reserved peak), and the
  predicted peak, drawn as a mark beside the bar.

On CUDA a bar's top is what must fit the device: reserved peak + outside (predict/prediction.py [Note: predicting
a CUDA device]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridplan.errors import UsageError
from hybridplan.plan import Plan

__all__ = ["SEGMENTS", "MemoryBar", "PlanMemory", "plan_memory_from"]

SEGMENTS: dict[str, str] = {
    "static": "parameters + optimizer state",
    "gradient": "gradients",
    "activation": "activations in flight + batch",
    "transient": "temporaries of the peak's action",
    "peak": "tensor peak (the file does not split it)",
    "measured": "measured tensor peak",
    "reserved": "allocator cache (reserved above the peak)",
    "outside": "outside the allocator (CUDA context, libraries, NCCL)",
}
"""Each segment a bar may have, bottom to top, and its legend label."""


@dataclass(frozen=True)
class MemoryBar:
    """One device: its segments (bottom to top) and, from a validation, the predicted tensor peak."""

    device: int
    stage: int
    segments: tuple[tuple[str, int], ...]
    """(key of :data:`SEGMENTS`, bytes); they add up to :attr:`total`."""
    predicted: int | None = None
    peak_action: str | None = None
    """Where the tensor peak is split: the kind of action at the peak ("a forward", "the first backward", "a backward",
    "the step")."""

    @property
    def total(self) -> int:
        return sum(b for _, b in self.segments)


@dataclass(frozen=True)
class PlanMemory:
    """Every device's bar, and what the file said."""

    bars: tuple[MemoryBar, ...]
    title: str

    @property
    def split(self) -> bool:
        """Whether any bar's tensor peak is split."""
        return any(k == "static" for b in self.bars for k, _ in b.segments)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _peak_forms(schedule: str, stages_after: int, m: int) -> list[tuple[str, np.ndarray]]:
    """The peak forms of a stage ``stages_after`` from the end (profiling/schedule_memory.py ``peak_terms``), each
    with the kind of action it is the peak of (the transient it holds)."""
    from hybridplan.profiling.quantities import INDEX
    from hybridplan.profiling.schedule_memory import peak_terms

    kinds = {INDEX["forward_transient"]: "a forward", INDEX["first_backward_transient"]: "the first backward",
             INDEX["backward_transient"]: "a backward", INDEX["step_transient"]: "the step"}
    return [(next(k for i, k in kinds.items() if form[i]), form) for form in peak_terms(schedule, stages_after, m)]


def _split(peak: int, quantities: Mapping[str, Any], schedule: str, stages_after: int,
           m: int) -> tuple[list[tuple[str, int]], str] | None:
    """The peak's segments from the form of ``peak_terms`` that gives it, and the kind of action at the peak; None
    where no form gives the file's peak (module docstring)."""
    from hybridplan.profiling.quantities import INDEX, QUANTITIES

    if set(quantities) != set(QUANTITIES):
        return None
    q = np.array([float(quantities[k]) for k in QUANTITIES])
    action, form = max(_peak_forms(schedule, stages_after, m), key=lambda f: float(f[1] @ q))
    if abs(float(form @ q) - peak) > form.sum():  # more than the rounding of the quantities: not this peak
        return None
    share = form * q
    parts = [("static", share[INDEX["static"]]), ("gradient", share[INDEX["gradient"]]),
             ("activation", share[INDEX["activation"]] + share[INDEX["data"]])]
    if any(v < 0 for _, v in parts):
        return None
    segments = [(k, int(round(v))) for k, v in parts]
    transient = peak - sum(v for _, v in segments)  # the rest of the file's peak, to the byte
    if transient < 0:
        return None
    return segments + [("transient", transient)], action


def _on_top(segments: list[tuple[str, int]], held: int, reserved: int | None, outside: int | None) -> None:
    if reserved is not None and reserved > held:
        segments.append(("reserved", reserved - held))
    if outside:
        segments.append(("outside", outside))


def _check_devices(found: Sequence[tuple[int, int]], plan: Plan, name: str) -> None:
    """The file's (device, stage) pairs must be the plan's."""
    wanted = sorted((d, i) for i, s in enumerate(plan.stages) for d in s.devices)
    if sorted(found) != wanted:
        got = sorted(d for d, _ in found)
        raise UsageError(f"{name} does not match the plan: it has {len(got)} device(s) {_short(got)}, the plan"
                         f" {len(wanted)} {_short([d for d, _ in wanted])} (or their stages differ)",
                         fix="give the prediction or validation of this plan (predict/validate --plan PLAN)")


def _short(devices: Sequence[int]) -> str:
    return str(list(devices)) if len(devices) <= 8 else f"[{devices[0]}, ..., {devices[-1]}]"


def _from_prediction(data: Mapping[str, Any], plan: Plan, name: str) -> PlanMemory:
    devices = data["devices"]
    _check_devices([(int(d["device"]), int(d["stage"])) for d in devices], plan, name)
    bars = []
    for d in devices:
        peak, stage = int(d["peak_memory_bytes"]), int(d["stage"])
        split = _split(peak, d.get("quantities") or {}, plan.schedule, plan.num_stages - 1 - stage,
                       plan.num_microbatches)
        segments, action = (list(split[0]), split[1]) if split else ([("peak", peak)], None)
        _on_top(segments, peak, _int(d.get("reserved_peak_bytes")), _int(d.get("overhead_bytes")))
        bars.append(MemoryBar(int(d["device"]), stage, tuple(segments), peak_action=action))
    return PlanMemory(tuple(sorted(bars, key=lambda b: b.device)), f"{name}: predicted ({data.get('method', '?')})")


def _from_estimates(data: Mapping[str, Any], plan: Plan, name: str) -> PlanMemory:
    mine = [e for e in data["estimates"] if Plan.from_dict(e["plan"]) == plan]
    if not mine:
        raise UsageError(f"{name} holds {len(data['estimates'])} estimated plan(s), none of them the plan",
                         fix="estimate this plan: hybridplan estimate-memory --plan PLAN --json > FILE")
    devices = mine[0]["devices"]
    _check_devices([(int(d["device"]), int(d["stage"])) for d in devices], plan, name)
    bars = []
    for d in devices:
        peak = int(d["peak_memory_bytes"])
        segments = [("peak", peak)]
        _on_top(segments, peak, _int(d.get("reserved_peak_bytes")), _int(d.get("overhead_bytes")))
        bars.append(MemoryBar(int(d["device"]), int(d["stage"]), tuple(segments)))
    return PlanMemory(tuple(sorted(bars, key=lambda b: b.device)), f"{name}: estimated on simulated devices")


def _from_validation(data: Mapping[str, Any], plan: Plan, name: str) -> PlanMemory:
    if Plan.from_dict(data["plan"]) != plan:
        raise UsageError(f"{name} validates another plan than the one given",
                         fix="give the plan the validation ran (its 'plan' key), or validate this plan")
    devices = data["devices"]
    _check_devices([(int(d["device"]), int(d["stage"])) for d in devices], plan, name)
    bars = []
    for d in devices:
        measured = _int(d.get("measured"))
        segments = [] if measured is None else [("measured", measured)]
        if measured is not None:
            _on_top(segments, measured, _int(d.get("measured_reserved")), None)
        bars.append(MemoryBar(int(d["device"]), int(d["stage"]), tuple(segments), predicted=_int(d.get("predicted"))))
    status = data.get("status")
    return PlanMemory(tuple(sorted(bars, key=lambda b: b.device)),
                      f"{name}: measured" + (f" (run {status})" if status and status != "ok" else "")
                      + ", predicted as marks")


def plan_memory_from(data: Any, plan: Plan, name: str, *, validation: bool) -> PlanMemory:
    """The bars of ``plan`` from a parsed prediction (``validation=False``: ``predict --json`` or ``estimate-memory
    --json``) or validation (``validate --out``) document; ``name`` names the file in titles and errors.

    Raises:
        UsageError: if the document is not of the kind asked for, is malformed, or is of another plan.
    """
    from hybridplan.errors import PlanError

    kind = "validation" if validation else "prediction"
    fix = ("give the file 'hybridplan validate --out' wrote" if validation else
           "give what 'hybridplan predict --json' or 'hybridplan estimate-memory --json' printed")
    if not isinstance(data, Mapping):
        raise UsageError(f"{name} is not a {kind}: a JSON {type(data).__name__}, not an object", fix=fix)
    try:
        if validation:
            if "plan" in data and isinstance(data.get("devices"), list) and all("measured" in d for d in data["devices"]):
                return _from_validation(data, plan, name)
        elif isinstance(data.get("estimates"), list):
            return _from_estimates(data, plan, name)
        elif isinstance(data.get("devices"), list) and all("peak_memory_bytes" in d for d in data["devices"]):
            if "plan" in data:  # a run result (run --out): measured, not predicted
                raise UsageError(f"{name} is a run's result, not a prediction", fix=fix)
            return _from_prediction(data, plan, name)
    except (KeyError, TypeError, ValueError, PlanError) as e:
        raise UsageError(f"{name}: malformed {kind} ({type(e).__name__}: {e})", fix=fix) from None
    what = " (it is a plan)" if "stages" in data else ""
    raise UsageError(f"{name} is not a {kind}{what}", fix=fix)
