"""ZeRO-2/3 stages in bf16 mixed precision against simulated devices (data and data x tensor stages, 4 models).

[Note: the reduce-scatter in mixed precision] (predict/zero3_transients.py) predicts ZeRO-2 and ZeRO-3 stages from a
bf16 profile with the rules measured in fp32, the gathered copies in bf16, and the reduce-scatter's fp32 cast.
This measures it on fixed stages, sized for a shared 2-core machine:

- each model is profiled once on 1x4 simulated devices in bf16: pipeline, tensor x2, data x2 and its ZeRO-3
  scenario (``data2-zero3``), at two batches (``hybridplan profile`` of those scenarios);
- per model, three spans that do not hold the model's last layer (a ZeRO-2/3 data x tensor stage holding it is
  refused, and a ZeRO-3 data stage holding it takes its scenario's quantities in mixed precision), each as a
  ZeRO-2 and a ZeRO-3 stage, data x tensor 2 x 2 (4 devices) and data x2, between pipeline-only stages, under
  GPipe and 1F1B;
- each plan is run whole on simulated devices once (kept in ``results.json``) and predicted again by today's
  predictor on every run; the error of every device of the sharded stage is reported.

Run from the repository root (resumable: rerun to continue; a plan already measured is not run again)::

    .venv/bin/python -m benchmarks.zero_bf16.run
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path

from hybridplan.errors import ProfileError
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.partitions import Scenario
from hybridplan.workflows.runs import ResultStore, ensure_profile
from hybridplan.workflows.validate import ValidationReport, validate_plan

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
MESH = "1x4"
PRECISIONS = ("bf16", "fp16", "fp32")
"""Precisions measured: bf16 (the default), fp16 (the same bytes moved; ``--precision fp16``), and fp32 for
comparison (where an error is the fp32 rules' or the profile's own, not mixed precision's)."""
MLP = "tests.cli.user_models:mlp"
SPANS = {"gpt-tiny": [(0, 3), (3, 6), (1, 5)], "wresnet-tiny": [(0, 4), (2, 5), (1, 3)],
         "moe-tiny": [(0, 3), (1, 4), (2, 5)], MLP: [(0, 2), (1, 3), (0, 3)]}
"""Spans per model (none holds the last layer); the MLP: Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)."""
ENDING = {"gpt-tiny": [(5, 10), (7, 10), (9, 10)], "wresnet-tiny": [(4, 7), (5, 7), (6, 7)],
          "moe-tiny": [(3, 6), (4, 6), (5, 6)], MLP: [(3, 5), (2, 5), (4, 5), (0, 5)]}
"""Spans per model that hold its last layer (``--ending``: data x tensor stages; [Note: the layers before the head]
in predict/zero3_transients.py)."""
BATCHES = {MLP: (32, 2)}
"""Global batch and micro-batches: 64 in 4 (micro-batches of 16) unless given here."""
SCENARIOS = (Scenario("none", 1), Scenario("tensor", 2), Scenario("data", 2), Scenario("data", 2, 3))
KINDS = ("data+tensor", "data")
SCHEDULES = ("1f1b", "gpipe")


def name(model: str) -> str:
    return model.rsplit(":", 1)[-1]


def run_options(precision: str) -> dict[str, str]:
    return {"backend": "sim", "precision": precision}


def profile(model: str, precision: str) -> Path:
    batch, micro = BATCHES.get(model, (64, 4))
    say = lambda msg: print(f"  [{name(model)}] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{name(model)}-{MESH}-{precision}.sqlite", model=model, cluster=Cluster.parse(MESH),
                          global_batch_size=batch, num_microbatches=micro, run_options=run_options(precision),
                          scenarios=SCENARIOS, progress=say)


def plan_of(model: str, num_layers: int, kind: str, zero: int, span: tuple[int, int], schedule: str) -> Plan:
    """The span as a ZeRO ``zero`` stage of ``kind`` between pipeline-only stages (one device each)."""
    a, b = span
    before = [{"layers": [0, a], "parallelism": "none", "degree": 1}] if a else []
    stage = ({"layers": [a, b], "parallelism": "data+tensor", "degree": 4, "tensor_degree": 2, "zero": zero}
             if kind == "data+tensor" else {"layers": [a, b], "parallelism": "data", "degree": 2, "zero": zero})
    after = [{"layers": [b, num_layers], "parallelism": "none", "degree": 1}] if b < num_layers else []
    stages, device = [], 0
    for s in before + [stage] + after:
        stages.append({**s, "devices": list(range(device, device + s["degree"]))})
        device += s["degree"]
    batch, micro = BATCHES.get(model, (64, 4))
    return Plan.from_dict({"schedule": schedule, "global_batch_size": batch, "num_microbatches": micro, "stages": stages})


def measure(model: str, store: ResultStore, *, spans: list[tuple[int, int]] | None = None,
            kinds: tuple[str, ...] = KINDS, zeros: tuple[int, ...] = (2, 3), precision: str = "bf16") -> list[dict]:
    """Every stage of ``model`` measured (resumed from ``store``) and predicted by today's predictor (``spans``:
    others than the model's three)."""
    db = profile(model, precision)
    label = name(model) if precision == "bf16" else f"{name(model)}-{precision}"
    out = []
    for schedule in SCHEDULES:
        predictor = MemoryPredictor.from_db(db, schedule=schedule)
        for kind in kinds:
            for zero in zeros:
                for span in spans or SPANS[model]:
                    if span[1] > predictor.num_layers:
                        raise SystemExit(f"span {span[0]}-{span[1]}: {name(model)} has {predictor.num_layers} layers")
                    plan = plan_of(model, predictor.num_layers, kind, zero, span, schedule)
                    key = f"{label}/{schedule}/{kind}/zero{zero}/{span[0]}-{span[1]}"
                    errors = sharded_errors(key, plan, 1 if span[0] else 0, store, predictor, partial(
                        validate_plan, db, model=model, run_options=run_options(precision)))
                    out.append({"model": label, "kind": kind, "zero": zero, "errors": errors})
    return out


def sharded_errors(key: str, plan: Plan, sharded: int, store: ResultStore, predictor: MemoryPredictor,
                   validate: Callable[..., ValidationReport]) -> list[float] | None:
    """The prediction error of each device of the plan's stage ``sharded``: measured once by ``validate`` (run
    whole on simulated devices, kept in ``store`` under ``key``), predicted by ``predictor`` on every call; None
    where the predictor refuses the plan (an older one: the README's "before")."""
    if key not in store or store[key]["plan"] != plan.to_dict():
        report = validate(plan, cluster=Cluster.parse(f"1x{plan.num_devices}"))
        if not report.run.ok:
            raise SystemExit(f"{key}: {report.run.reason}")
        store.put(key, {"plan": plan.to_dict(), "measured": {
            str(d.device): d.peak_memory_bytes for d in report.run.devices if d.stage == sharded}})
    try:
        predicted = {d.device: d.peak_memory_bytes for d in predictor.predict(plan).devices}
    except ProfileError as e:
        print(f"{key}: refused ({e})", flush=True)
        return None
    errors = [(predicted[int(dev)] - m) / m for dev, m in store[key]["measured"].items()]
    print(f"{key}: {len(errors)} devices, error {100 * min(errors):+.2f}% .. {100 * max(errors):+.2f}%", flush=True)
    return errors


def table(done: list[dict]) -> str:
    """Per model, stage kind and ZeRO level: stages, devices exact and within 2%, the error range."""
    rows = ["| model | stage | ZeRO | stages | devices | exact | within 2% | error range |", "|---|---|---:|---:|---:|---:|---:|---|"]
    groups: dict[tuple[str, str, int], list[list[float] | None]] = {}
    for r in done:
        groups.setdefault((r["model"], r["kind"], r["zero"]), []).append(r["errors"])
    for (model, kind, zero), stages in groups.items():
        if any(s is None for s in stages):
            rows.append(f"| {model} | {kind} | {zero} | {len(stages)} | refused | | | |")
            continue
        errors = [e for s in stages for e in s]
        rows.append(f"| {model} | {kind} | {zero} | {len(stages)} | {len(errors)} | {sum(e == 0 for e in errors)} |"
                    f" {sum(abs(e) <= 0.02 for e in errors)} | {100 * min(errors):+.2f}% .. {100 * max(errors):+.2f}% |")
    every = [e for r in done if r["errors"] is not None for e in r["errors"]]
    if every:
        rows.append(f"\nall predicted devices: {len(every)}, exact {sum(e == 0 for e in every)}, within 2%"
                    f" {sum(abs(e) <= 0.02 for e in every)} ({100 * sum(abs(e) <= 0.02 for e in every) / len(every):.1f}%),"
                    f" within 5% {sum(abs(e) <= 0.05 for e in every)}, low {sum(e < 0 for e in every)},"
                    f" largest |error| {100 * max(abs(e) for e in every):.2f}%")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(SPANS), help=f"comma-separated subset of {list(SPANS)}")
    ap.add_argument("--spans", help="comma-separated START-STOP layer spans instead of each model's three (a span"
                    " holding the last layer: data stages only, ZeRO-3 there keeps its scenario's quantities)")
    ap.add_argument("--ending", action="store_true", help="each model's spans that hold its last layer (ENDING),"
                    " as data x tensor stages")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {list(KINDS)}")
    ap.add_argument("--zero", default="2,3", help="comma-separated ZeRO levels of 2, 3")
    ap.add_argument("--precision", default="bf16", choices=PRECISIONS)
    args = ap.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in SPANS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}: give some of {list(SPANS)}")
    try:
        spans = [tuple(int(x) for x in part.split("-")) for part in args.spans.split(",")] if args.spans else None
        zeros = tuple(int(z) for z in args.zero.split(","))
    except ValueError:
        raise SystemExit(f"--spans {args.spans!r} / --zero {args.zero!r}: give START-STOP spans and levels 2, 3") from None
    kinds = ("data+tensor",) if args.ending else tuple(args.kinds.split(","))
    if args.ending and spans:
        raise SystemExit("--ending measures each model's spans that hold its last layer: give it or --spans, not both")
    if any(len(span) != 2 or not 0 <= span[0] < span[1] for span in spans or []) or not set(zeros) <= {2, 3} \
            or not set(kinds) <= set(KINDS):
        raise SystemExit(f"--spans {args.spans!r}, --zero {args.zero!r}, --kinds {args.kinds!r}: give START-STOP spans"
                         f" with START < STOP, levels of 2, 3 and kinds of {list(KINDS)}")
    store = ResultStore(HERE / "results.json")
    done = [r for model in models
            for r in measure(model, store, spans=ENDING[model] if args.ending else spans, kinds=kinds, zeros=zeros,
                             precision=args.precision)]
    print(table(done))


if __name__ == "__main__":
    main()
