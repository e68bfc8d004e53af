"""What the extended plan space buys at paper sizes, on simulated devices (issue 11, third target).

For each model, on the 4x4 mesh of 40 GiB devices of CAPTURE's evaluation (``--backend sim --device cuda
--precision bf16``: the real runtime's per-device work on fake tensors, CUDA allocator terms), three plan
spaces are compared:

- **CAPTURE**: stages pipeline-only, data- or tensor-parallel, each inside a node (``plan --space capture``);
- **extended**: also data x tensor stages, ZeRO-1/ZeRO-3 data stages, stages over whole nodes and, where a
  recompute profile exists, activation recompute per stage (``plan --space extended --zero --allow-cross-node
  --recompute-db``); each dimension is also added alone, in that order, to show what it contributes;
- **Megatron-style 3D**: the best uniform plan (``search/baselines.py`` ``uniform_3d_plan``: equal layer counts
  per stage, tensor inside a node, data across, ZeRO-1), over every (pp, tp, dp) of the mesh.

ZeRO is searched (and given to the uniform plans) only for fp32 settings: the runtime shards in fp32 only, so a
bf16 ZeRO plan could be neither run nor checked (:attr:`Setting.zero`). A plan whose degree is above the
profiled ones (a data x8 stage across nodes) is predicted by the degree fit, not from a measurement of that
degree; the uniform plans with such a degree are run on simulated devices and their measured peak stands.

Columns: the lowest predicted peak per space (each chosen plan also run on simulated devices: its measured
peak), the fewest devices per space (``plan --fewest-devices``, called through the command line so that the
column fills in once the extended dimensions are searched there; until then the refusal is recorded), and the
fastest plan that fits (AMP's search with memory predictions; layer times from FLOPs, as no GPU is lent).

Profiles (``work/``, git-ignored; resumable) are made with ``hybridplan profile`` as ``profile_commands``
prints them. Run from the repository root (resumable: each finished result is written to results.json)::

    .venv/bin/python -m benchmarks.extension_gain.run --models moe-1.3b
    .venv/bin/python -m benchmarks.extension_gain.run --table          # the README's tables only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hybridplan.errors import HybridPlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.predict.time_model import predict_iteration_time
from hybridplan.profiling.layer_costs import flop_time_profile, measure_layer_costs
from hybridplan.report.tables import md_cell
from hybridplan.search.baselines import uniform_3d_plan, uniform_3d_shapes
from hybridplan.search.memory.fewest import mesh_shapes
from hybridplan.search.time.throughput import search_throughput
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.plan_memory import plan_memory
from hybridplan.workflows.plan_throughput import fits_at_target
from hybridplan.workflows.runs import ResultStore, devices_json, measure_plan

from benchmarks.paper_profiles import CAPACITY, Case

HERE = Path(__file__).resolve().parent
MEGATRON = "megatron-3d"
"""The uniform 3D baseline's key (with ZeRO-1 where the setting has ZeRO: :attr:`Setting.zero`)."""
WORK = HERE / "work"


@dataclass(frozen=True)
class Setting:
    """A model's case, and which extra profiles it gets (ZeRO-3 scenarios; a recompute profile's scenarios)."""

    case: Case
    zero: bool
    """ZeRO stages in the extended space and the uniform 3D baseline (ZeRO-1), and the ZeRO-3 scenarios in the
    profile. Only in fp32: the runtime shards in fp32 only (runtime/config.py ``validate_config`` refuses ZeRO in
    bf16), so a bf16 ZeRO plan could be neither run nor checked."""
    recompute: tuple[str, ...]
    """Recompute profiles, each "all" (every scenario) or its scenarios ("pipeline": recompute is then predicted
    for single-device stages only); the last is the extended space's."""

    def __post_init__(self) -> None:
        if self.zero and self.case.precision != "fp32":
            raise SystemExit(f"{self.case.model}: ZeRO runs in fp32 only (runtime/config.py validate_config)")

    @property
    def db(self) -> Path:
        c = self.case
        return WORK / f"{c.model}-{c.mesh}-b{c.global_batch_size}-m{c.num_microbatches}-{c.precision}.sqlite"

    @property
    def recompute_db(self) -> Path | None:
        """The extended space's recompute profile (None: none)."""
        return self.recompute_dbs[-1] if self.recompute else None

    @property
    def recompute_dbs(self) -> list[Path]:
        return [self.db.with_name(self.db.stem + ("-recompute.sqlite" if r == "pipeline" else f"-recompute-{r}.sqlite"))
                for r in self.recompute]


# Micro-batches of Alpa's suites (GPT: 16 sequences, MoE: 32 sequences) in 16 micro-batches: the peak of a
# 1F1B plan depends on the micro-batch and the in-flight count (at most the stages), not on more micro-batches.
SETTINGS: dict[str, Setting] = {
    "moe-1.3b": Setting(Case("moe-1.3b", "4x4", 512, 16, "bf16"), zero=False, recompute=("pipeline", "all")),
    "gpt3-2.6b": Setting(Case("gpt3-2.6b", "4x4", 256, 16, "bf16", profile_capacity=CAPACITY), zero=False,
                         recompute=()),
    # a smoke run of the whole script in about a minute (not in the default --models)
    "gpt-tiny": Setting(Case("gpt-tiny", "2x2", 32, 4, "fp32"), zero=True, recompute=("pipeline",)),
}
DEFAULT_MODELS = ("moe-1.3b", "gpt3-2.6b")


def profile_commands(s: Setting) -> list[list[str]]:
    """The ``hybridplan profile`` argument lists that make the setting's profiles (resumable)."""
    c = s.case
    base = ["profile", "--model", c.model, "--cluster", c.mesh, "--global-batch-size", str(c.global_batch_size),
            "--num-microbatches", str(c.num_microbatches), "--backend", "sim", "--device", "cuda",
            "--precision", c.precision] + (["--device-memory", c.profile_capacity] if c.profile_capacity else [])
    out = [base + ["--db", str(s.db)] + (["--zero"] if s.zero else [])]
    for scenarios, db in zip(s.recompute, s.recompute_dbs):
        out.append(base + ["--activation-checkpointing"] + ([] if scenarios == "all" else ["--scenarios", scenarios])
                   + ["--db", str(db)])
    return out


def cli(argv: list[str]) -> tuple[int, str]:
    """Run ``hybridplan`` in this process; (exit code, its stderr)."""
    from hybridplan.cli import main as hybridplan

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = hybridplan(argv)
    return code, err.getvalue()


def label(plan: Plan) -> str:
    """``[0,4) data2xtensor2 zero1 rc | ...``: every dimension of every stage."""
    def one(s: Any) -> str:
        how = {"data+tensor": f"data{s.data_degree}xtensor{s.tensor_degree}"}.get(s.kind, f"{s.kind}{s.degree}")
        return f"[{s.start},{s.stop}) {how}" + (f" zero{s.zero}" if s.zero else "") + (" rc" if s.recompute != "none" else "")
    return " | ".join(one(s) for s in plan.stages)


def spaces(s: Setting) -> dict[str, dict[str, Any]]:
    """The memory searches, as :func:`plan_memory` options, CAPTURE's first and the whole extension last."""
    out: dict[str, dict[str, Any]] = {"capture": {}, "+ data x tensor": {"composite": True}}
    if s.zero:
        out["+ ZeRO-1/3"] = {"composite": True, "zero": True}
    out["+ across nodes"] = {"composite": True, "zero": s.zero, "cross_node": True}
    for scenarios, db in zip(s.recompute, s.recompute_dbs):
        which = "every stage kind" if scenarios == "all" else "single-device stages" if scenarios == "pipeline" else scenarios
        out[f"+ recompute ({which})"] = {**out["+ across nodes"], "recompute_db": db}
    return out


def predictor_for(s: Setting, plan: Plan, recompute_db: Path | None = None) -> MemoryPredictor:
    """The predictor of ``plan`` (with ``recompute_db``, default the extended space's, if a stage recomputes)."""
    uses_recompute = any(st.recompute != "none" for st in plan.stages)
    return MemoryPredictor.from_db(s.db, schedule=plan.schedule, global_batch_size=plan.global_batch_size,
                                   num_microbatches=plan.num_microbatches,
                                   recompute_db=(recompute_db or s.recompute_db) if uses_recompute else None)


def simulate(s: Setting, plan: Plan, cluster: Cluster, recompute_db: Path | None = None) -> dict[str, Any]:
    """The plan run on simulated devices of ``cluster``: per device, predicted (where the profile predicts it)
    and measured peaks."""
    started = time.perf_counter()
    m = measure_plan(s.db, plan, cluster=cluster, backend="sim")
    predicted: dict[int, int] = {}
    with contextlib.suppress(HybridPlanError):  # measure_plan predicts without the recompute profile
        predicted = {d.device: d.peak_memory_bytes for d in predictor_for(s, plan, recompute_db).predict(plan).devices}
    devices = [{**d, "predicted": predicted.get(d["device"], d["predicted"])} for d in devices_json(m.devices)]
    pred = [d["predicted"] for d in devices if d["predicted"] is not None]
    return {"status": m.status, "reason": m.reason, "devices": devices, "measured_peak_bytes": m.peak("measured"),
            "predicted_peak_bytes": max(pred) if len(pred) == len(devices) else None,
            "seconds": time.perf_counter() - started}


def lowest_peak(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """Per space, the plan of the lowest predicted peak, and its run on simulated devices."""
    name = s.case.model
    unlimited = s.case.cluster(memory=None)
    for space, options in spaces(s).items():
        key = f"{name}/peak/{space}"
        if key not in store:
            started = time.perf_counter()
            try:
                found = plan_memory(s.db, unlimited, **options)
            except HybridPlanError as e:
                store.put(key, {"error": str(e)})
                continue
            store.put(key, {"plan": found.plan.to_dict(), "label": label(found.plan),
                            "predicted_peak_bytes": found.prediction.peak_memory_bytes,
                            "needed_bytes": needed(found.prediction),
                            "search_seconds": time.perf_counter() - started})
        r = store[key]
        say(f"{name} {space}: {r.get('label', r.get('error'))}: predicted {format_bytes(r.get('predicted_peak_bytes'))}")
        if validate and "plan" in r and "simulated" not in r:
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), s.case.cluster(), options.get("recompute_db"))
            store.put(key, r)
            say(f"  simulated: {r['simulated']['status']}, measured {format_bytes(r['simulated']['measured_peak_bytes'])}")


def needed(prediction: Any) -> int:
    """The device memory a prediction says the plan needs: CUDA's total (tensors and what the allocator leaves
    out), what ``plan`` checks against ``--device-memory``."""
    return max(d.total_bytes if d.total_bytes is not None else d.peak_memory_bytes for d in prediction.devices)


def _optimizer_bytes(predictor: MemoryPredictor, plan: Plan) -> int:
    """The most AdamW state any stage of ``plan`` holds unsharded: more than ZeRO-1 can remove from a device."""
    layout = predictor.zero_layout
    if layout is None:
        return 0
    return max(layout.optimizer_bytes(st.start, st.stop, 0, 1, 0) for st in plan.stages)


def extrapolated(predictor: MemoryPredictor, plan: Plan) -> bool:
    """Whether a stage of ``plan`` has a data or tensor degree above the profiled ones (predicted by the degree fit,
    not from a measurement of that degree)."""
    top = {kind: max(predictor.profiled_degrees(kind), default=1) for kind in ("data", "tensor")}
    return any(st.data_degree > top["data"] or st.tensor_degree > top["tensor"] for st in plan.stages)


def peak_of(row: dict[str, Any]) -> int | None:
    """A row's peak: measured where it was run on simulated devices, else predicted."""
    sim = row.get("simulated")
    if sim:
        return sim["measured_peak_bytes"] if sim["status"] == "ok" else None
    return row.get("predicted_peak_bytes")


def megatron(s: Setting, cluster: Cluster, say: Callable[[str], None], *, by: str = "peak") -> dict[str, Any]:
    """Every uniform 3D plan on ``cluster`` (with its capacity) with its predicted peak, and the best ``by``
    "peak" (the lowest) or "fit" (the first found that fits: for the fewest devices).

    ZeRO-1 of a data x tensor stage is not predicted from a profile yet (predict/plan_checks.py refuses it), so such a
    plan is run on simulated devices when it could beat the best predicted one (or, ``by="fit"``, when none
    fits): when its peak predicted without ZeRO, less all the optimizer state of its largest stage (more than
    ZeRO-1 can remove), is lower. Its measured peak then stands for its prediction."""
    c, model = s.case, get_model(s.case.model)
    capacity = cluster.memory_of(0)
    rows: list[dict[str, Any]] = []
    for pp, tp, dp in uniform_3d_shapes(cluster, model.num_layers):
        row: dict[str, Any] = {"shape": f"pp{pp} tp{tp} dp{dp}"}
        rows.append(row)
        try:
            plan = uniform_3d_plan(num_layers=model.num_layers, cluster=cluster, pipeline=pp, tensor=tp,
                                   schedule=c.schedule, global_batch_size=c.global_batch_size,
                                   num_microbatches=c.num_microbatches, zero=1 if s.zero else 0)
            plan.validate(model=model, cluster=cluster)
        except HybridPlanError as e:
            row["invalid"] = e.message
            continue
        row["plan"], row["label"] = plan.to_dict(), label(plan)
        predictor = predictor_for(s, plan)
        if extrapolated(predictor, plan):
            row["extrapolated"] = True
        try:
            prediction = predictor.predict(plan)
            row["predicted_peak_bytes"], row["needed_bytes"] = prediction.peak_memory_bytes, needed(prediction)
        except HybridPlanError as e:  # ZeRO-1 of data x tensor stages
            row["unpredicted"] = e.message
            d = plan.to_dict()
            unsharded = Plan.from_dict({**d, "stages": [{**st, "zero": 0} for st in d["stages"]]})
            try:
                row["bound_bytes"] = predictor.predict(unsharded).peak_memory_bytes - _optimizer_bytes(predictor, plan)
            except HybridPlanError as e2:
                row["invalid"] = e2.message
    for r in rows:  # a degree beyond the profiled ones is extrapolated (MoE 1.3B data x8: 34% under): measure it
        if r.get("extrapolated") and "predicted_peak_bytes" in r:
            say(f"  simulating {r['label']} on {cluster.shape} (a degree beyond the profiled ones)")
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
    predicted = [{**r, "predicted_peak_bytes": peak_of(r)} for r in rows if peak_of(r) is not None]
    if by == "fit":
        fitting = [r for r in predicted if capacity is None or (r["simulated"]["status"] == "ok" if "simulated" in r
                                                                else r["needed_bytes"] <= capacity)]
        best = fitting[0] if fitting else None
        bar = float("inf") if best is None else -1.0  # one that fits is enough
    else:
        best = min(predicted, key=lambda r: r["predicted_peak_bytes"], default=None)
        bar = float("inf") if best is None else best["predicted_peak_bytes"]
    for r in sorted((r for r in rows if "bound_bytes" in r), key=lambda r: r["bound_bytes"]):
        if r["bound_bytes"] >= bar or (capacity is not None and r["bound_bytes"] > capacity):  # the tensors alone
            r["pruned"] = True
            continue
        say(f"  simulating {r['label']} on {cluster.shape} (ZeRO-1 of data x tensor stages is not predicted)")
        r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
        peak = r["simulated"]["measured_peak_bytes"]
        if r["simulated"]["status"] == "ok" and peak is not None and (by == "fit" or peak < bar):
            best, bar = r, (-1.0 if by == "fit" else peak)
            if by == "fit":
                break
    fits = best is not None and ("needed_bytes" in best and (capacity is None or best["needed_bytes"] <= capacity)
                                 or best.get("simulated", {}).get("status") == "ok")
    return {"rows": rows, "best": None if best is None else best["shape"], "fits": fits}


def megatron_lowest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    key = f"{s.case.model}/peak/{MEGATRON}"
    if key not in store:
        started = time.perf_counter()
        r = megatron(s, s.case.cluster(), say)
        r["search_seconds"] = time.perf_counter() - started
        store.put(key, r)
    r = store[key]
    best = next((row for row in r["rows"] if row["shape"] == r["best"]), None)
    if validate and best is not None and "simulated" not in best:
        best["simulated"] = simulate(s, Plan.from_dict(best["plan"]), s.case.cluster())
        store.put(key, r)
    if best is not None:
        say(f"{s.case.model} megatron-3d: {best['label']}: predicted {format_bytes(best.get('predicted_peak_bytes'))},"
            f" measured {format_bytes(best.get('simulated', {}).get('measured_peak_bytes'))}")


def fewest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The fewest devices per space: ``hybridplan plan --fewest-devices`` (refused today with the extension's
    zero, cross-node and recompute dimensions: the refusal is recorded), and the uniform 3D plans' by trying
    the same sub-meshes in the same order."""
    c = s.case
    base = ["plan", "--db", str(s.db), "--cluster", c.mesh, "--device-memory", CAPACITY, "--fewest-devices"]
    runs = {"capture": [], "+ data x tensor": ["--space", "extended"],
            "extended": ["--space", "extended", "--allow-cross-node"] + (["--zero"] if s.zero else [])
            + (["--recompute-db", str(s.recompute_db)] if s.recompute_db is not None else [])}
    for space, extra in runs.items():
        key = f"{c.model}/fewest/{space}"
        if key in store and "not run" not in store[key]:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            started = time.perf_counter()
            code, err = cli(base + extra + ["--out", str(out)])
            seconds = time.perf_counter() - started
            if code == 0:
                plan = Plan.from_dict(json.loads(out.read_text()))
                store.put(key, {"devices": sum(st.degree for st in plan.stages), "mesh": plan.extra.get("cluster"),
                                "label": label(plan), "plan": plan.to_dict(), "predicted_peak_bytes": plan.extra.get("predicted_peak_bytes"),
                                "command": "hybridplan " + " ".join(base + extra), "seconds": seconds})
            else:
                store.put(key, {"not run": " ".join(line.strip() for line in err.strip().splitlines()) or f"exit code {code}",
                                "command": "hybridplan " + " ".join(base + extra)})
        say(f"{c.model} fewest {space}: {store[key]}")
    key = f"{c.model}/fewest/{MEGATRON}"
    if key not in store:
        full = c.cluster()
        for n, k in mesh_shapes(full.num_nodes, full.devices_per_node):
            r = megatron(s, full.with_shape(n, k), say, by="fit")
            if r["fits"]:
                store.put(key, {"devices": n * k, "mesh": f"{n}x{k}", "best": r["best"],
                                "row": next(row for row in r["rows"] if row["shape"] == r["best"])})
                break
        else:
            store.put(key, {"devices": None, "why": f"no uniform 3D plan fits any sub-mesh of {full.shape}"})
    say(f"{c.model} fewest megatron-3d: {store[key].get('mesh')}")
    if validate:  # each answer run on its sub-mesh of 40 GiB devices
        for key, r in list(store.records.items()):
            plan_dict = r.get("plan") or r.get("row", {}).get("plan")
            if key.startswith(f"{c.model}/fewest/") and plan_dict and r.get("mesh") and "simulated" not in r:
                r["simulated"] = simulate(s, Plan.from_dict(plan_dict), Cluster.parse(r["mesh"], device_memory=CAPACITY))
                store.put(key, r)
                say(f"  {key}: run {r['simulated']['status']}, measured {format_bytes(r['simulated']['measured_peak_bytes'])}")


def fastest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The fastest plan that fits 40 GiB: AMP's search (CAPTURE's stages inside a node; extended: data x tensor
    stages, replicas across nodes) and the fastest uniform 3D ZeRO-1 plan that fits, all timed by the AMP cost
    model from per-layer FLOPs (no GPU to measure layer times)."""
    c = s.case
    model = get_model(c.model)
    cluster = c.cluster()
    capacity = parse_bytes(CAPACITY)
    profile = flop_time_profile(model, measure_layer_costs(model, precision=c.precision), precision=c.precision)
    predictor = MemoryPredictor.from_db(s.db, schedule=c.schedule)
    for space, composite in (("capture", False), ("extended (AMP dp x tp)", True)):
        key = f"{c.model}/fastest/{space}"
        if key not in store:
            started = time.perf_counter()
            try:
                found = search_throughput(profile, cluster, c.global_batch_size, schedule=c.schedule,
                                          node_local_stages=True, composite=composite,
                                          memory_ok=fits_at_target(predictor, model, cluster, capacity))
                best = found.best
                prediction = predictor.predict(best.plan)
                store.put(key, {"plan": best.plan.to_dict(), "label": label(best.plan), "seconds_per_iteration":
                                best.iteration_s, "predicted_peak_bytes": prediction.peak_memory_bytes,
                                "needed_bytes": needed(prediction), "evaluated": found.evaluated,
                                "search_seconds": time.perf_counter() - started})
            except HybridPlanError as e:
                store.put(key, {"error": e.message})
        r = store[key]
        if validate and "plan" in r and "simulated" not in r:
            r["simulated"] = simulate(s, Plan.from_dict(r["plan"]), cluster)
            store.put(key, r)
        say(f"{c.model} fastest {space}: {r.get('label', r.get('error'))} {r.get('seconds_per_iteration')}")
    key = f"{c.model}/fastest/{MEGATRON}"
    if key not in store:
        rows = store[f"{c.model}/peak/{MEGATRON}"]["rows"]
        timed = []
        for row in rows:
            ok = (row.get("needed_bytes", capacity + 1) <= capacity
                  or row.get("simulated", {}).get("status") == "ok")
            if "plan" in row and ok:
                plan = Plan.from_dict(row["plan"])
                timed.append((predict_iteration_time(plan, profile, cluster).total_s, row["shape"], row["label"],
                              row.get("predicted_peak_bytes"), row.get("simulated", {}).get("measured_peak_bytes")))
        unknown = [row["shape"] for row in rows if "bound_bytes" in row and "simulated" not in row]
        best_t = min(timed, default=None)
        store.put(key, {"seconds_per_iteration": None if best_t is None else best_t[0],
                        "shape": None if best_t is None else best_t[1], "label": None if best_t is None else best_t[2],
                        "predicted_peak_bytes": None if best_t is None else best_t[3],
                        "simulated": {} if best_t is None or best_t[4] is None else {"measured_peak_bytes": best_t[4]},
                        "fitting": len(timed), "not_known_to_fit": unknown})
    say(f"{c.model} fastest megatron-3d: {store[key]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"of {list(SETTINGS)}")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    ap.add_argument("--no-validate", action="store_true", help="skip the simulated runs of the chosen plans")
    ap.add_argument("--table", action="store_true", help="only print the tables from the results")
    ap.add_argument("--recompute-profiles", help="comma-separated subset of the settings' recompute profiles to use"
                    " (e.g. 'pipeline' while the others are still being profiled)")
    ap.add_argument("--no-profile", action="store_true", help="use the profiles as they are (made beforehand with"
                    " the commands this script prints), without resuming them")
    args = ap.parse_args()
    store = ResultStore(args.results)
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    if not args.table:
        from hybridplan.cli import main as hybridplan

        for name in args.models.split(","):
            s = SETTINGS[name]
            if args.recompute_profiles is not None:
                s = replace(s, recompute=tuple(r for r in s.recompute if r in args.recompute_profiles.split(",")))
            for argv in profile_commands(s):
                say("hybridplan " + " ".join(argv))
                if not args.no_profile and hybridplan(argv) != 0:
                    raise SystemExit(f"profiling {name} failed")
            lowest_peak(s, store, say, not args.no_validate)
            megatron_lowest(s, store, say, not args.no_validate)
            fewest(s, store, say, not args.no_validate)
            fastest(s, store, say, not args.no_validate)
    print_tables(store)


def _gib(value: Any) -> str:
    return "" if value is None else format_bytes(value)


def print_tables(store: ResultStore) -> None:
    """The README's tables, from the results file."""
    models = sorted({k.split("/")[0] for k in store.records})
    fewest_order = ["capture", "+ data x tensor", "extended", MEGATRON]
    records = dict(sorted(store.records.items(), key=lambda kv: (
        kv[0].split("/")[2] == MEGATRON,
        fewest_order.index(kv[0].split("/")[2]) if kv[0].split("/")[1] == "fewest" and kv[0].split("/")[2] in fewest_order else 0)))
    capacity = parse_bytes(CAPACITY)
    print("| model | space | plan of the lowest predicted peak | predicted peak | simulated peak | needs (predicted) |"
          " fits 40 GiB | search |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for m in models:
        for key, r in records.items():
            if not key.startswith(f"{m}/peak/"):
                continue
            space = key.split("/", 2)[2]
            if "error" in r:
                print(f"| {m} | {space} | {md_cell(r['error'])} | | | | | |")
                continue
            if "rows" in r:  # the uniform 3D plans
                row = next((row for row in r["rows"] if row["shape"] == r["best"]), None)
                if row is None:
                    print(f"| {m} | {space} | no valid uniform plan | | | | | |")
                    continue
                what = f"{row['shape']}: {row['label']}"
            else:
                row, what = r, r["label"]
            sim = row.get("simulated", {})
            need = row.get("needed_bytes")
            fits = ("yes" if need <= capacity else "no") if need is not None else ""
            if sim:
                fits += f" (run: {sim['status']})"
            print(f"| {m} | {space} | {md_cell(what)} | {_gib(row.get('predicted_peak_bytes')) or 'not predicted'} |"
                  f" {_gib(sim.get('measured_peak_bytes'))} | {_gib(need)} | {fits} | {r['search_seconds']:.2f} s |")
    print()
    print("| model | space | fewest devices | mesh | plan | predicted peak | simulated peak (run on 40 GiB) |")
    print("|---|---|---:|---|---|---:|---:|")
    for m in models:
        for key, r in records.items():
            if key.startswith(f"{m}/fewest/"):
                space = key.split("/", 2)[2]
                if "not run" in r:
                    print(f"| {m} | {space} | not run: {md_cell(r['not run'])} | | | | |")
                else:
                    plan = r.get("label") or (r.get("row", {}).get("label") if r.get("row") else r.get("why", ""))
                    sim = r.get("simulated", {})
                    pred = r.get("predicted_peak_bytes") or r.get("row", {}).get("predicted_peak_bytes")
                    ran = f"{_gib(sim.get('measured_peak_bytes'))} ({sim['status']})" if sim else ""
                    print(f"| {m} | {space} | {r['devices']} | {r.get('mesh') or ''} | {md_cell(plan or '')} | {_gib(pred)} |"
                          f" {ran} |")
    print()
    print("| model | space | fastest plan that fits | s / iteration (FLOP model) | samples / s | predicted peak | simulated peak |")
    print("|---|---|---|---:|---:|---:|---:|")
    for m in models:
        gbs = next((Plan.from_dict(r["plan"]).global_batch_size for k, r in records.items()
                    if k.startswith(f"{m}/peak/") and "plan" in r), None)
        for key, r in records.items():
            if not key.startswith(f"{m}/fastest/"):
                continue
            space = key.split("/", 2)[2]
            t = r.get("seconds_per_iteration")
            if t is None:
                print(f"| {m} | {space} | {md_cell(r.get('error', 'no plan known to fit'))} | | | | |")
                continue
            rate = f"{gbs / t:.4g}" if gbs else ""
            plan = r["label"] if "shape" not in r else f"{r['shape']}: {r['label']}"
            print(f"| {m} | {space} | {md_cell(plan)} | {t:.4g} | {rate} | {_gib(r.get('predicted_peak_bytes'))} |"
                  f" {_gib(r.get('simulated', {}).get('measured_peak_bytes'))} |")


if __name__ == "__main__":
    main()
