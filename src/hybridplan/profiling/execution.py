"""Running one profiling run: on the real runtime, or its measured stages on simulated devices.

Either way the result is, per measured device, its start level, data share and per-action timeline,
from which profiling/quantities.py derives the stage's quantities.

[Note: two micro-batches suffice on simulated devices] A stage's quantities are per action (every
forward keeps the same bytes, the first backward allocates the gradients, later ones free what a
forward kept), so a run with two micro-batches has them all; only the data share grows with the
micro-batch count, linearly (it is the device's rows of the batch). Simulated profiling therefore runs
each measured stage with two micro-batches of the target size, scales its data share to the real
count, and replays the stage's peak at its position in the run (profiling/schedule_memory.py, exact on
the runtime: tests/profiling/test_replay.py) for CAPTURE's peak statistic. A GPT-3 2.6B campaign with
64 micro-batches simulates 32 times fewer actions this way. A ZeRO-3 stage with a stage after it is the
exception: under 1F1B its later backward after a forward holds more than the one after a backward, and two
micro-batches run only the second ([Note: a ZeRO-3 stage's steady backward]).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from hybridplan.plan.cluster import Cluster
from hybridplan.plan import Plan
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.profiling.quantities import quantities_from_report, quantities_from_timeline
from hybridplan.profiling.stage_memo import StageMemo, code_digest, span_identity

__all__ = ["RunOutcome", "run_plan", "simulate_stages", "measurements_of", "failed_stage", "interrupted"]

_FAILED_DEVICE = re.compile(r"^device (\d+) \(stage (\d+)\)")
_INTERRUPTED = re.compile(r"killed by signal (2|15)\b|KeyboardInterrupt")


@dataclass
class RunOutcome:
    """What a profiling run returned."""

    status: str
    reason: str | None
    devices: list[dict[str, Any]] = field(default_factory=list)
    """Per measured device: device, stage, peak_memory_bytes, static_memory_bytes, data_bytes, timeline, and on a
    CUDA device ``reserved``: (tensor peak, reserved peak) of the same iterations (predict/reserved.py), and on a
    simulated CUDA device ``workspaces``: the cuBLAS workspaces inside ``static`` (profiling/statistics.py)."""

    @property
    def failed_stage(self) -> int | None:
        return failed_stage(self.reason)


def failed_stage(reason: str | None) -> int | None:
    """The stage a run's failure reason names ("device 3 (stage 1): ..."; runtime/processes.py)."""
    match = _FAILED_DEVICE.match(reason or "")
    return int(match.group(2)) if match else None


def interrupted(reason: str | None) -> bool:
    """Whether a failed run's reason says its ranks were stopped from outside (SIGINT or SIGTERM: a Ctrl-C or a job
    scheduler ending the campaign with its process group), which says nothing about the plan: a resumed campaign
    runs it again (profiling/campaign.py, Resuming)."""
    return bool(_INTERRUPTED.search(reason or ""))


def run_plan(plan: Plan, cluster: Cluster, execute: Callable[[Plan, Cluster], Any]) -> RunOutcome:
    """Run the whole plan (every device) with ``execute`` (the launcher) and collect every device."""
    result = execute(plan, cluster)
    devices = [asdict(d) if is_dataclass(d) and not isinstance(d, type) else dict(d) for d in result.devices]
    for d in devices:  # CUDA: both peaks are the highest of the measured iterations (runtime/result.py)
        if d.get("reserved_peak_bytes") is not None and d.get("peak_memory_bytes") is not None:
            d["reserved"] = (d["peak_memory_bytes"], d["reserved_peak_bytes"])
    return RunOutcome(result.status, result.reason, devices if result.status == "ok" else [])


def simulate_stages(
    plan: Plan,
    cluster: Cluster,
    spans: set[tuple[int, int]],
    *,
    model: Any,
    seed: int,
    iterations: int,
    run_options: dict[str, Any],
    specs: Sequence[Any],
    memo: StageMemo | None = None,
) -> RunOutcome:
    """Simulate one device of each stage of ``plan`` whose layers are in ``spans`` (see the note above); with
    ``memo``, a stage simulated before (by its identity: profiling/stage_memo.py) is read from it instead."""
    from hybridplan.runtime.config import RunConfig
    from hybridplan.runtime.memory import DeviceOutOfMemory
    from hybridplan.runtime.sim import simulate_stage

    devices = []
    for index, stage in enumerate(plan.stages):
        if (stage.start, stage.stop) not in spans:
            continue
        sim_plan = _simulated_plan(plan, index)
        cfg = RunConfig(model=model, plan=sim_plan, cluster=cluster, seed=seed, **run_options)
        scale = plan.num_microbatches / sim_plan.num_microbatches
        identity = _stage_identity(sim_plan, index, cluster, model, specs, seed, iterations, run_options) if memo else None
        simulated = memo.get(identity) if memo is not None and identity is not None else None
        if simulated is None:
            try:
                report = simulate_stage(cfg, index, iterations=iterations, specs=list(specs))
            except DeviceOutOfMemory as e:
                return RunOutcome("oom", f"device {stage.devices[0]} (stage {index}): DeviceOutOfMemory: {e}")
            simulated = {
                "static": report.static[-1], "data": report.data[-1], "timeline": report.timeline,
                # the simulated run's own peaks, with its micro-batches (predict/reserved.py [Note: predicting the
                # reserved peak])
                "reserved": [report.iteration_peaks[-1], report.reserved_peaks[-1]] if report.reserved_peaks else None,
                "workspaces": report.workspaces,  # inside ``static``: profiling/statistics.py [Note: workspaces are per device]
            }
            if memo is not None and identity is not None:
                memo.put(identity, simulated)
        static, data = simulated["static"], round(simulated["data"] * scale)
        q = quantities_from_timeline(static, data, simulated["timeline"])
        peak = stage_peak(q, plan.schedule, plan.num_stages - 1 - index, plan.num_microbatches)
        reserved = simulated["reserved"]
        devices.append({
            "device": stage.devices[0], "stage": index, "peak_memory_bytes": int(round(peak)),
            "static_memory_bytes": static, "data_bytes": data, "timeline": simulated["timeline"],
            "reserved": tuple(reserved) if reserved is not None else None, "workspaces": simulated["workspaces"],
        })
    return RunOutcome("ok", None, devices)


def _simulated_plan(plan: Plan, index: int) -> Plan:
    """The plan whose stage ``index`` is simulated for ``plan``'s: two micro-batches of the same size ([Note: two
    micro-batches suffice on simulated devices]), except for a ZeRO-3 stage with stages after it under 1F1B, which
    gets three and one stage after it ([Note: a ZeRO-3 stage's steady backward]).

    [Note: a ZeRO-3 stage's steady backward] With two micro-batches, a 1F1B stage with a stage after it runs
    F F B B: its later backward follows a backward. In a plan's steady state a later backward follows a forward, and
    under ZeRO-3 it then holds more: the layer before the one running is already gathered (FSDP2 prefetches in the
    order the forward recorded; [Note: a backward after a backward] in predict/zero3_transients.py). Mixtral-8x7B's
    blocks [4, 6) as data x2 ZeRO-3 (bf16, 4 rows a replica): the later backward after a backward holds 5,986,598,912
    bytes above its level, the one after a forward 7,616,757,760. Three micro-batches and one stage after run
    F F B F B B, which has both; profiling/quantities.py :func:`~hybridplan.profiling.quantities.backward_after_backward`
    tells them apart, so that the statistics compose with the one after a backward and floor with the one after a
    forward ([Note: a composed span holds at least its measured parts]). The 6-layer Mixtral's data ZeRO-3 devices
    (benchmarks/instant_planning) went from -3.34% to -0.19%; the profiles cost 3% to 5% more (Llama-2-7B on 2x8:
    34.5 s cold before, 36.3 s after)."""
    from hybridplan.plan.schedule import spec

    stage = plan.stages[index]
    steady = (stage.zero == 3 and index < plan.num_stages - 1 and plan.num_microbatches >= 3
              and spec(plan.schedule).order == "1f1b")
    short = 3 if steady else min(2, plan.num_microbatches)
    stages = plan.stages[:index + 2] if steady else plan.stages
    return Plan(plan.schedule, plan.microbatch_size * short, short, stages, plan.extra)


def _stage_identity(plan: Plan, index: int, cluster: Cluster, model: Any, specs: Sequence[Any], seed: int,
                    iterations: int, run_options: dict[str, Any]) -> dict[str, Any] | None:
    """What the simulated device of stage ``index`` measures depends on ([Note: a simulated stage is a function of
    its layers' signatures] in profiling/stage_memo.py); None when its layers have no signatures."""
    from hybridplan.plan.schedule import stage_actions

    stage = plan.stages[index]
    span = span_identity(model, stage.start, stage.stop, list(specs))
    if span is None:
        return None
    form = {k: v for k, v in stage.to_dict().items() if k not in ("layers", "devices")}
    actions = " ".join(map(str, stage_actions(plan.schedule, plan.num_stages, index, plan.num_microbatches)))
    options = {k: v for k, v in run_options.items() if k not in ("timeout_s", "backend")}
    return {"code": code_digest(), "span": span, "stage": form, "schedule": plan.schedule, "actions": actions,
            "microbatch_size": plan.microbatch_size, "iterations": iterations, "seed": seed, "options": options,
            "capacity": cluster.memory_of(stage.devices[0]),
            **({"gpu": gpu} if (gpu := cluster.devices[stage.devices[0]].gpu) is not None else {})}  # its CUDA terms


def measurements_of(outcome: RunOutcome, plan: Plan, batch: int) -> list[dict[str, Any]]:
    """The database rows of a successful run (profiling/store.py ``measurements``)."""
    rows = []
    for d in outcome.devices:
        s = plan.stages[d["stage"]]
        rows.append({
            "device": d["device"], "stage": d["stage"], "start": s.start, "stop": s.stop,
            "kind": "none" if s.degree == 1 else s.parallelism + (f"-zero{s.zero}" if s.zero else ""), "degree": s.degree,
            "batch_size": batch, "microbatch_size": plan.microbatch_size,
            "peak": d["peak_memory_bytes"], "quantities": quantities_from_report(d), "timeline": d["timeline"],
            "reserved": d.get("reserved"), "workspaces": d.get("workspaces"),
        })
    return rows
