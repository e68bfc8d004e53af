"""A plan as one picture: where its stages run, how full each device is, and when each stage works.

Three panels (``hybridplan show``, cli/show.py):

- the mesh: nodes as rows, a node's devices as columns, each device coloured by its stage and marked with its data
  replica and tensor rank; the legend names each stage's layers, data x tensor degree, ZeRO stage and recompute;
- the memory of every device (report/device_memory.py), a stacked bar per device with its total written on top,
  against each device's capacity; drawn only when a prediction or validation is given;
- the timeline of one iteration (report/timeline.py): a row per stage, a box per forward and backward of each
  micro-batch, numbered; the gaps are the pipeline's bubbles.

Drawn on a ``matplotlib.figure.Figure`` (report/plots.py: no pyplot, no window); :func:`draw_plan` returns it, so
that a test reads what a person would see (legend labels, bars, boxes) rather than pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hybridplan.plan import Cluster, Plan
from hybridplan.report.device_memory import SEGMENTS, PlanMemory
from hybridplan.report.plots import CAPACITY_LINE_BELOW, _figure, _save
from hybridplan.report.timeline import Timeline
from hybridplan.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw_plan", "write_png", "stage_label", "STAGE_COLOURS", "FORWARD", "BACKWARD"]

STAGE_COLOURS = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#b3b3b3",
                 "#1b9e77", "#d95f02", "#7570b3", "#e7298a")
"""A stage's colour (ColorBrewer Set2 then Dark2; repeated beyond twelve stages)."""
IDLE = "#f0f0f0"
FORWARD, BACKWARD, STEP = "#9ecae1", "#3182bd", "#bdbdbd"
"""Timeline boxes: forwards light, backwards dark (a backward takes about twice as long), sync and step grey."""
_SEGMENT_COLOURS = {"static": "#1b9e77", "gradient": "#66c2a5", "activation": "#fc8d62", "transient": "#e78ac3",
                    "peak": "#8da0cb", "measured": "#fc8d62", "reserved": "#d9d9d9", "outside": "#737373"}
_CELL_TEXT_UP_TO = 64
"""Devices beyond which the mesh's cells carry no text (it would not fit)."""
_BOX_TEXT_UP_TO = 24
"""Micro-batches beyond which the timeline's boxes carry no numbers."""


def stage_label(index: int, plan: Plan) -> str:
    """The legend's line for stage ``index``, e.g. ``stage 0: layers 0-11, data 2 x tensor 2, ZeRO-1, recompute``."""
    s = plan.stages[index]
    layers = f"layer {s.start}" if s.num_layers == 1 else f"layers {s.start}-{s.stop - 1}"
    parts = [f"stage {index}: {layers}", f"data {s.data_degree} x tensor {s.tensor_degree}"]
    if s.zero:
        parts.append(f"ZeRO-{s.zero}")
    if s.recompute != "none":
        parts.append("recompute")
    return ", ".join(parts)


def _colour(stage: int) -> str:
    return STAGE_COLOURS[stage % len(STAGE_COLOURS)]


def _mesh(ax: Axes, plan: Plan, cluster: Cluster) -> None:
    from matplotlib.patches import Patch, Rectangle

    rows, cols = cluster.num_nodes, cluster.devices_per_node
    where = {d: (i, k) for i, s in enumerate(plan.stages) for k, d in enumerate(s.devices)}
    text = cluster.num_devices <= _CELL_TEXT_UP_TO
    for d in range(cluster.num_devices):
        node, local = divmod(d, cols)
        stage, k = where.get(d, (None, 0))
        ax.add_patch(Rectangle((local + 0.05, node + 0.05), 0.9, 0.9, facecolor=IDLE if stage is None else _colour(stage),
                               edgecolor="black", linewidth=0.6, gid=f"device {d}"))
        if not text:
            continue
        if stage is None:
            role = "idle"
        else:
            t = plan.stages[stage].tensor_degree
            role = f"s{stage} d{k // t} t{k % t}"
        ax.text(local + 0.5, node + 0.5, f"{d}\n{role}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([c + 0.5 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"node {r}" for r in range(rows)], fontsize=7)
    ax.set_xlabel("device of the node (cell: device, stage, data replica, tensor rank)", fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{plan.num_stages} stage(s) on {cluster.num_nodes}x{cluster.devices_per_node}: {plan.schedule}, "
                 f"{plan.num_microbatches} micro-batches of {plan.microbatch_size}", fontsize=9)
    handles = [Patch(facecolor=_colour(i), edgecolor="black", label=stage_label(i, plan)) for i in range(plan.num_stages)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=7, frameon=False)


def _unit(largest: float) -> tuple[int, str]:
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return size, name
    return 1, "B"


def _capacities(known: list[int]) -> str:
    low, high = min(known), max(known)
    return format_bytes(high) if low == high else f"{format_bytes(low)} to {format_bytes(high)}"


def _memory(ax: Axes, memory: PlanMemory, cluster: Cluster) -> None:
    """Stacked bars; the capacity as a line, or named in the legend where it is off scale (report/plots.py's rule);
    on each bar its total and the share of its device's capacity it takes."""
    bars = memory.bars
    xs = list(range(len(bars)))
    capacities = [cluster.memory_of(b.device) for b in bars]
    known = [c for c in capacities if c is not None]
    size, name = _unit(max([b.total for b in bars] + [b.predicted or 0 for b in bars] + known + [1]))
    bottoms = [0.0] * len(bars)
    for key, label in SEGMENTS.items():
        heights = [sum(v for k, v in b.segments if k == key) / size for b in bars]
        if any(heights):
            ax.bar(xs, heights, 0.7, bottom=bottoms, color=_SEGMENT_COLOURS[key], label=label, gid=key)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    predicted = [(x, b.predicted / size) for x, b in zip(xs, bars) if b.predicted is not None]
    if predicted:
        ax.scatter([x for x, _ in predicted], [y for _, y in predicted], marker="_", s=300, color="black", zorder=4,
                   label="predicted tensor peak")
    highest = max([b.total for b in bars] + [b.predicted or 0 for b in bars])
    if known and max(known) > CAPACITY_LINE_BELOW * highest > 0:  # a line so far up would squash the bars
        ax.plot([], [], " ", label=f"capacity {_capacities(known)} (off scale)")
    elif known and len(set(known)) == 1 and len(known) == len(bars):
        ax.axhline(known[0] / size, color="black", linestyle="--", linewidth=1,
                   label=f"capacity {format_bytes(known[0])}", gid="capacity")
    elif known:
        segments = [(x, c) for x, c in zip(xs, capacities) if c is not None]
        ax.hlines([c / size for _, c in segments], [x - 0.45 for x, _ in segments], [x + 0.45 for x, _ in segments],
                  color="black", linestyle="--", linewidth=1, label="capacity", gid="capacity")
    if len(bars) <= 8:  # more labels than that overlap: the axis says the level
        for x, b, c in zip(xs, bars, capacities):
            share = "" if c is None else f"\n{100 * b.total / c:.0f}%"
            ax.text(x, b.total / size, format_bytes(b.total) + share, ha="center", va="bottom", fontsize=6, gid="total")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # room for the totals
    step = max(1, len(bars) // 32)
    ax.set_xticks(xs[::step], [f"{b.device}\ns{b.stage}" for b in bars][::step], fontsize=7)
    ax.set_xlabel("device (stage)", fontsize=8)
    ax.set_ylabel(f"memory ({name})", fontsize=8)
    ax.set_title(memory.title + ("" if known else " (no capacity: give --device-memory or --gpu)"), fontsize=9)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def _timeline(ax: Axes, timeline: Timeline) -> None:
    """Boxes in the timeline's unit (seconds: milliseconds below one second)."""
    ms = timeline.unit == "s" and timeline.length < 1
    scale = 1e3 if ms else 1.0
    length = (timeline.length or 1.0) * scale
    numbers = max((b.microbatch or 0 for b in timeline.boxes), default=0) < _BOX_TEXT_UP_TO
    colours = {"F": FORWARD, "B": BACKWARD, "step": STEP}
    for b in timeline.boxes:
        ax.barh(b.stage, b.duration * scale, left=b.start * scale, height=0.8, color=colours[b.kind], edgecolor="white", linewidth=0.5,
                gid=f"{b.kind}{'' if b.microbatch is None else b.microbatch}@{b.stage}")
        if numbers and b.microbatch is not None and b.duration * scale / length > 0.012:
            ax.text((b.start + b.duration / 2) * scale, b.stage, str(b.microbatch), ha="center", va="center", fontsize=6,
                    color="black" if b.kind == "F" else "white")
    from matplotlib.patches import Patch

    kinds = [("F", "forward"), ("B", "backward")] + ([("step", "sync + step")] if any(b.kind == "step" for b in
                                                                                       timeline.boxes) else [])
    ax.legend(handles=[Patch(facecolor=colours[k], label=label) for k, label in kinds], fontsize=7, loc="upper right",
              bbox_to_anchor=(1.0, -0.18), ncol=3, frameon=False)
    p = timeline.num_stages
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)], fontsize=7)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, length)
    unit = "milliseconds" if ms else "seconds" if timeline.unit == "s" else "unit times"
    ax.set_xlabel(unit, fontsize=8)
    idle = sum(timeline.bubble(s) for s in range(p)) / (p * (timeline.length or 1.0))
    shown = f"{length:.4g} {'ms' if ms else 's' if timeline.unit == 's' else 'units'}"
    ax.set_title(f"timeline of one iteration ({timeline.source}): {shown}, {100 * idle:.0f}% of stage time in "
                 f"bubbles (gaps); numbers: micro-batch", fontsize=9)


def draw_plan(plan: Plan, cluster: Cluster, timeline: Timeline, memory: PlanMemory | None = None) -> Figure:
    """The plan's picture (module docstring): the mesh, the memory bars when ``memory`` is given, the timeline.

    Raises:
        UsageError: if matplotlib is not installed.
    """
    rows = 2
    gantt = 1.2 + 0.35 * plan.num_stages
    mesh = max(2.6, 0.55 * cluster.num_nodes + 1.6 + 0.18 * plan.num_stages)
    fig = _figure(12.0, mesh + gantt + 1.2)
    grid = fig.add_gridspec(rows, 2, height_ratios=[mesh, gantt], width_ratios=[1, 1.3])
    if memory is None:
        _mesh(fig.add_subplot(grid[0, :]), plan, cluster)
    else:
        _mesh(fig.add_subplot(grid[0, 0]), plan, cluster)
        _memory(fig.add_subplot(grid[0, 1]), memory, cluster)
    _timeline(fig.add_subplot(grid[1, :]), timeline)
    return fig


def write_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` (its folder must exist)."""
    return _save(fig, path)
