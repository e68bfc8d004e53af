"""Terminal tables of the report views: the same numbers as the plots, exactly as read (bytes shown as GiB
or MiB by :func:`~hybridplan.units.format_bytes`, errors in percent)."""

from __future__ import annotations

from collections.abc import Sequence

from hybridplan.report.data import (
    ComparisonView,
    ErrorView,
    MemoryView,
    ParetoView,
    ScalingView,
    SweepView,
    View,
)
from hybridplan.units import format_bytes

__all__ = ["render_table", "memory_table", "pareto_table", "comparison_table", "error_table", "sweep_table",
           "scaling_table", "share_within", "md_cell"]


def _pct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.2f}%" if signed else f"{100 * value:.2f}%"


def share_within(errors: Sequence[float], threshold: float) -> float:
    """Fraction of ``errors`` whose magnitude is at most ``threshold``.

    >>> share_within([0.01, -0.03, 0.2], 0.05)
    0.6666666666666666
    """
    return sum(abs(e) <= threshold for e in errors) / len(errors) if errors else 0.0


def md_cell(text: str) -> str:
    r"""``text`` made safe inside a Markdown table cell: its ``|`` (the stage separator of a plan label,
    :func:`~hybridplan.report.pareto.plan_label`) escaped, so that it does not end the cell.

    >>> md_cell("[0,3) data2 | [3,8) none1")
    '[0,3) data2 \\| [3,8) none1'
    """
    return text.replace("|", "\\|")


def memory_table(view: MemoryView) -> str:
    """Device, stage, predicted, measured, error; then the plan peaks."""
    lines = [view.title + (f" (run: {view.status})" if view.status else "")]
    lines.append(f"{'device':>6} {'stage':>5} {'predicted':>12} {'measured':>12} {'error':>8}")
    for d in view.devices:
        lines.append(f"{d.device:>6} {d.stage:>5} {format_bytes(d.predicted):>12} {format_bytes(d.measured):>12} {_pct(d.error):>8}")
    predicted, measured = view.peak("predicted"), view.peak("measured")
    tail = f"plan peak: predicted {format_bytes(predicted)}, measured {format_bytes(measured)}"
    if predicted is not None and measured:
        tail += f", error {_pct((predicted - measured) / measured)}"
    if view.capacity_bytes:
        tail += f"; capacity {format_bytes(view.capacity_bytes)}"
    lines.append(tail)
    return "\n".join(lines)


def pareto_table(view: ParetoView) -> str:
    """The frontier by increasing memory, then the marked plans."""
    lines = [view.title, f"{'':>3} {'peak memory':>12} {'s / iteration':>14}  plan"]
    for i, p in enumerate(view.frontier):
        lines.append(f"{i + 1:>3} {format_bytes(p.peak_memory_bytes):>12} {p.iteration_s:>14.4f}  {p.label}")
    for m in view.marks:
        lines.append(f"{'*':>3} {format_bytes(m.peak_memory_bytes):>12} {m.iteration_s:>14.4f}  {m.label}")
    lines.append(f"{len(view.frontier)} frontier plans of {len(view.points)}" + ("; * marked plans" if view.marks else ""))
    return "\n".join(lines)


def comparison_table(view: ComparisonView) -> str:
    """Per group: each plan's measured and predicted peak, how much lower the first plan's measured peak is, and
    whether the measured peak fits the group's device capacity."""
    lines = [view.title, f"{'scenario':<30} {'plan':<22} {'measured peak':>13} {'predicted':>11} {'ours lower by':>13}"
                         f" {'fits':>5}"]
    for group in view.groups:
        ours = group.plans[0].peak("measured") if group.plans else None
        for i, p in enumerate(group.plans):
            measured = p.peak("measured")
            gain = None if i == 0 or ours is None or not measured else 1 - ours / measured
            fits = "-" if not group.capacity_bytes or measured is None else ("yes" if measured <= group.capacity_bytes else "no")
            lines.append(f"{group.title if i == 0 else '':<30} {p.name:<22} {format_bytes(measured):>13}"
                         f" {format_bytes(p.peak('predicted')):>11} {_pct(gain, signed=False) if i else '':>13} {fits:>5}")
    return "\n".join(lines)


def error_table(view: ErrorView) -> str:
    """Share of per-device and per-plan errors within each threshold, and the largest."""
    device, plan = view.device_errors(), view.plan_errors()
    head = f"{'':<10} {'count':>6}" + "".join(f" {'<=' + format(100 * t, 'g') + '%':>8}" for t in view.thresholds) + f" {'max':>8}"
    lines = [view.title, head]
    for name, errors in (("per device", device), ("per plan", plan)):
        shares = "".join(f" {_pct(share_within(errors, t), signed=False):>8}" for t in view.thresholds)
        largest = max((abs(e) for e in errors), default=None)
        lines.append(f"{name:<10} {len(errors):>6}{shares} {_pct(largest, signed=False):>8}")
    return "\n".join(lines)


def sweep_table(view: SweepView) -> str:
    """Each pick's measured peak, rank among all plans, and ratio to the lowest measured peak."""
    best = view.best_measured()
    n = sum(m is not None for m in view.measured)
    width = max([len(view.labels[i]) for i in view.picks.values()] + [4])
    lines = [view.title, f"{n} plans measured; lowest measured peak {format_bytes(best)}",
             f"{'pick':<26} {'plan':<{width}} {'predicted':>11} {'measured':>11} {'rank':>6} {'x best':>7}"]
    for name, index in view.picks.items():
        m = view.measured[index]
        ratio = "-" if m is None else f"{m / best:.3f}"
        lines.append(f"{name:<26} {view.labels[index]:<{width}} {format_bytes(view.predicted[index]):>11}"
                     f" {format_bytes(m):>11} {view.rank(index):>6} {ratio:>7}")
    return "\n".join(lines)


def scaling_table(view: ScalingView) -> str:
    """Every probe per series, then each series' largest fitting model and its ratio to the last series'."""
    lines = [view.title + (f" (capacity {format_bytes(view.capacity_bytes)})" if view.capacity_bytes else ""),
             f"{'series':<18} {view.width_name:>9} {'parameters':>15} {'peak':>11} {'fits':>5}"]
    for name, points in view.series:
        for p in sorted(points, key=lambda p: p.width):
            lines.append(f"{name:<18} {p.width:>9} {p.parameters:>15,} {format_bytes(p.peak_memory_bytes):>11}"
                         f" {'yes' if p.fits else 'no':>5}")
    largest = {name: view.largest(name) for name, _ in view.series}
    for name, top in largest.items():
        lines.append(f"largest for {name}: " + ("none fits" if top is None else f"{view.width_name} {top.width}, {top.parameters:,} parameters"))
    names = [n for n, _ in view.series]
    first, last = (largest[names[0]], largest[names[-1]]) if len(names) >= 2 else (None, None)
    if first is not None and last is not None:
        lines.append(f"{names[0]} / {names[-1]}: {first.parameters / last.parameters:.2f}x parameters")
    return "\n".join(lines)


def render_table(view: View) -> str:
    """The table of any view."""
    if isinstance(view, MemoryView):
        return memory_table(view)
    if isinstance(view, ParetoView):
        return pareto_table(view)
    if isinstance(view, ComparisonView):
        return comparison_table(view)
    if isinstance(view, ErrorView):
        return error_table(view)
    if isinstance(view, SweepView):
        return sweep_table(view)
    return scaling_table(view)
