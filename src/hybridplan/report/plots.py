"""PNG plots of the report views, with matplotlib's Agg renderer (no display, no pyplot global state).

matplotlib is an optional dependency (``pip install 'hybridplan[plot]'``): it is imported when a plot is
drawn, and its absence is a :class:`~hybridplan.errors.UsageError` naming the fix. Figures are built on
``matplotlib.figure.Figure`` directly, so drawing from a library or a test never opens a window and
never changes the backend of the caller's own pyplot session.
"""

from __future__ import annotations

from collections.abc import Sequence

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridplan.errors import UsageError
from hybridplan.report.data import ComparisonView, ErrorView, MemoryView, ParetoView, ScalingView, SweepView, View

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["render_plot", "plot_memory", "plot_pareto", "plot_comparison", "plot_errors", "plot_sweep", "plot_scaling"]

GIB = 2**30
_PREDICTED, _MEASURED, _OURS, _OTHER = "#8da0cb", "#fc8d62", "#1b9e77", "#7f7f7f"


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plots need matplotlib, which is not installed",
                         fix="pip install 'hybridplan[plot]' (or matplotlib), or pass --no-plot") from None
    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    if out.parent and not out.parent.exists():
        raise UsageError(f"cannot write {str(out)!r}: folder {str(out.parent)!r} does not exist", fix="create it first")
    fig.savefig(out, dpi=120, format="png")
    return out


class _Unit:
    """Bytes shown in GiB, or in MiB when every value is below 1 GiB (the tiny models)."""

    def __init__(self, values: Any) -> None:
        known = [v for v in values if v is not None and not math.isnan(v)]
        big = max(known, default=GIB) >= GIB
        self.size, self.name = (GIB, "GiB") if big else (2**20, "MiB")

    def __call__(self, value: float | None) -> float:
        return math.nan if value is None else value / self.size


CAPACITY_LINE_BELOW = 4.0
"""The capacity is drawn as a line only when it is at most this many times the highest value plotted;
further up it would squash the bars, so it is named in the legend's title instead."""


def _capacity(ax: Axes, capacity: int | None, highest: float, u: _Unit) -> None:
    if not capacity:
        return
    label = f"capacity {capacity / GIB:.3g} GiB"
    if not highest or u(capacity) <= CAPACITY_LINE_BELOW * highest:
        ax.axhline(u(capacity), color="black", linestyle="--", linewidth=1, label=label)
    else:
        ax.plot([], [], " ", label=f"{label} (off scale)")


def _highest(values: Sequence[float | None], u: _Unit) -> float:
    return max((u(v) for v in values if v is not None), default=0.0)


def _wrap(title: str, width: int = 70) -> str:
    """A title broken into lines that fit a single-axes figure (matplotlib clips a long one)."""
    return textwrap.fill(title, width)


def plot_memory(view: MemoryView, path: str | Path) -> Path:
    """Per-device bars: predicted beside measured peak (GiB), the capacity as a dashed line."""
    fig = _figure(max(6.0, 0.45 * len(view.devices) + 2), 4)
    ax = fig.add_subplot()
    values = [d.predicted for d in view.devices] + [d.measured for d in view.devices]
    u = _Unit(values)
    xs = list(range(len(view.devices)))
    has_pred = any(d.predicted is not None for d in view.devices)
    has_meas = any(d.measured is not None for d in view.devices)
    width = 0.4 if has_pred and has_meas else 0.8
    if has_pred:
        ax.bar([x - width / 2 if has_meas else x for x in xs], [u(d.predicted) for d in view.devices], width,
               color=_PREDICTED, label="predicted")
    if has_meas:
        ax.bar([x + width / 2 if has_pred else x for x in xs], [u(d.measured) for d in view.devices], width,
               color=_MEASURED, label="measured")
    _capacity(ax, view.capacity_bytes, _highest(values, u), u)
    ax.set_xticks(xs, [f"{d.device}\ns{d.stage}" for d in view.devices], fontsize=8)
    ax.set_xlabel("device (stage)")
    ax.set_ylabel(f"peak memory ({u.name})")
    ax.set_title(view.title + (f" [{view.status}]" if view.status and view.status != "ok" else ""))
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_pareto(view: ParetoView, path: str | Path) -> Path:
    """Every plan as a point (memory, time), the frontier as a step line, marked plans annotated."""
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot()
    u = _Unit([p.peak_memory_bytes for p in (*view.points, *view.marks)])
    others = [p for p in view.points if not p.frontier]
    if others:
        ax.scatter([u(p.peak_memory_bytes) for p in others], [p.iteration_s for p in others], s=10, color=_OTHER,
                   alpha=0.5, label="other plans")
    front = view.frontier
    ax.step([u(p.peak_memory_bytes) for p in front], [p.iteration_s for p in front], where="post", color=_PREDICTED)
    ax.scatter([u(p.peak_memory_bytes) for p in front], [p.iteration_s for p in front], s=24, color=_PREDICTED,
               label="Pareto frontier", zorder=3)
    for m in view.marks:
        ax.scatter([u(m.peak_memory_bytes)], [m.iteration_s], s=70, marker="*", zorder=4, label=m.label)
    ax.set_xlabel(f"peak memory per device ({u.name})")
    ax.set_ylabel("seconds per iteration")
    ax.set_title(_wrap(view.title), fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _comparison_axes(ax: Axes, title: str, plans: Any, capacity: int | None) -> None:
    values = [d.measured for p in plans for d in p.devices] + [p.peak("predicted") for p in plans]
    u = _Unit(values)
    for i, p in enumerate(plans):
        color = _OURS if i == 0 else _OTHER
        peak = p.peak("measured")
        ax.bar(i, u(peak), 0.6, color=color, alpha=0.35)
        ax.scatter([i] * len(p.devices), [u(d.measured) for d in p.devices], s=9, color=color, zorder=3)
        predicted = p.peak("predicted")
        if predicted is not None:
            ax.scatter([i], [u(predicted)], marker="_", s=200, color="black", zorder=4)
    _capacity(ax, capacity, _highest(values, u), u)
    if capacity:
        ax.legend(fontsize=6)
    ax.set_xticks(range(len(plans)), [p.name for p in plans], rotation=35, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(u.name, fontsize=8)


def plot_comparison(view: ComparisonView, path: str | Path) -> Path:
    """One panel per group: per plan, its device peaks (dots), measured plan peak (bar) and predicted peak (dash);
    the first plan (ours) in green."""
    n = len(view.groups)
    cols = min(4, n) or 1
    rows = max(1, math.ceil(n / cols))
    fig = _figure(3.6 * cols, 3.3 * rows)
    for k, group in enumerate(view.groups):
        _comparison_axes(fig.add_subplot(rows, cols, k + 1), group.title, group.plans, group.capacity_bytes)
    fig.suptitle(view.title + " (bar: measured peak; dots: devices; dash: predicted peak)", fontsize=10)
    return _save(fig, path)


def plot_errors(view: ErrorView, path: str | Path) -> Path:
    """Histograms of per-device and per-plan relative errors (percent, bins of 0.5 points over at least the widest
    threshold, log counts so that a few large errors stay visible), the thresholds as dotted lines."""
    from hybridplan.report.tables import share_within

    fig = _figure(10, 4)
    for k, (name, errors) in enumerate((("per device", view.device_errors()), ("per plan", view.plan_errors()))):
        ax = fig.add_subplot(1, 2, k + 1)
        values = [100 * e for e in errors]
        half_points = math.ceil(2 * (max([100 * t for t in view.thresholds] + [abs(v) for v in values]) + 1))
        edges = [0.5 * i - 0.25 for i in range(-half_points, half_points + 2)]  # bins centred on multiples of 0.5
        if values:
            ax.hist(values, bins=edges, color=_PREDICTED if k == 0 else _MEASURED, edgecolor="white", linewidth=0.3)
            ax.set_yscale("log")
        for t in view.thresholds:
            for sign in (-1, 1):
                ax.axvline(sign * 100 * t, color="black", linestyle=":", linewidth=0.8)
        shares = ", ".join(f"{100 * share_within(errors, t):.1f}% within {100 * t:g}%" for t in view.thresholds)
        ax.set_xlabel("(predicted - measured) / measured (%)")
        ax.set_ylabel("count (log scale)")
        ax.set_title(f"{name} ({len(values)}): {shares}", fontsize=8)
    fig.suptitle(view.title, fontsize=10)
    return _save(fig, path)


def plot_sweep(view: SweepView, path: str | Path) -> Path:
    """Left: every plan's measured peak, sorted, with the picks marked. Right: predicted against measured."""
    fig = _figure(11, 4.2)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    measured = [(m, i) for i, m in enumerate(view.measured) if m is not None]
    u = _Unit([m for m, _ in measured])
    order = sorted(measured)
    position = {i: r for r, (_, i) in enumerate(order)}
    left.plot(range(len(order)), [u(m) for m, _ in order], color=_OTHER, marker=".", markersize=3, linewidth=0.8)
    pairs = [(m, view.predicted[i]) for m, i in measured if view.predicted[i] is not None]
    right.scatter([u(m) for m, _ in pairs], [u(p) for _, p in pairs], s=10, color=_OTHER)
    values = [u(v) for pair in pairs for v in pair] or [0.0, 1.0]
    low, high = min(values), max(values)
    right.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--")
    for k, (name, index) in enumerate(view.picks.items()):
        m, predicted = view.measured[index], view.predicted[index]
        if m is None:
            continue
        # later picks smaller and on top, so that picks of the same plan stay visible
        marker, size = ("*", 160) if k == 0 else ("o", max(15, 110 - 18 * k))
        left.scatter([position[index]], [u(m)], s=size, marker=marker, zorder=3 + k, label=f"{name} (rank {view.rank(index)})")
        if predicted is not None:
            right.scatter([u(m)], [u(predicted)], s=size, marker=marker, zorder=3 + k, label=name)
    left.set_xlabel("plans by measured peak")
    left.set_ylabel(f"measured peak ({u.name})")
    left.legend(fontsize=7)
    right.set_xlabel(f"measured peak ({u.name})")
    right.set_ylabel(f"predicted peak ({u.name})")
    fig.suptitle(view.title, fontsize=10)
    return _save(fig, path)


def plot_scaling(view: ScalingView, path: str | Path) -> Path:
    """Peak memory against parameters for every probe of each series; probes that did not fit are crosses."""
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot()
    values = [p.peak_memory_bytes for _, ps in view.series for p in ps]
    u = _Unit(values + [view.capacity_bytes])
    for k, (name, series) in enumerate(view.series):
        points = sorted(series, key=lambda p: p.parameters)
        color = _OURS if k == 0 else _MEASURED
        ok = [p for p in points if p.fits and p.peak_memory_bytes is not None]
        ax.plot([p.parameters / 1e9 for p in ok], [u(p.peak_memory_bytes) for p in ok], marker="o", color=color, label=name)
        bad = [p for p in points if not p.fits]
        if bad:
            ax.scatter([p.parameters / 1e9 for p in bad], [u(p.peak_memory_bytes or view.capacity_bytes or 0) for p in bad],
                       marker="x", color=color, label=f"{name}: does not fit")
    _capacity(ax, view.capacity_bytes, _highest(values, u), u)
    ax.set_xlabel("trainable parameters (billions)")
    ax.set_ylabel(f"peak memory per device ({u.name})")
    ax.set_title(_wrap(view.title), fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def render_plot(view: View, path: str | Path) -> Path:
    """The plot of any view, written to ``path`` (PNG)."""
    if isinstance(view, MemoryView):
        return plot_memory(view, path)
    if isinstance(view, ParetoView):
        return plot_pareto(view, path)
    if isinstance(view, ComparisonView):
        return plot_comparison(view, path)
    if isinstance(view, ErrorView):
        return plot_errors(view, path)
    if isinstance(view, SweepView):
        return plot_sweep(view, path)
    return plot_scaling(view, path)
