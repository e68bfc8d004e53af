"""Run a plan: the runtime's front door, which hands the run to the backend its configuration names.

- ``RunConfig.backend == "real"``: one local process per device trains for real (runtime/processes.py);
- ``RunConfig.backend == "sim"``: every device's work runs on fake tensors in this process and its memory
  is counted exactly (runtime/sim.py).

Both return the same :class:`~hybridplan.runtime.result.RunResult`. Runs on several machines are started
by torchrun instead (runtime/torchrun.py), by hand or from a head node (runtime/multinode.py, whose
``MultiNode.launch`` returns the same result).

Example::

    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch
    result = launch(RunConfig(model="gpt-tiny", plan=plan, cluster=Cluster.parse("1x4")))
    print(result.summary())
"""

from __future__ import annotations

from collections.abc import Callable

from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.processes import run_processes
from hybridplan.runtime.result import RunResult
from hybridplan.runtime.sim import simulate

__all__ = ["launch"]


def launch(
    cfg: RunConfig,
    *,
    on_event: Callable[[str], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> RunResult:
    """Train ``cfg.plan`` for ``cfg.iterations`` iterations with one local process per device, or
    simulate it in this process if ``cfg.backend == "sim"``.

    Args:
        cfg: the run.
        on_event: called with short progress messages (process start, end, failures).
        on_start: called with the process ids of the ranks once they are started (not for "sim").

    Returns:
        The aggregated result; ``status`` is "ok", "oom" or "failed" (never raises for a failed run).

    Raises:
        HybridPlanError: if the configuration itself is invalid (nothing is started then).
    """
    if cfg.backend == "sim":
        return simulate(cfg, on_event=on_event)  # each backend validates the configuration itself
    return run_processes(cfg, on_event=on_event, on_start=on_start)
