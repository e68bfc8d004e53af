"""Where the prediction of a recomputed stage goes wrong: composed span statistics against the simulated runtime.

A diagnosis, not a fix (docs/prediction.md section 6, "Known limit" of recompute chosen per stage). For
recomputed spans of moe-tiny (data x2 and tensor x2, 2x4, global batch 64 in 4 micro-batches, fp32, simulated
devices) it prints, per transient quantity: what the simulated runtime measures for the span, what the predictor
composes from the recompute profile (``MemoryPredictor.span_quantities``: ``M_i(a) + sum M_a``), and what the
*layer-max rule* below gives from the span's single layers (measured alone at the target batch, and as the profile
predicts them alone). With ``--extension-db`` it also gives, without running anything, the stage peaks the
predictor composes for benchmarks/extension_gain's "+ recompute (every stage kind)" plan of MoE 1.3B and those the
rule gives, next to the simulated peaks stored in benchmarks/extension_gain/results.json.

The layer-max rule (what full recompute makes of a stage; derived from the runtime's checkpointing, checked here):
inside a recomputed stage only each layer's input survives between its forward and its backward, so a transient
of the stage is the largest transient of one of its layers on the level the other layers leave at that moment:

- forward:  ``max_l FT_l + sum_{k<l} A_k``  (earlier layers keep their inputs);
- first backward: ``max_l FBT_l + sum_{k>l} G_k - sum_{k>l+1} A_k``  (later layers' gradients allocated, their
  kept inputs freed but the one that becomes l's output gradient);
- later backward: ``max_l BT_l - sum_{k>l+1} A_k``;
- step: ``max_l ST_l`` (AdamW's per-tensor temporaries);

with ``A, G, FT, FBT, BT, ST`` the layer's activation, gradient and transients measured alone.

Command (about 1.5 min on the shared 2-core machine, the profile included; resumes the profile):

    .venv/bin/python -m benchmarks.recompute_composition.run
    .venv/bin/python -m benchmarks.recompute_composition.run --extension-db PATH/moe-1.3b-4x4-b512-m16-bf16-recompute-all.sqlite
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hybridplan.models.boundaries import boundary_specs
from hybridplan.models.zoo import resolve_model
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.partitions import Scenario
from hybridplan.profiling.quantities import INDEX, quantities_from_timeline
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.sim import simulate_stage
from hybridplan.workflows.runs import ensure_profile

HERE = Path(__file__).parent
BATCH, MICRO = 64, 4
LAYERS = {"moe-tiny": 6, "wresnet-tiny": 7}
SPANS = {("moe-tiny", "data", 2): [(1, 4), (0, 3), (2, 5), (1, 5), (3, 6), (0, 6)],
         ("moe-tiny", "tensor", 2): [(1, 4), (2, 5), (1, 5)],
         ("wresnet-tiny", "tensor", 2): [(0, 4), (1, 4)]}
"""Multi-layer recomputed spans per model and stage kind: moe-tiny's layers 1 and 3 are MoE layers, 2 and 4 dense
ones; wresnet-tiny's layers change width and resolution (its boundaries differ in size)."""
SCENARIOS = {"moe-tiny": (Scenario("none", 1), Scenario("data", 2), Scenario("tensor", 2)),
             "wresnet-tiny": (Scenario("none", 1), Scenario("tensor", 2))}
TRANSIENTS = ("forward_transient", "first_backward_transient", "backward_transient", "step_transient")
A, G = INDEX["activation"], INDEX["gradient"]
FT, FBT, BT, ST = (INDEX[n] for n in TRANSIENTS)


def layer_max(alone: list[np.ndarray]) -> np.ndarray:
    """A recomputed stage's quantities from its layers' alone (module docstring): sums, and transients as maxima."""
    qs = [np.asarray(q[:8], dtype=float) for q in alone]
    n = len(qs)
    out = np.sum(qs, axis=0)
    out[FT] = max(qs[l][FT] + sum(qs[k][A] for k in range(l)) for l in range(n))
    out[FBT] = max(qs[l][FBT] + sum(qs[k][G] for k in range(l + 1, n)) - sum(qs[k][A] for k in range(l + 2, n))
                   for l in range(n))
    out[BT] = max(qs[l][BT] - sum(qs[k][A] for k in range(l + 2, n)) for l in range(n))
    out[ST] = max(q[ST] for q in qs)
    return out


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


def tiny(work: Path) -> list[str]:
    """The tiny models' table (markdown lines)."""
    predictors = {}
    for model, scenarios in SCENARIOS.items():
        db = ensure_profile(work / f"{model}-2x4-recompute.sqlite", model=model, cluster=Cluster.parse("2x4"),
                            global_batch_size=BATCH, num_microbatches=MICRO, progress=print, scenarios=scenarios,
                            run_options={"backend": "sim", "activation_checkpointing": True})
        predictors[model] = MemoryPredictor.from_db(db, schedule="1f1b", global_batch_size=BATCH,
                                                    num_microbatches=MICRO)
    lines = ["| stage | quantity | measured | composed (predictor) | layer-max of measured layers | "
             "layer-max of the profile's layers |", "|---|---|---:|---:|---:|---:|"]
    for (model, kind, degree), spans in SPANS.items():
        predictor = predictors[model]
        alone = {l: measure(model, l, l + 1, kind, degree)[0] for l in range(LAYERS[model])}
        for a, b in spans:
            measured, after = measure(model, a, b, kind, degree)
            composed = predictor.span_quantities(a, b, kind, degree)
            if composed is None:
                raise SystemExit(f"the profile cannot compose [{a},{b}) {kind}{degree}")
            ruled = layer_max([alone[l] for l in range(a, b)])
            profiled = [predictor.span_quantities(l, l + 1, kind, degree) for l in range(a, b)]
            from_profile = layer_max([q for q in profiled if q is not None])
            for name, i in ((n, INDEX[n]) for n in TRANSIENTS):
                lines.append(f"| {model} [{a},{b}) {kind} x{degree} | {name} | {measured[i]:,.0f} | {composed[i]:,.0f} | "
                             f"{ruled[i]:,.0f} | {from_profile[i]:,.0f} |")
            peaks = [stage_peak(q[:8], "1f1b", after, MICRO) for q in (measured, composed, ruled, from_profile)]
            lines.append(f"| {model} [{a},{b}) {kind} x{degree} | **peak** (1F1B, {after} stages after) | "
                         + " | ".join(f"{p:,.0f}" for p in peaks) + " |")
    return lines + [""] + chains(predictors["moe-tiny"], "data", 2)


def chains(predictor: MemoryPredictor, kind: str, degree: int) -> list[str]:
    """The profiled spans and the per-layer forward-transient statistics ``M_i``/``M_a`` they give (markdown)."""
    lines = []
    for stats in predictor.stats[(kind, degree)]:
        lines.append(f"{kind}{degree} at micro-batch {stats.microbatch_size}: profiled spans {sorted(stats.spans)}; "
                     f"forward transient M_i {[int(v) for v in stats.mi[:, FT]]}, M_a {[int(v) for v in stats.ma[1:, FT]]}"
                     " (layers 1..)")
    return lines


EXTENSION_PLANS = ("moe-1.3b/peak/+ recompute (every stage kind)", "moe-1.3b/fewest/extended")
"""benchmarks/extension_gain's plans whose stages all recompute (results.json keys)."""


def extension(db: Path) -> list[str]:
    """benchmarks/extension_gain's recomputed MoE 1.3B plans: composed and layer-max stage peaks (GiB), no run."""
    stored = json.loads((HERE.parent / "extension_gain" / "results.json").read_text())
    lines = ["| plan | stage | composed forward transient | its layers' largest alone | composed tensor peak | "
             "layer-max tensor peak | layer-max - composed | simulated - predicted (results.json) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key in EXTENSION_PLANS:
        lines += _extension_plan(db, key, stored[key])
    return lines


def _extension_plan(db: Path, key: str, entry: dict) -> list[str]:
    plan = Plan.from_dict({k: v for k, v in entry["plan"].items() if k in ("schedule", "global_batch_size",
                                                                           "num_microbatches", "stages")})
    predictor = MemoryPredictor.from_db(db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                        num_microbatches=plan.num_microbatches)
    by_stage = {d["stage"]: d for d in entry["simulated"]["devices"]}
    gib = 2.0 ** 30
    lines = []
    for index, stage in enumerate(plan.stages):
        kind, degree = stage.parallelism, stage.degree
        composed = predictor.span_quantities(stage.start, stage.stop, kind, degree)
        alone = [predictor.span_quantities(l, l + 1, kind, degree) for l in range(stage.start, stage.stop)]
        if composed is None or any(q is None for q in alone):
            raise SystemExit(f"the profile cannot compose stage {index} ([{stage.start},{stage.stop}) {kind}{degree})"
                             " or one of its layers alone")
        ruled = layer_max([q for q in alone if q is not None])
        ruled[:4] = composed[:4]  # the additive part as composed (the profile's per-device workspaces included)
        after = plan.num_stages - 1 - index
        p_c, p_r = (stage_peak(q[:8], plan.schedule, after, plan.num_microbatches) for q in (composed, ruled))
        d = by_stage[index]
        lines.append(f"| {key} | [{stage.start},{stage.stop}) {kind}{degree} | {composed[FT] / gib:.3f} GiB | "
                     f"{max(q[FT] for q in alone if q is not None) / gib:.3f} GiB | {p_c / gib:.3f} GiB | {p_r / gib:.3f} GiB | "
                     f"{(p_r - p_c) / gib:+.3f} GiB | {(d['measured'] - d['predicted']) / gib:+.3f} GiB |")
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
