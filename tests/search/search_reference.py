"""Independent reference implementations for the search tests (no code shared with the solvers' scoring)."""

from __future__ import annotations

from hybridplan.search.memory.space import PlanSpace, enumerate_plans

KIND_RANK = {"none": 0, "data": 1, "tensor": 2}


def paper_order_key(device_values: list[float]) -> list[float]:
    """CAPTURE's rule, literally: compare the highest device; on a tie drop it and compare the rest.

    Sorting the values in descending order and comparing the lists is exactly that procedure.
    """
    return sorted(device_values, reverse=True)


def brute_force(model, space: PlanSpace, keep=lambda stages: True):
    """The best plan by scoring every plan with direct model calls (uncapped ``stages_after``), of the plans
    ``keep`` keeps (given the stages).

    Returns ``(stages, device_values_sorted_desc)`` with stages as ``(start, stop, kind, degree)``, or
    ``None`` when every plan uses a disallowed config.
    """
    best = None
    for choices in enumerate_plans(space):
        stages = [(c.start, c.stop, space.configs[c.config].kind, space.configs[c.config].degree) for c in choices]
        if not all(model.allowed(a, b, kind, d) for a, b, kind, d in stages) or not keep(stages):
            continue
        n = len(stages)
        values = []
        for i, (a, b, kind, d) in enumerate(stages):
            values += [float(model.stage_memory(a, b, kind, d, n - 1 - i))] * d
        canon = [(b, KIND_RANK[kind], d) for a, b, kind, d in stages]
        key = (paper_order_key(values), canon)
        if best is None or key < best[0]:
            best = (key, stages)
    return None if best is None else (best[1], best[0][0])


def stages_of(result) -> list[tuple[int, int, str, int]]:
    """A result's stages as ``(start, stop, kind, degree)``."""
    return [(s.start, s.stop, s.kind, s.degree) for s in result.stages]
