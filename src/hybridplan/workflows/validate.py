"""Validation: run a plan for real and compare every device's measured peak with the prediction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.models.profiled import model_of_campaign
from hybridplan.plan import Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.prediction import PlanPrediction
from hybridplan.profiling.store import ProfileStore
from hybridplan.runtime.result import SHARED_GPU_NOTE, RunResult
from hybridplan.units import format_bytes

__all__ = ["DeviceMemory", "ValidationReport", "validate_plan", "relative_error"]


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: positive means the prediction was too high."""
    return (predicted - measured) / measured


@dataclass(frozen=True)
class DeviceMemory:
    """One device: predicted and measured peak bytes (either may be unknown: a prediction the profile cannot
    make, a run that failed). Validations, benchmarks and reports all pair devices this way."""

    device: int
    stage: int
    predicted: int | None = None
    measured: int | None = None

    @property
    def error(self) -> float | None:
        """:func:`relative_error`, or None when either side is unknown (or nothing was measured)."""
        if self.predicted is None or not self.measured:
            return None
        return relative_error(self.predicted, self.measured)


@dataclass
class ValidationReport:
    """Predicted against measured per-device peaks of one plan."""

    plan: Plan
    prediction: PlanPrediction
    run: RunResult
    rows: list[DeviceMemory]

    @property
    def max_abs_error(self) -> float | None:
        errors = [abs(r.error) for r in self.rows if r.error is not None]
        return max(errors) if errors else None

    def reserved(self) -> dict[int, tuple[int | None, int | None]]:
        """CUDA: every device's (predicted, measured) reserved peak of the caching allocator; {} on a CPU."""
        predicted = {d.device: d.reserved_peak_bytes for d in self.prediction.devices}
        measured = {d.device: d.reserved_peak_bytes for d in self.run.devices}
        if all(v is None for v in (*predicted.values(), *measured.values())):
            return {}
        return {r.device: (predicted.get(r.device), measured.get(r.device)) for r in self.rows}

    def to_dict(self) -> dict[str, Any]:
        reserved = self.reserved()
        return {
            "plan": self.plan.to_dict(),
            "status": self.run.status,
            "reason": self.run.reason,
            "devices": [{**asdict(r), "relative_error": r.error,
                         **({"predicted_reserved": reserved[r.device][0], "measured_reserved": reserved[r.device][1]}
                            if reserved else {})} for r in self.rows],
            "max_abs_relative_error": self.max_abs_error,
            "predicted_peak_bytes": self.prediction.peak_memory_bytes,
            "measured_peak_bytes": self.run.peak_memory_bytes,
            "share_gpu": bool(self.run.config.get("share_gpu", False)),
        }

    def table(self) -> str:
        lines = [self.plan.describe(), f"run: {self.run.status}" + (f" ({self.run.reason})" if self.run.reason else "")]
        if self.run.config.get("share_gpu"):
            lines.append(f"MODE: {SHARED_GPU_NOTE}")
        reserved = self.reserved()  # CUDA: the caching allocator's reserved peak too (predict/reserved.py)
        lines.append(f"{'device':>6} {'stage':>5} {'predicted':>12} {'measured':>12} {'error':>8}"
                     + (f" {'reserved pred.':>14} {'reserved meas.':>14}" if reserved else ""))
        for r in self.rows:
            err = "-" if r.error is None else f"{100 * r.error:+.2f}%"
            lines.append(f"{r.device:>6} {r.stage:>5} {format_bytes(r.predicted):>12} {format_bytes(r.measured):>12} {err:>8}"
                         + (f" {format_bytes(reserved[r.device][0]):>14} {format_bytes(reserved[r.device][1]):>14}"
                            if reserved else ""))
        measured = self.run.peak_memory_bytes
        if self.max_abs_error is not None and measured is not None:
            plan_err = relative_error(self.prediction.peak_memory_bytes, measured)
            lines.append(f"largest per-device error {100 * self.max_abs_error:.2f}%; plan peak error {100 * plan_err:+.2f}%")
        return "\n".join(lines)


def validate_plan(
    db: str | Path,
    plan: Plan,
    *,
    cluster: Cluster | None = None,
    iterations: int = 2,
    degree_fit: str = "log",
    progress: Callable[[str], None] | None = None,
    run_options: dict[str, Any] | None = None,
    model: str | None = None,
    recompute_db: str | Path | None = None,
) -> ValidationReport:
    """Predict ``plan`` from the profile ``db``, run it with the profiled model and settings, compare.

    Args:
        cluster: the devices to run on; default: a single node of as many devices as the plan uses,
            with the profiled cluster's device type and memory capacity.
        recompute_db: a profile taken with recompute, for the stages the plan recomputes (MemoryPredictor.from_db).
        model: the model to run (the user's ``--model``); default: the profiled one, if it is a zoo model
            ([Note: a file is data] in models/names.py: a database alone never makes us import code).

    Raises:
        ProfileError: if the database names user code and ``model`` is not given, or names another model.
        UsageError: for a real CUDA run where PyTorch sees no GPU, or ``share_gpu`` on CPU devices
            (runtime/gpu_check.py), before the run starts.
    """
    predictor = MemoryPredictor.from_db(
        db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
        num_microbatches=plan.num_microbatches, degree_fit=degree_fit, recompute_db=recompute_db,
    )
    prediction = predictor.predict(plan)
    with ProfileStore(db, create=False) as store:
        identity = store.get_meta("identity")
    if identity is None:
        raise ProfileError(f"{str(db)!r} holds no profiling campaign", fix="run 'hybridplan profile' first")
    if cluster is None:
        profiled = Cluster.from_dict(identity["cluster"])
        cluster = Cluster.uniform(
            1, plan.num_devices, device_type=profiled.devices[0].type, memory_bytes=profiled.memory_of(0),
            gpu=profiled.devices[0].gpu,
        )
    name = model_of_campaign(identity, model, source=f"profile database {str(db)!r}")

    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.launch import launch

    options = {**identity.get("run_options", {}), **(run_options or {})}
    from hybridplan.runtime.gpu_check import check_devices

    check_devices("the validation run", backend=options.get("backend", "real"),
                  device_type=options.get("device_type", "cpu"), share_gpu=bool(options.get("share_gpu")))
    cfg = RunConfig(model=name, plan=plan, cluster=cluster, iterations=iterations, seed=identity["seed"], **options)
    if progress is not None:
        progress(f"running {name} with the plan on {cluster.describe()}")
    run = launch(cfg)
    measured = {d.device: d.peak_memory_bytes for d in run.devices}
    rows = [DeviceMemory(d.device, d.stage, d.peak_memory_bytes, measured.get(d.device)) for d in prediction.devices]
    return ValidationReport(plan, prediction, run, rows)
