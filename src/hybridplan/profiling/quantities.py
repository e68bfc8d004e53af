"""What one profiled stage tells us: eight memory quantities that do not depend on where the stage sits.

[Note: why eight quantities instead of one peak] CAPTURE records one number per profiled stage, its
peak, and admits that it mispredicts 1F1B: under that schedule a stage's peak depends on its position
in the pipeline (the first of p stages keeps p micro-batches in flight, the last one). hybridplan
instead records how the stage's memory moves through its schedule, action by action (the runtime's
per-action timeline), and reduces it to quantities that are the same wherever the stage sits:

=============================  ================================================================
``static``                     live bytes when the iteration starts: parameters, optimizer state
``data``                       this device's share of the batch (first stage inputs, last stage targets)
``activation``                 bytes one micro-batch's forward keeps until its backward (saved
                               activations and the received input)
``gradient``                   gradient bytes, allocated by the first backward
``forward_transient``          peak above the level during a forward (temporaries)
``first_backward_transient``   peak above the level during the first backward
``backward_transient``         peak above the level during a later backward
``step_transient``             peak above the level during gradient sync and the optimizer step
=============================  ================================================================

The predictor replays any schedule's action list on these (profiling/schedule_memory.py), so one
profile predicts a stage at any position, under GPipe or 1F1B, for any number of micro-batches.
Measured on gpt-tiny (tests/profiling): every forward keeps the same bytes and every later backward
frees them, so the replay is exact for a stage whose quantities are exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridplan.errors import ProfileError

__all__ = ["QUANTITIES", "backward_after_backward", "quantities_from_report", "quantities_from_timeline"]

QUANTITIES: tuple[str, ...] = (
    "static",
    "data",
    "activation",
    "gradient",
    "forward_transient",
    "first_backward_transient",
    "backward_transient",
    "step_transient",
)
"""The quantities, in the order of every quantity vector (numpy arrays of length 8)."""

INDEX = {name: i for i, name in enumerate(QUANTITIES)}


@dataclass(frozen=True)
class _Entry:
    action: str
    before: int
    peak: int
    after: int


def quantities_from_timeline(static: int, data: int, timeline: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The quantity vector of one device from its iteration's start level and per-action timeline.

    Args:
        static: live bytes at the iteration start (before the batch).
        data: bytes of the device's share of the batch.
        timeline: ``[{"action": "F0", "before": ..., "peak": ..., "after": ...}, ..., {"action": "step", ...}]``.

    Raises:
        ProfileError: if the timeline lacks forwards, backwards or the step.
    """
    entries = [_Entry(e["action"], int(e["before"]), int(e["peak"]), int(e["after"])) for e in timeline]
    forwards = [e for e in entries if e.action.startswith("F")]
    backwards = [e for e in entries if e.action.startswith("B")]
    steps = [e for e in entries if e.action == "step"]
    if not forwards or not backwards or not steps:
        raise ProfileError(
            f"a timeline needs forward, backward and step entries, got {[e.action for e in entries]}",
            fix="profile with the runtime's timeline recording on (the default)",
        )
    activation = max(e.after - e.before for e in forwards)
    first, later = backwards[0], backwards[1:]
    q = np.zeros(len(QUANTITIES))
    q[INDEX["static"]] = static
    q[INDEX["data"]] = data
    q[INDEX["activation"]] = activation
    q[INDEX["gradient"]] = (first.after - first.before) + activation
    q[INDEX["forward_transient"]] = max(e.peak - e.before for e in forwards)
    q[INDEX["first_backward_transient"]] = first.peak - first.before
    q[INDEX["backward_transient"]] = max((e.peak - e.before for e in later), default=first.peak - first.before)
    q[INDEX["step_transient"]] = steps[-1].peak - steps[-1].before
    return q


def backward_after_backward(timeline: Sequence[Mapping[str, Any]]) -> int | None:
    """The largest transient of a later backward that directly follows another backward, or None where no later
    backward does (a last stage's F B F B ...).

    ``backward_transient`` is the largest over every later backward. Under ZeRO-3 one that follows a forward holds
    more (profiling/execution.py [Note: a ZeRO-3 stage's steady backward]): that is the span's own, and this one is
    what composes from layer to layer (profiling/statistics.py).

    >>> t = [{"action": a, "before": 0, "peak": p, "after": 0}
    ...      for a, p in (("F0", 5), ("F1", 5), ("B0", 9), ("F2", 5), ("B1", 8), ("B2", 6), ("step", 1))]
    >>> backward_after_backward(t), int(quantities_from_timeline(0, 0, t)[INDEX["backward_transient"]])
    (6, 8)
    >>> print(backward_after_backward(t[:2] + t[2:3] + t[4:5] + t[-1:]))  # F F B B: the later one follows a backward
    8
    """
    out = None
    for previous, entry in zip(timeline, timeline[1:]):
        if str(entry["action"]).startswith("B") and str(previous["action"]).startswith("B"):
            transient = int(entry["peak"]) - int(entry["before"])
            out = transient if out is None else max(out, transient)
    return out


def quantities_from_report(report: Mapping[str, Any]) -> np.ndarray:
    """The quantity vector of a device from a run result's device entry (runtime/result.py DeviceResult)."""
    static, data = report.get("static_memory_bytes"), report.get("data_bytes")
    if static is None or data is None or not report.get("timeline"):
        raise ProfileError("a device result without memory tracking cannot be profiled", fix="run with memory tracking on")
    return quantities_from_timeline(static, data, report["timeline"])
