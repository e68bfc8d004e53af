"""How a recomputed stage is predicted: the layer-max rule against the chain composition it replaced, and the runtime.

docs/prediction.md section 6 (recompute chosen per stage) and [Note: the transients of a recomputed stage] in
src/hybridplan/profiling/recomputed_spans.py: under full recompute a stage's transients are maxima over its layers,
which the predictor now composes from the layers measured alone, where it used to sum chain increments ``M_a``.
For recomputed spans of moe-tiny (data x2, tensor x2), wresnet-tiny (tensor x2; boundaries of different sizes) and
gpt-tiny (data x2 and pipeline-only, stages that hold the head and loss), 2x4, global batch 64 in 4 micro-batches,
fp32, simulated devices, it prints per transient and for the stage peak: what the simulated runtime measures, what
the predictor gives from the recompute profile (the rule), what the chain composition gave (the same statistics
composed as ``M_i(a) + sum M_a``, as before the rule), and the rule applied to the layers measured alone at the
target batch (so that the rule's own error and the batch scaling's are told apart). With ``--extension-db`` it
also predicts benchmarks/extension_gain's two recomputed MoE 1.3B plans, without running anything, next to the
simulated peaks stored in benchmarks/extension_gain/results.json and the predictions stored with them.

Command (a few minutes on the shared 2-core machine, the profiles included; resumes the profiles):

    .venv/bin/python -m benchmarks.recompute_composition.run
    .venv/bin/python -m benchmarks.recompute_composition.run --extension-db PATH/moe-1.3b-4x4-b512-m16-bf16-recompute-all.sqlite
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from hybridplan.models.boundaries import boundary_specs
from hybridplan.models.zoo import resolve_model
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.quantities import INDEX, quantities_from_timeline
from hybridplan.profiling.recomputed_spans import layer_max_table
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.sim import simulate_stage
from hybridplan.workflows.runs import ensure_profile

HERE = Path(__file__).parent
BATCH, MICRO = 64, 4
LAYERS = {"moe-tiny": 6, "wresnet-tiny": 7, "gpt-tiny": 10}
SPANS = {("moe-tiny", "data", 2): [(1, 4), (0, 3), (2, 5), (1, 5), (3, 6), (0, 6)],
         ("moe-tiny", "tensor", 2): [(1, 4), (2, 5), (1, 5)],
         ("wresnet-tiny", "tensor", 2): [(0, 4), (1, 4), (3, 7)],
         ("wresnet-tiny", "none", 1): [(2, 6), (3, 7)],
         ("gpt-tiny", "data", 2): [(7, 10), (4, 9), (9, 10)],
         ("gpt-tiny", "none", 1): [(6, 10)]}
"""Multi-layer recomputed spans per model and stage kind: moe-tiny's layers 1 and 3 are MoE layers, 2 and 4 dense
ones; wresnet-tiny's layers change width and resolution (its boundaries differ in size); gpt-tiny's last layer is
the head and loss, whose activation is more than its input."""
SCENARIOS = {"moe-tiny": (Scenario("none", 1), Scenario("data", 2), Scenario("tensor", 2)),
             "wresnet-tiny": (Scenario("none", 1), Scenario("tensor", 2)),
             "gpt-tiny": (Scenario("none", 1), Scenario("data", 2))}
TRANSIENTS = ("forward_transient", "first_backward_transient", "backward_transient", "step_transient")



def measure(model: str, a: int, b: int, kind: str, degree: int) -> tuple[np.ndarray, int]:
    """Quantities of the recomputed stage [a, b) of ``kind`` x ``degree`` on simulated devices, and its stages_after
    (pipeline-only stages before and after it, so that it sits inside a pipeline as in a plan)."""
    stages: list[dict] = []
    if a > 0:
        stages.append({"layers": [0, a], "parallelism": "none", "degree": 1, "devices": [0]})
    index, first = len(stages), len(stages)
    stages.append({"layers": [a, b], "parallelism": kind, "degree": degree, "recompute": "full",
                   "devices": list(range(first, first + degree))})
    if b < LAYERS[model]:
        stages.append({"layers": [b, LAYERS[model]], "parallelism": "none", "degree": 1, "devices": [first + degree]})
    plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": BATCH, "num_microbatches": MICRO, "stages": stages})
    devices = sum(s["degree"] for s in stages)
    cfg = RunConfig(model=model, plan=plan, cluster=Cluster.parse(f"1x{devices}"), backend="sim", iterations=2)
    report = simulate_stage(cfg, index, iterations=2, specs=boundary_specs(resolve_model(model)), rank=first)
    return quantities_from_timeline(report.static[-1], report.data[-1], report.timeline), len(stages) - 1 - index


def chain_composed(predictor: MemoryPredictor) -> MemoryPredictor:
    """The same profile composed by chain increments (``M_i(a) + sum M_a``), as the predictor did before the rule."""
    stats = {key: [dataclasses.replace(s, recompute=False) for s in sizes] for key, sizes in predictor.stats.items()}
    return MemoryPredictor(stats, num_layers=predictor.num_layers, schedule="1f1b", global_batch_size=BATCH,
                           num_microbatches=MICRO, recompute=True)


def tiny(work: Path) -> list[str]:
    """The tiny models' table (markdown lines)."""
    predictors = {}
    for model, scenarios in SCENARIOS.items():
        db = ensure_profile(work / f"{model}-2x4-recompute.sqlite", model=model, cluster=Cluster.parse("2x4"),
                            global_batch_size=BATCH, num_microbatches=MICRO, progress=print, scenarios=scenarios,
                            run_options={"backend": "sim", "activation_checkpointing": True})
        predictors[model] = MemoryPredictor.from_db(db, schedule="1f1b", global_batch_size=BATCH,
                                                    num_microbatches=MICRO)
    lines = ["| stage | quantity | measured | predicted (layer-max rule) | chain composition (before) | "
             "rule on the layers measured alone |", "|---|---|---:|---:|---:|---:|"]
    for (model, kind, degree), spans in SPANS.items():
        predictor, before = predictors[model], chain_composed(predictors[model])
        alone = np.array([measure(model, l, l + 1, kind, degree)[0] for l in range(LAYERS[model])])
        ruled_alone = layer_max_table(alone)
        for a, b in spans:
            measured, after = measure(model, a, b, kind, degree)
            predicted, composed = (p.span_quantities(a, b, kind, degree) for p in (predictor, before))
            if predicted is None or composed is None:
                raise SystemExit(f"the profile cannot compose [{a},{b}) {kind}{degree}")
            ruled = measured.copy()  # the additive quantities as measured: only the transients are the rule's
            ruled[[INDEX[n] for n in TRANSIENTS]] = ruled_alone[a, b]
            where = f"{model} [{a},{b}) {kind} x{degree}"
            for name, i in ((n, INDEX[n]) for n in TRANSIENTS):
                lines.append(f"| {where} | {name} | {measured[i]:,.0f} | {predicted[i]:,.0f} | {composed[i]:,.0f} | "
                             f"{ruled[i]:,.0f} |")
            peaks = [stage_peak(q[:8], "1f1b", after, MICRO) for q in (measured, predicted, composed, ruled)]
            lines.append(f"| {where} | **peak** (1F1B, {after} stages after) | "
                         + " | ".join(f"{p:,.0f}" for p in peaks) + " |")
    return lines


EXTENSION_PLANS = ("moe-1.3b/peak/+ recompute (every stage kind)", "moe-1.3b/fewest/extended")
"""benchmarks/extension_gain's plans whose stages all recompute (results.json keys)."""


def extension(db: Path) -> list[str]:
    """benchmarks/extension_gain's recomputed MoE 1.3B plans predicted now, against the simulated peaks and the
    predictions stored with them (GiB of the device's whole memory, as results.json has them), no run."""
    stored = json.loads((HERE.parent / "extension_gain" / "results.json").read_text())
    lines = ["| plan | stage | simulated | predicted then (results.json) | predicted now | error then | error now |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key in EXTENSION_PLANS:
        lines += _extension_plan(db, key, stored[key])
    return lines


def _extension_plan(db: Path, key: str, entry: dict) -> list[str]:
    plan = Plan.from_dict({k: v for k, v in entry["plan"].items() if k in ("schedule", "global_batch_size",
                                                                           "num_microbatches", "stages")})
    predictor = MemoryPredictor.from_db(db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                        num_microbatches=plan.num_microbatches)
    now = {d.stage: d.peak_memory_bytes for d in predictor.predict(plan).devices}
    then = {d["stage"]: d for d in entry["simulated"]["devices"]}
    gib = 2.0 ** 30
    lines = []
    for index, stage in enumerate(plan.stages):
        measured, before = then[index]["measured"], then[index]["predicted"]
        lines.append(f"| {key} | [{stage.start},{stage.stop}) {stage.parallelism}{stage.degree} | {measured / gib:.3f} | "
                     f"{before / gib:.3f} | {now[index] / gib:.3f} | {(before - measured) / measured:+.1%} | "
                     f"{(now[index] - measured) / measured:+.1%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work", help="where the profiles are kept")
    parser.add_argument("--extension-db", type=Path, default=None,
                        help="benchmarks/extension_gain's MoE 1.3B recompute profile (recompute-all)")
    args = parser.parse_args()
    lines = tiny(args.work)
    if args.extension_db is not None:
        lines += [""] + extension(args.extension_db)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
