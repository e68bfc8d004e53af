"""What ``hybridplan report`` renders, read from the files the other commands and the benchmarks write.

One typed view per kind of input, each with one JSON form:

- :class:`MemoryView`: per-device predicted and/or measured peaks of ONE plan. From a validation
  (``hybridplan validate --out``), a run result (``hybridplan run --out``: measured only), or a plan and a
  profile (prediction only, :meth:`MemoryView.from_prediction`).
- :class:`ParetoView`: plans as (peak memory, seconds per iteration) points, the frontier marked. The JSON
  form (written by :func:`pareto_document`; ``plan`` and ``label`` optional; extra keys ignored)::

      {"format": "hybridplan.pareto", "version": 1, "title": "gpt3-1.3b on 4x4",
       "points": [{"peak_memory_bytes": 1.2e10, "iteration_s": 0.53, "label": "pp4 dp4 mbs2",
                   "frontier": true, "plan": {...}}, ...],
       "marks": [{"peak_memory_bytes": 9.0e9, "iteration_s": 0.71, "label": "memory-optimal"}]}

  Also read: what ``hybridplan plan --objective pareto --out`` writes (``{"objective": "pareto", "model",
  "cluster", "frontier": [{"label", "predicted_peak_bytes", "predicted_iteration_s", "plan"}, ...]}``), a bare
  list of points, or ``{"candidates": [...]}``; a point's memory is ``peak_memory_bytes`` or
  ``predicted_peak_bytes``, its time ``iteration_s``, ``predicted_iteration_s`` or ``predicted.total_s``; the
  frontier is then recomputed.
- :class:`ComparisonView`: several plans' per-device peaks side by side (``"hybridplan.memory_comparison"``),
  :class:`ErrorView`: predicted against measured peaks of many plans (``"hybridplan.prediction_errors"``),
  :class:`SweepView`: every plan of a space with its peaks and the picks of partitioners
  (``"hybridplan.plan_sweep"``), :class:`ScalingView`: largest trainable model searches
  (``"hybridplan.scaling"``). Their forms are documented on each class; the benchmarks write them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridplan.errors import UsageError
from hybridplan.workflows.validate import DeviceMemory

__all__ = [
    "MemoryView", "ParetoPoint", "ParetoView", "PlanPeaks", "ComparisonGroup", "ComparisonView", "ErrorView",
    "SweepView", "ScalingPoint", "ScalingView", "View", "load_view", "pareto_document", "relative_errors",
]


@dataclass(frozen=True)
class MemoryView:
    """Per-device peaks of one plan."""

    title: str
    devices: tuple[DeviceMemory, ...]
    capacity_bytes: int | None = None
    status: str | None = None
    """The run's status ("ok", "oom", "failed"); None for a prediction."""

    @classmethod
    def from_validation(cls, data: Mapping[str, Any], title: str = "validation") -> MemoryView:
        """From ``hybridplan validate --out`` (``ValidationReport.to_dict``)."""
        devices = tuple(DeviceMemory(int(d["device"]), int(d["stage"]), _int(d.get("predicted")), _int(d.get("measured")))
                        for d in data["devices"])
        return cls(title, devices, status=data.get("status"))

    @classmethod
    def from_run(cls, data: Mapping[str, Any], title: str = "run") -> MemoryView:
        """From ``hybridplan run --out`` (``RunResult.to_dict``): measured peaks only."""
        devices = tuple(DeviceMemory(int(d["device"]), int(d["stage"]), None, _int(d.get("peak_memory_bytes")))
                        for d in sorted(data["devices"], key=lambda d: d["device"]))
        return cls(title, devices, status=data.get("status"))

    @classmethod
    def from_prediction(cls, prediction: Any, title: str = "prediction", capacity_bytes: int | None = None) -> MemoryView:
        """From a :class:`~hybridplan.predict.prediction.PlanPrediction`: predicted peaks only."""
        devices = tuple(DeviceMemory(d.device, d.stage, int(d.peak_memory_bytes), None) for d in prediction.devices)
        return cls(title, devices, capacity_bytes=capacity_bytes)

    def peak(self, which: str) -> int | None:
        """The largest "predicted" or "measured" device peak."""
        values = [getattr(d, which) for d in self.devices if getattr(d, which) is not None]
        return max(values) if values else None


@dataclass(frozen=True)
class ParetoPoint:
    """A plan as (peak memory, iteration time)."""

    peak_memory_bytes: float
    iteration_s: float
    label: str = ""
    frontier: bool = True
    plan: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ParetoView:
    """Plans by memory and time; ``marks`` are named plans drawn on top (e.g. the memory-optimal one)."""

    title: str
    points: tuple[ParetoPoint, ...]
    marks: tuple[ParetoPoint, ...] = ()

    @property
    def frontier(self) -> list[ParetoPoint]:
        """The frontier points, by increasing memory."""
        return sorted((p for p in self.points if p.frontier), key=lambda p: (p.peak_memory_bytes, p.iteration_s))


@dataclass(frozen=True)
class PlanPeaks:
    """One named plan of a comparison: its per-device peaks."""

    name: str
    devices: tuple[DeviceMemory, ...]
    plan: Mapping[str, Any] | None = None
    note: str = ""

    def peak(self, which: str) -> int | None:
        """The largest "predicted" or "measured" device peak."""
        values = [getattr(d, which) for d in self.devices if getattr(d, which) is not None]
        return max(values) if values else None


@dataclass(frozen=True)
class ComparisonGroup:
    """Plans of one scenario; the first is "ours"."""

    title: str
    plans: tuple[PlanPeaks, ...]
    capacity_bytes: int | None = None


@dataclass(frozen=True)
class ComparisonView:
    """Groups of plans compared by per-device peak (the first plan of a group is "ours").

    JSON: ``{"format": "hybridplan.memory_comparison", "title": ..., "groups": [{"title": ..., "capacity_bytes":
    int | null, "plans": [{"name": ..., "note": ..., "plan": {...}, "devices": [{"device", "stage", "predicted",
    "measured"}, ...]}, ...]}, ...]}``.
    """

    title: str
    groups: tuple[ComparisonGroup, ...]


@dataclass(frozen=True)
class ErrorView:
    """Predicted against measured per-device peaks of many plans.

    JSON: ``{"format": "hybridplan.prediction_errors", "title": ..., "thresholds": [0.02, 0.05, 0.11],
    "plans": [{"plan": {...}, "devices": [{"device", "stage", "predicted", "measured"}, ...]}, ...]}``.
    """

    title: str
    plans: tuple[tuple[DeviceMemory, ...], ...]
    thresholds: tuple[float, ...] = (0.02, 0.05, 0.11)

    def device_errors(self) -> list[float]:
        """Relative error of every device of every plan."""
        return [d.error for plan in self.plans for d in plan if d.error is not None]

    def plan_errors(self) -> list[float]:
        """Relative error of every plan's peak (highest predicted device against highest measured)."""
        return relative_errors([(max(d.predicted for d in p if d.predicted is not None),
                                 max(d.measured for d in p if d.measured is not None)) for p in self.plans])


@dataclass(frozen=True)
class SweepView:
    """Every plan of a space, predicted and measured, and which one each partitioner picks.

    JSON: ``{"format": "hybridplan.plan_sweep", "title": ..., "plans": [{"label": ..., "predicted_peak_bytes": int |
    null, "measured_peak_bytes": int | null, "plan": {...}}, ...], "picks": {"ours": index, "torchgpipe-time": index}}``.
    Plans with a null measurement (a failed run) are ranked after all measured ones; a null prediction is a
    plan the profile cannot predict.
    """

    title: str
    labels: tuple[str, ...]
    predicted: tuple[float | None, ...]
    measured: tuple[float | None, ...]
    picks: Mapping[str, int] = field(default_factory=dict)

    def rank(self, index: int) -> int:
        """1-based rank of plan ``index`` by measured peak (ties share the better rank)."""
        value = self.measured[index]
        if value is None:
            return len(self.measured)
        return 1 + sum(1 for m in self.measured if m is not None and m < value)

    def best_measured(self) -> float:
        """The lowest measured peak."""
        return min(m for m in self.measured if m is not None)


@dataclass(frozen=True)
class ScalingPoint:
    """One probe of a largest-model search."""

    width: int
    parameters: int
    peak_memory_bytes: int | None
    fits: bool


@dataclass(frozen=True)
class ScalingView:
    """Largest-trainable-model searches, one series per partitioner.

    JSON: ``{"format": "hybridplan.scaling", "title": ..., "capacity_bytes": int, "width_name": "channels",
    "series": [{"name": "ours", "points": [{"width", "parameters", "peak_memory_bytes", "fits"}, ...]}, ...]}``.
    """

    title: str
    capacity_bytes: int | None
    series: tuple[tuple[str, tuple[ScalingPoint, ...]], ...]
    width_name: str = "width"

    def largest(self, name: str) -> ScalingPoint | None:
        """The largest fitting probe of series ``name``."""
        points = [p for n, ps in self.series if n == name for p in ps if p.fits]
        return max(points, key=lambda p: p.parameters) if points else None


View = MemoryView | ParetoView | ComparisonView | ErrorView | SweepView | ScalingView


def relative_errors(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """(predicted - measured) / measured of each pair with a non-zero measurement.

    >>> relative_errors([(110, 100), (90, 100)])
    [0.1, -0.1]
    """
    return [(p - m) / m for p, m in pairs if m]


def pareto_document(points: Sequence[ParetoPoint], *, title: str, marks: Sequence[ParetoPoint] = ()) -> dict[str, Any]:
    """The ``hybridplan.pareto`` JSON form (module docstring) of ``points`` and ``marks``."""
    def one(p: ParetoPoint) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_memory_bytes": p.peak_memory_bytes, "iteration_s": p.iteration_s, "label": p.label,
                               "frontier": p.frontier}
        if p.plan is not None:
            out["plan"] = dict(p.plan)
        return out
    return {"format": "hybridplan.pareto", "version": 1, "title": title,
            "points": [one(p) for p in points], "marks": [one(m) for m in marks]}


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _devices(items: Sequence[Mapping[str, Any]]) -> tuple[DeviceMemory, ...]:
    return tuple(DeviceMemory(int(d["device"]), int(d.get("stage", 0)), _int(d.get("predicted")), _int(d.get("measured")))
                 for d in items)


def _point(data: Mapping[str, Any], frontier: bool = True) -> ParetoPoint:
    time = data.get("iteration_s", data.get("predicted_iteration_s"))
    if time is None and isinstance(data.get("predicted"), Mapping):
        time = data["predicted"].get("total_s")
    memory = data.get("peak_memory_bytes", data.get("predicted_peak_bytes"))
    if memory is None or time is None:
        raise UsageError("a Pareto point needs its peak memory and iteration time",
                         fix=f"got keys {sorted(data)}; write points as hybridplan.report.data documents")
    return ParetoPoint(float(memory), float(time), str(data.get("label", "")), bool(data.get("frontier", frontier)),
                       data.get("plan"))


def _pareto(data: Any, title: str) -> ParetoView:
    from hybridplan.search.time.throughput import pareto_frontier

    if isinstance(data, Mapping) and data.get("format") == "hybridplan.pareto":
        return ParetoView(str(data.get("title", title)), tuple(_point(p) for p in data["points"]),
                          tuple(_point(m) for m in data.get("marks", [])))
    if isinstance(data, Mapping) and "frontier" in data:  # hybridplan plan --objective pareto --out
        title = " ".join(str(data[k]) for k in ("model", "cluster") if data.get(k)) or title
    items = data if isinstance(data, list) else data.get("candidates", data.get("frontier"))
    points = [_point(p) for p in items]
    keep = set(pareto_frontier([(p.peak_memory_bytes, p.iteration_s) for p in points]))
    return ParetoView(title, tuple(ParetoPoint(p.peak_memory_bytes, p.iteration_s, p.label, i in keep, p.plan)
                                   for i, p in enumerate(points)))


def view_from_dict(data: Any, title: str) -> View:
    """The view a parsed JSON document holds (module docstring), detected from its keys.

    Raises:
        UsageError: if the document is none of the known kinds, or lacks a key its kind needs.
    """
    try:
        fmt = data.get("format") if isinstance(data, Mapping) else None
        if fmt == "hybridplan.memory_comparison":
            groups = tuple(ComparisonGroup(str(g["title"]), tuple(PlanPeaks(str(p["name"]), _devices(p["devices"]), p.get("plan"),
                                                                            str(p.get("note", ""))) for p in g["plans"]),
                                           _int(g.get("capacity_bytes"))) for g in data["groups"])
            return ComparisonView(str(data.get("title", title)), groups)
        if fmt == "hybridplan.prediction_errors":
            return ErrorView(str(data.get("title", title)), tuple(_devices(p["devices"]) for p in data["plans"]),
                             tuple(float(t) for t in data.get("thresholds", (0.02, 0.05, 0.11))))
        if fmt == "hybridplan.plan_sweep":
            plans = data["plans"]
            return SweepView(str(data.get("title", title)), tuple(str(p.get("label", i)) for i, p in enumerate(plans)),
                             tuple(None if p.get("predicted_peak_bytes") is None else float(p["predicted_peak_bytes"])
                                   for p in plans),
                             tuple(None if p.get("measured_peak_bytes") is None else float(p["measured_peak_bytes"])
                                   for p in plans),
                             {str(k): int(v) for k, v in data.get("picks", {}).items()})
        if fmt == "hybridplan.scaling":
            series = tuple((str(s["name"]), tuple(ScalingPoint(int(p["width"]), int(p["parameters"]),
                                                               _int(p.get("peak_memory_bytes")), bool(p["fits"]))
                                                  for p in s["points"])) for s in data["series"])
            return ScalingView(str(data.get("title", title)), _int(data.get("capacity_bytes")), series,
                               str(data.get("width_name", "width")))
        if fmt == "hybridplan.pareto" or isinstance(data, list) or (
                isinstance(data, Mapping) and ("candidates" in data or data.get("objective") == "pareto")):
            return _pareto(data, title)
        if isinstance(data, Mapping) and isinstance(data.get("devices"), list) and "plan" in data:
            if data["devices"] and "predicted" in data["devices"][0]:
                return MemoryView.from_validation(data, title)
            return MemoryView.from_run(data, title)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{title}: malformed {fmt or 'input'} document ({type(e).__name__}: {e})",
                         fix="regenerate the file with the command or benchmark that writes it") from None
    raise UsageError(
        f"{title}: not a file 'hybridplan report' knows",
        fix="give a validation (validate --out), a run result (run --out), a Pareto front, or a benchmark"
            " results file; or --plan with --db for a prediction",
    )


def load_view(path: str | Path) -> View:
    """Read ``path`` and return its view.

    Raises:
        UsageError: if the file cannot be read, is not JSON, or is no known kind.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {str(path)!r}: {e.strerror or e}", fix="check the path") from None
    except UnicodeDecodeError:
        raise UsageError(f"{str(path)!r} is not text", fix="give a JSON file written by hybridplan or a benchmark") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{str(path)!r} is not JSON: {e}", fix="give a file written by hybridplan or a benchmark") from None
    return view_from_dict(data, Path(path).stem)
