"""The README's tables, from the results file."""

from __future__ import annotations

import math
from typing import Any

from hybridplan.plan import Plan
from hybridplan.report.tables import md_cell
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.settings import MEGATRON, SETTINGS
from benchmarks.paper_profiles import CAPACITY


def _gib(value: Any) -> str:
    return "" if value is None else format_bytes(value)


def print_tables(store: ResultStore) -> None:
    """The README's tables, from the results file."""
    models = sorted({k.split("/")[0] for k in store.records})
    fewest_order = ["capture", "+ data x tensor", "extended"]  # then the ZeRO row (the whole extension)
    records = dict(sorted(store.records.items(), key=lambda kv: (  # stable: otherwise in the order they were run
        kv[0].split("/")[2].startswith(MEGATRON),
        fewest_order.index(kv[0].split("/")[2]) if kv[0].split("/")[1] == "fewest" and kv[0].split("/")[2] in fewest_order
        else len(fewest_order))))
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
    zero1_savings(store)
    largest_rows = [(key, r) for key, r in records.items() if key.split("/")[1] == "largest"]
    if not largest_rows:
        return
    print()
    print("| model | space | largest width that fits | parameters | plan at that width | needs (predicted) |"
          " run on simulated devices | probes |")
    print("|---|---|---:|---:|---|---:|---|---:|")
    for key, r in largest_rows:
        m, _, space = key.split("/", 2)
        if "not run" in r:
            print(f"| {m} | {space} | not run: {md_cell(r['not run'])} | | | | | {len(r['probes'])} |")
            continue
        if "widest" not in r:  # interrupted: the bracket its probes so far give
            fit = max((int(w) for w, p in r["probes"].items() if p["fits"]), default=None)
            miss = min((int(w) for w, p in r["probes"].items() if not p["fits"] and (fit is None or int(w) > fit)),
                       default=None)
            at = r["probes"].get(str(fit), {})
            bracket = f"{fit} fits" + ("" if miss is None else f", {miss} does not")
            print(f"| {m} | {space} | search unfinished: {bracket} |"
                  f" {at.get('parameters', 0):,} | {md_cell(at.get('label') or '')} | {_gib(at.get('needed_bytes'))} |"
                  f" {_ran(at)} | {len(r['probes'])} |")
            continue
        at = r["probes"].get(str(r["widest"]), {})
        width = f"{r['widest']}{' or more' if r['at_least'] else ''} ({r['width_name']}; own {r['own_width']})"
        params = f"{r['parameters']:,}" if r.get("parameters") else ""
        print(f"| {m} | {space} | {width} | {params} | {md_cell(r.get('label') or '')} | {_gib(at.get('needed_bytes'))} |"
              f" {_ran(at)} | {len(r['probes'])} |")
    print()
    print("Every probe of the largest-model searches (in the order made; *needs*: what the space's lowest-memory plan")
    print("needs, predicted (the uniform plans: the first that fits, as in the fewest-devices column); none where no")
    print("plan of the space could be predicted; a width predicted to fit whose plan ran out of memory on the simulated")
    print("devices is not an answer, [Note: an answer refuted by its run] in largest.py):")
    print()
    print("| model | space | width | parameters | fits | needs (predicted) | plan |")
    print("|---|---|---:|---:|---|---:|---|")
    for key, r in largest_rows:
        m, _, space = key.split("/", 2)
        for w, p in r["probes"].items():
            fits = "yes" if p["fits"] else "no: predicted to fit, out of memory when run" if "refuted" in p else "no"
            fits += f" ({p['from']}'s probe)" if "from" in p else ""  # [Note: twins share their widths] (largest.py)
            print(f"| {m} | {space} | {w} | {p['parameters']:,} | {fits} |"
                  f" {_gib(p.get('needed_bytes'))} | {md_cell(p.get('label') or '')} |")



def _ran(probe: dict[str, Any]) -> str:
    """A largest-model answer's run on simulated devices: its status and measured peak (largest.py
    ``run_answer``), blank where not run."""
    ran = probe.get("simulated")
    if not ran:
        return ""
    return f"{ran['status']}, {_gib(ran.get('measured_peak_bytes'))}" if ran["status"] == "ok" else str(ran["status"])


ZERO1_BYTES_PER_PARAMETER = 12
"""What ZeRO-1 shards in bf16 mixed precision with AdamW, per parameter: the fp32 master copy and the two fp32
moments (runtime/sharding.py; predict/zero_layout.py ``ZeroLayout._state``); a device keeps ``1/dp`` of them."""


def _stage_parameters(model: str, plan: Plan) -> list[int] | None:
    """Per stage, the parameters one device holds (a tensor rank's shards), from the profile's recorded shapes
    (meta ``parameter_shapes``, ``tensor_shard_shapes``: ``[element size, *dims]`` per tensor); None without them."""
    from hybridplan.profiling.store import ProfileStore

    s = SETTINGS.get(model)
    if s is None or not s.db.exists():
        return None
    with ProfileStore(s.db, create=False) as store:
        whole, shards = store.get_meta("parameter_shapes"), store.get_meta("tensor_shard_shapes") or {}
    out = []
    for st in plan.stages:
        layers = whole if st.tensor_degree <= 1 else shards.get(str(st.tensor_degree))
        if layers is None:
            return None
        out.append(sum(math.prod(p[1:]) for layer in layers[st.start:st.stop] for p in layer or []))
    return out


def zero1_savings(store: ResultStore) -> None:
    """Per uniform 3D shape with data parallelism, its peak without ZeRO and with ZeRO-1 (simulated where both
    were run, else predicted), against ``12 B x parameters per device x (1 - 1/dp)`` (the stages' range)."""
    rows = []
    for key, with_zero in store.records.items():
        m, column, space = key.split("/", 2)
        if column != "peak" or space != f"{MEGATRON} + ZeRO-1" or f"{m}/peak/{MEGATRON}" not in store:
            continue
        without = {r["shape"]: r for r in store[f"{m}/peak/{MEGATRON}"]["rows"]}
        for row in with_zero["rows"]:
            old = without.get(row["shape"])
            if old is None or "plan" not in row:
                continue
            plan = Plan.from_dict(row["plan"])
            dp = max(st.data_degree for st in plan.stages)
            ran = [r.get("simulated", {}) for r in (old, row)]
            if all(sim.get("status") == "ok" for sim in ran):
                peaks, how = [sim["measured_peak_bytes"] for sim in ran], "simulated"
            else:
                peaks, how = [r.get("predicted_peak_bytes") for r in (old, row)], "predicted"
            if dp == 1 or None in peaks:
                continue
            params = _stage_parameters(m, plan)
            expected = "" if params is None else " to ".join(dict.fromkeys(  # the smallest stage's, the largest's
                _gib(ZERO1_BYTES_PER_PARAMETER * n * (1 - 1 / dp)) for n in (min(params), max(params))))
            rows.append(f"| {m} | {row['shape']} | {how} | {_gib(peaks[0])} | {_gib(peaks[1])} | {_gib(peaks[0] - peaks[1])} |"
                        f" {expected} |")
    if not rows:
        return
    print()
    print("| model | uniform shape | peaks | without ZeRO | with ZeRO-1 | less | 12 B x parameters per device x (1 - 1/dp) |")
    print("|---|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))
