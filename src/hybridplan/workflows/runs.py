"""What the benchmark scripts share: profiles made once, plans measured, results kept between runs.

Every experiment under ``benchmarks/`` profiles a model, builds plans (ours and the baselines'), runs them
(real CPU runtime or simulated devices) and compares. The scripts stay short by using these helpers:

- :func:`ensure_profile`: the profiling campaign into a database, resumed if it was interrupted;
- :func:`measure_plan`: run a plan and pair every device's measured peak with its prediction (a plan the
  profile cannot predict is still run, with no prediction);
- :func:`plan_from_choices`: a search-space plan (stage choices) as a :class:`~hybridplan.plan.Plan`;
- :class:`ResultStore`: a JSON file of finished measurements keyed by name, written after each one, so
  that a long benchmark stopped half-way resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import HybridPlanError
from hybridplan.plan import Plan
from hybridplan.workflows.validate import DeviceMemory
from hybridplan.search.memory.configs import StageChoice
from hybridplan.search.memory.space import PlanSpace

__all__ = ["ensure_profile", "MeasuredPlan", "measure_plan", "plan_from_choices", "ResultStore", "devices_json"]


def ensure_profile(db: str | Path, *, model: str, cluster: Cluster, global_batch_size: int, num_microbatches: int,
                   schedule: str = "1f1b", run_options: dict[str, Any] | None = None,
                   progress: Callable[[str], None] | None = None, **campaign: Any) -> Path:
    """Profile ``model`` into ``db`` (resuming a campaign found there); returns the path.

    ``campaign`` holds further :class:`~hybridplan.profiling.campaign.CampaignConfig` fields (scenarios, ...).
    """
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.plan import as_schedule
    from hybridplan.profiling.store import ProfileStore

    path = Path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = CampaignConfig(model=model, cluster=cluster, global_batch_size=global_batch_size,
                         num_microbatches=num_microbatches, schedule=as_schedule(schedule),
                         run_options=dict(run_options or {}),
                         **campaign)
    with ProfileStore(path) as store:
        Campaign(cfg, store, progress=progress).run()
    return path


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan's run: status and per-device peaks, predicted where the profile could."""

    plan: Plan
    status: str
    reason: str | None
    devices: tuple[DeviceMemory, ...]

    def peak(self, which: str) -> int | None:
        """The largest "predicted" or "measured" device peak."""
        values = [getattr(d, which) for d in self.devices if getattr(d, which) is not None]
        return max(values) if values else None


def measure_plan(db: str | Path | None, plan: Plan, *, cluster: Cluster, backend: str, model: str | None = None,
                 run_options: dict[str, Any] | None = None) -> MeasuredPlan:
    """Run ``plan`` on ``cluster`` and pair every device's measured peak with its prediction from ``db``.

    Args:
        db: the profile: its model, seed and run options are the run's (``model`` and ``run_options``
            override them), and it predicts the plan. None: no prediction; ``model`` and ``run_options`` say
            what to run (seed 0).
        backend: "real" or "sim".
        run_options: further :class:`~hybridplan.runtime.config.RunConfig` fields.

    Raises:
        UsageError: without ``db``, if ``model`` is missing.
    """
    from hybridplan.errors import UsageError
    from hybridplan.models.profiled import model_of_campaign
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    identity: dict[str, Any] = {"run_options": {}, "seed": 0, "model": model}
    predicted: dict[int, int] = {}
    if db is not None:
        with ProfileStore(db, create=False) as store:
            identity = store.get_meta("identity")
        try:
            prediction = MemoryPredictor.from_db(db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                                 num_microbatches=plan.num_microbatches).predict(plan)
            predicted = {d.device: d.peak_memory_bytes for d in prediction.devices}
        except HybridPlanError:
            pass  # the profile cannot predict this plan: run it anyway, without a prediction
    elif model is None:
        raise UsageError("measure_plan without a profile needs the model", fix="pass model='zoo-name'")
    options = {**identity.get("run_options", {}), **(run_options or {}), "backend": backend}
    name = model_of_campaign(identity, model, source=f"profile database {str(db)!r}") if db is not None else model
    if name is None:  # pragma: no cover - refused above
        raise UsageError("measure_plan without a profile needs the model", fix="pass model='zoo-name'")
    run = launch(RunConfig(model=name, plan=plan, cluster=cluster, iterations=2,
                           seed=identity["seed"], **options))
    measured = {d.device: d.peak_memory_bytes for d in run.devices}
    devices = tuple(DeviceMemory(d, i, predicted.get(d), measured.get(d)) for i, s in enumerate(plan.stages) for d in s.devices)
    return MeasuredPlan(plan, run.status, run.reason, tuple(sorted(devices, key=lambda d: d.device)))


def devices_json(devices: Sequence[DeviceMemory]) -> list[dict[str, Any]]:
    """The ``devices`` list of the report's JSON forms."""
    return [{"device": d.device, "stage": d.stage, "predicted": d.predicted, "measured": d.measured} for d in devices]


def plan_from_choices(space: PlanSpace, choices: Sequence[StageChoice], *, schedule: str, global_batch_size: int,
                      num_microbatches: int) -> Plan:
    """The plan of a search-space answer, placed on the mesh as the solvers place it."""
    from hybridplan.search.memory.objective import build_result

    result = build_result("given", space, lambda c, after: 0.0, choices, visited=0, started=0.0, now=0.0)
    return result.to_plan(schedule=schedule, global_batch_size=global_batch_size, num_microbatches=num_microbatches)


class ResultStore:
    """Finished measurements in one JSON object ``{key: record}``, rewritten (atomically) after each ``put``.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "r.json")
        >>> s = ResultStore(path); s.put("a", {"x": 1}); "a" in ResultStore(path)
        True
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def __getitem__(self, key: str) -> Any:
        return self.records[key]

    def put(self, key: str, record: Any) -> None:
        """Store ``record`` under ``key`` and write the file."""
        self.records[key] = record
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.records, indent=0) + "\n")
        os.replace(tmp, self.path)
