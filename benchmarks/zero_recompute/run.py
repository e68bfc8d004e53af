"""Recomputed ZeRO-2/3 data x tensor stages against simulated devices (4 models, fp32 and bf16).

[Note: a recomputed ZeRO-3 stage] (predict/zero3_transients.py) composes a recomputed ZeRO-2 or ZeRO-3 data x
tensor stage from the recompute profile's tensor stage; until 28 Nov such stages were refused. This measures it on
fixed stages, sized for a shared 2-core machine:

- each model is profiled twice on 1x4 simulated devices (pipeline and tensor x2 at two batches): without and with
  activation checkpointing (``hybridplan profile --activation-checkpointing``: the recompute profile that
  predicts the stages a plan recomputes, ``--recompute-db``);
- per model, the three spans of benchmarks/zero_bf16 (none holds the model's last layer: a ZeRO-2/3 data x tensor
  stage holding it is refused), each as a recomputed ZeRO-2 and ZeRO-3 data x tensor 2 x 2 stage between
  pipeline-only stages, under GPipe and 1F1B;
- as in benchmarks/zero_bf16 (whose helpers this uses), each plan runs once on simulated devices (``results.json``)
  and today's predictor is scored on every device of the sharded stage each time.

From the repository root (resumable; a plan already measured is not run again)::

    .venv/bin/python -m benchmarks.zero_recompute.run
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from benchmarks.zero_bf16.run import BATCHES, ENDING, MESH, MLP, SCHEDULES, name, plan_of, sharded_errors, table
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.partitions import Scenario
from hybridplan.workflows.runs import ResultStore, ensure_profile
from hybridplan.workflows.validate import validate_plan

WORK = Path(__file__).resolve().parent / "work"
PRECISIONS = ("fp32", "bf16")
SPANS = {"gpt-tiny": [(0, 3), (3, 6), (1, 5)], "wresnet-tiny": [(0, 4), (2, 5), (1, 3)],
         "moe-tiny": [(0, 3), (1, 4), (2, 5)], MLP: [(0, 3), (1, 3), (0, 4)]}
"""Spans per model (none holds the last layer); the MLP's (Linear, ReLU, Linear, ReLU, Linear) start or end at a
layer without parameters."""
SCENARIOS = (Scenario("none", 1), Scenario("tensor", 2))


def run_options(precision: str, recompute: bool = False) -> dict[str, object]:
    return {"backend": "sim", "precision": precision, "activation_checkpointing": recompute}


def profile(model: str, precision: str, recompute: bool) -> Path:
    batch, micro = BATCHES.get(model, (64, 4))
    tag = f"{name(model)}-{MESH}-{precision}" + ("-recompute" if recompute else "")
    say = lambda msg: print(f"  [{tag}] {msg}", flush=True)  # noqa: E731
    return ensure_profile(WORK / f"{tag}.sqlite", model=model, cluster=Cluster.parse(MESH), global_batch_size=batch,
                          num_microbatches=micro, run_options=run_options(precision, recompute), scenarios=SCENARIOS,
                          progress=say)


def recomputed_plan(model: str, num_layers: int, zero: int, span: tuple[int, int], schedule: str,
                    data: int = 2) -> Plan:
    """The span as a recomputed ZeRO ``zero`` data x tensor ``data`` x 2 stage between pipeline-only stages."""
    plan = plan_of(model, num_layers, "data+tensor", zero, span, schedule).to_dict()
    device = 0
    for stage in plan["stages"]:
        if stage.get("zero"):
            stage.update(recompute="full", degree=2 * data)
        stage["devices"] = list(range(device, device + stage["degree"]))
        device += stage["degree"]
    return Plan.from_dict(plan)


def measure(model: str, precision: str, store: ResultStore, zeros: tuple[int, ...] = (2, 3), data: int = 2,
            spans: list[tuple[int, int]] | None = None) -> list[dict]:
    """Every stage of ``model`` in ``precision`` (data degree ``data``; ``spans``: others than the model's three)
    measured (resumed from ``store``) and predicted by today's predictor."""
    db, recompute_db = profile(model, precision, False), profile(model, precision, True)
    label = f"{name(model)} {precision}" + (f" data x{data}" if data != 2 else "")
    out = []
    for schedule in SCHEDULES:
        predictor = MemoryPredictor.from_db(db, schedule=schedule, recompute_db=recompute_db)
        for zero in zeros:
            for span in spans or SPANS[model]:
                plan = recomputed_plan(model, predictor.num_layers, zero, span, schedule, data)
                key = f"{name(model)}-{precision}/{schedule}/zero{zero}/{span[0]}-{span[1]}" + (f"/data{data}" if data != 2 else "")
                errors = sharded_errors(key, plan, 1 if span[0] else 0, store, predictor, partial(
                    validate_plan, db, model=model, run_options=run_options(precision), recompute_db=recompute_db))
                out.append({"model": label, "kind": "data+tensor", "zero": zero, "errors": errors})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(SPANS), help=f"comma-separated subset of {list(SPANS)}")
    ap.add_argument("--precisions", default="fp32,bf16", help=f"comma-separated subset of {list(PRECISIONS)}")
    ap.add_argument("--zero", default="2,3", help="comma-separated ZeRO levels of 2, 3")
    ap.add_argument("--data", type=int, default=2, choices=(2, 4), help="the stage's data degree (tensor x2)")
    ap.add_argument("--ending", action="store_true", help="each model's spans that hold its last layer"
                    " (benchmarks/zero_bf16's ENDING)")
    args = ap.parse_args()
    models, precisions = args.models.split(","), args.precisions.split(",")
    try:
        zeros = tuple(int(z) for z in args.zero.split(","))
    except ValueError:
        zeros = ()
    if not set(models) <= set(SPANS) or not set(precisions) <= set(PRECISIONS) or not zeros \
            or not set(zeros) <= {2, 3}:
        raise SystemExit(f"--models {args.models!r}, --precisions {args.precisions!r}, --zero {args.zero!r}: give"
                         f" some of {list(SPANS)}, of {list(PRECISIONS)} and levels of 2, 3")
    store = ResultStore(WORK.parent / "results.json")
    done = [r for model in models for precision in precisions
            for r in measure(model, precision, store, zeros, args.data, ENDING[model] if args.ending else None)]
    print(table(done))


if __name__ == "__main__":
    main()
