"""Simulated measurements of many plans for the price of their distinct stages.

[Note: what a simulated stage's memory depends on] A device's memory in a run is fixed by what it executes:
its stage's layers ``[start, stop)`` (which also say whether it holds the input batch, ``start == 0``, or
computes the loss, ``stop == L``), its parallelism and degree (its shard of parameters and rows), and its
list of actions, which the schedule derives from the number of stages after it (GPipe: none of it; 1F1B:
``min(stages after, micro-batches)`` warm-up forwards). What its neighbours are does not enter: a receive
allocates one buffer of the device's own rows however many peers fill it, a send allocates nothing (views of
the detached output), and collectives stay inside the stage (runtime/sim.py, [Note: simulating one device
per stage], which argues the same for the devices of one stage). So one simulated device per distinct
``(start, stop, kind, degree, warm-up)`` measures every plan made of such stages; over 500 random plans of
an 18-layer model that is a few hundred stage simulations instead of thousands.

A ZeRO-sharded stage's devices differ (ZeRO-1's shares of whole parameters are uneven, FSDP's last chunks
smaller: predict/zero_layout.py), but what each holds is fixed by its place in the stage's data group, which is its
place in the stage's device list (plans list devices ascending; ``dist.new_group`` orders a group by global
rank), not by which devices they are. So a ZeRO stage is cached too, as the list of its devices' peaks in
device-list order, every device simulated once (``simulate`` simulates one device per distinct share instead,
runtime/zero_shares.py).

This is an argument about the runtime, so :class:`StageCache` is checked against whole-plan simulations
(``simulate``) by the benchmark that uses it (benchmarks/prediction_error: byte-identical peaks on every
device of the plans it checks) and by tests/workflows/test_stage_cache.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridplan.errors import UsageError
from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.workflows.validate import DeviceMemory

__all__ = ["StageCache", "stage_key"]


def stage_key(plan: Plan, index: int) -> str:
    """What the memory of stage ``index`` of ``plan`` depends on ([Note: what a simulated stage's memory
    depends on]): ``"start,stop,kind,degree,warmup"``, then ``",t<tensor degree>"`` for a data x tensor stage
    (degree 8 is 2 x 4 or 4 x 2), ``",recompute"`` for a recomputed one (``",selective"`` under the selective policy) and ``",zero<level>"`` for a ZeRO-sharded
    one, whose entry lists every device's peak, and ``",<schedule>"`` unless the schedule is 1F1B: GPipe's stages
    have no warm-up forwards either, like 1F1B's last stage, and hold more (all micro-batches in flight). (1F1B
    keys are unchanged, so 1F1B cache files written before stay valid; GPipe entries of a file written before,
    which had no suffix, are simulated again.)"""
    s = plan.stages[index]
    if s.zero and list(s.devices) != sorted(s.devices):
        raise ValueError(f"stage {index} ({s.describe()}) is ZeRO-sharded over devices not in ascending order: a"
                         " device's share follows its group rank, not its place in the list; simulate the plan whole")
    after = plan.num_stages - index - 1
    warmup = 0 if plan.schedule == "gpipe" else min(after, plan.num_microbatches)
    key = f"{s.start},{s.stop},{s.kind},{s.degree},{warmup}"
    if s.kind == "data+tensor":
        key += f",t{s.tensor_degree}"
    if s.recompute == "full":
        key += ",recompute"
    elif s.recompute == "selective":
        key += ",selective"
    if s.zero:
        key += f",zero{s.zero}"
    if plan.schedule != "1f1b":
        key += f",{plan.schedule}"
    return key


class StageCache:
    """Peak memory of simulated stages, each simulated once, kept in a JSON file between runs.

    On simulated CUDA devices it also keeps each stage's reserved peak (the allocator's replay), under the file's
    ``"reserved"`` key (a file written before has none: its CUDA stages are simulated again once). One cache may
    serve plans of several schedules: a key names the schedule unless it is 1F1B (:func:`stage_key`), and several
    settings: a key ends with the run options it was simulated under (precision, device type, recomputation, an
    engine's gradient accumulation: everything but the backend), so a file never answers for one setting with
    another's stages. Entries of a file written before the options were in the keys match no key and are
    simulated again. The file records its model; opening it for another model is refused (UsageError).

    Args:
        path: the JSON file (created; reloaded when it exists).
        model: zoo name or ``module:function``.
        cluster: the mesh the plans run on (its device memory should be unlimited to measure any peak).
        run_options: :class:`~hybridplan.runtime.config.RunConfig` fields (precision, device type, seed, ...).
        progress: called with one line per simulated stage.
    """

    def __init__(self, path: str | Path, *, model: str, cluster: Cluster, run_options: dict[str, Any] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.model = model
        self.cluster = cluster
        self.run_options = {k: v for k, v in (run_options or {}).items() if k != "backend"}
        self.progress = progress
        data = _load(self.path) if self.path.exists() else {}
        written_for = data.pop("model", model)
        if written_for != model:
            raise UsageError(f"stage cache {self.path} holds stages of model {written_for!r}, not of {model!r}",
                             fix=f"use another --cache file for {model!r}, or delete {self.path}")
        self.reserved: dict[str, int | list[int]] = dict(data.pop("reserved", {}))
        """CUDA: the reserved peak of every simulated stage (``max_memory_reserved`` of the replay; per device, in
        device-list order, for a ZeRO stage)."""
        self.peaks: dict[str, int | list[int]] = data
        self._cuda = self.run_options.get("device_type") == "cuda"
        self._suffix = "|" + ",".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(self.run_options.items()))
        self.simulated = 0
        self._specs: Any = None

    def measure(self, plan: Plan) -> list[DeviceMemory]:
        """Every device's measured peak (GPipe/1F1B plans), simulating the stages not seen before."""
        from hybridplan.models.boundaries import boundary_specs
        from hybridplan.models.zoo import resolve_model
        from hybridplan.runtime.config import RunConfig, validate_config
        from hybridplan.runtime.sim import simulate_stage

        cfg = RunConfig(model=self.model, plan=plan, cluster=self.cluster, iterations=2, backend="sim", **self.run_options)
        out: list[DeviceMemory] = []
        for i, stage in enumerate(plan.stages):
            key = self.key(plan, i)
            if key not in self.peaks or (self._cuda and key not in self.reserved):
                validate_config(cfg)
                if self._specs is None:
                    self._specs = boundary_specs(resolve_model(self.model))
                # One device per stage, every device of a ZeRO stage ([Note: what a simulated stage's memory
                # depends on]); the measured iteration's peak, as launch reports it.
                reports = [simulate_stage(cfg, i, iterations=2, specs=self._specs, rank=d)
                           for d in (stage.devices if stage.zero else stage.devices[:1])]
                peaks = [max(r.iteration_peaks[1:]) for r in reports]
                self.peaks[key] = peaks if stage.zero else peaks[0]
                if all(r.reserved_peaks for r in reports):
                    reserved = [max(r.reserved_peaks[1:]) for r in reports]
                    self.reserved[key] = reserved if stage.zero else reserved[0]
                self.simulated += 1
                self._save()
                if self.progress is not None:
                    self.progress(f"simulated stage {key}: {self.peaks[key]} bytes")
            value = self.peaks[key]
            each = value if isinstance(value, list) else [value] * len(stage.devices)
            out += [DeviceMemory(d, i, None, peak) for d, peak in zip(stage.devices, each)]
        return sorted(out, key=lambda d: d.device)

    def reserved_peaks(self, plan: Plan) -> dict[int, int]:
        """CUDA: every device's reserved peak, for the stages :meth:`measure` simulated (empty on a CPU)."""
        out: dict[int, int] = {}
        for i, stage in enumerate(plan.stages):
            value = self.reserved.get(self.key(plan, i))
            if value is not None:
                each = value if isinstance(value, list) else [value] * len(stage.devices)
                out.update(zip(stage.devices, each))
        return out

    def key(self, plan: Plan, index: int) -> str:
        """The file's key of stage ``index`` of ``plan``: :func:`stage_key`, then ``|`` and the run options."""
        return stage_key(plan, index) + self._suffix

    def _save(self) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"model": self.model, **self.peaks, **({"reserved": self.reserved} if self.reserved else {})},
                                  indent=0) + "\n")
        os.replace(tmp, self.path)


def _load(path: Path) -> dict[str, Any]:
    """The stage cache in ``path``: a JSON object (anything else is refused with the fix, never half-read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # a JSONDecodeError and a UnicodeDecodeError are ValueErrors
        raise UsageError(f"stage cache {path} cannot be read as JSON ({type(exc).__name__}: {str(exc)[:80]})",
                         fix=f"delete {path} (its stages are simulated again), or name another --cache file") from None
    if not isinstance(data, dict):
        raise UsageError(f"stage cache {path} holds a JSON {type(data).__name__}, not a stage cache's object",
                         fix=f"delete {path} (its stages are simulated again), or name another --cache file")
    return data
