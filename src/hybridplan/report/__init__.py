"""Reports: terminal tables and PNG plots of plans, validations, Pareto fronts and benchmark results.

A tour: :mod:`~hybridplan.report.data` reads every input into a typed view (and documents each JSON
form), :mod:`~hybridplan.report.tables` renders a view as text, :mod:`~hybridplan.report.plots` as a PNG
(matplotlib, optional), :mod:`~hybridplan.report.pareto` builds the memory/time front of a model from its
memory profile and time profile. ``hybridplan report`` (cli/report.py) ties them together.
:mod:`~hybridplan.report.plan_picture` draws one plan (its mesh, the per-device memory of
:mod:`~hybridplan.report.device_memory`, the schedule in time of :mod:`~hybridplan.report.timeline`) for
``hybridplan show`` (cli/show.py).
"""

from hybridplan.report.data import load_view, pareto_document, view_from_dict
from hybridplan.report.plots import render_plot
from hybridplan.report.tables import render_table

__all__ = ["load_view", "view_from_dict", "pareto_document", "render_plot", "render_table"]
