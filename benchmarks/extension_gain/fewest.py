"""The fewest devices per space."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hybridplan.plan import Cluster, Plan
from hybridplan.search.memory.fewest import mesh_shapes
from hybridplan.units import format_bytes
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.megatron import megatron
from benchmarks.extension_gain.plans import cli, label, simulate
from benchmarks.extension_gain.settings import ROOT, Setting, uniform_baselines
from benchmarks.paper_profiles import CAPACITY

def fewest(s: Setting, store: ResultStore, say: Callable[[str], None], validate: bool) -> None:
    """The fewest devices per space: ``hybridplan plan --fewest-devices`` (a refusal is recorded; so is an answer
    outside the setting's ZeRO levels: :meth:`Setting.unsearched_zero`), and the uniform 3D plans' (without ZeRO,
    and with ZeRO-1 where searched) by trying the same sub-meshes in the same order."""
    c = s.case
    base = ["plan", "--db", str(s.db), "--cluster", c.mesh, "--device-memory", CAPACITY, "--fewest-devices"]
    extended = (["--space", "extended", "--allow-cross-node"]
                + (["--recompute-db", str(s.recompute_db)] if s.recompute_db is not None else []))
    runs = {"capture": [], "+ data x tensor": ["--space", "extended"], "extended": extended}
    if s.zero_space is not None:  # the whole extension (spaces()'s last row)
        runs[s.zero_space] = extended + ["--zero"]
    for space, extra in runs.items():
        key = f"{c.model}/fewest/{space}"
        command = "hybridplan " + " ".join(base + extra).replace(f"{ROOT}/", "")  # the same in every checkout
        if key in store and "not run" not in store[key] and store[key]["command"].replace(f"{ROOT}/", "") == command:
            continue  # (a different command: a recompute profile has finished since)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            started = time.perf_counter()
            code, err = cli(base + extra + ["--out", str(out)])
            seconds = time.perf_counter() - started
            plan = Plan.from_dict(json.loads(out.read_text())) if code == 0 else None
            outside = None if plan is None else s.unsearched_zero(plan)
            if plan is not None and outside is None:
                store.put(key, {"devices": sum(st.degree for st in plan.stages), "mesh": plan.extra.get("cluster"),
                                "label": label(plan), "plan": plan.to_dict(), "predicted_peak_bytes": plan.extra.get("predicted_peak_bytes"),
                                "command": command, "seconds": seconds})
            else:
                why = outside or " ".join(line.strip() for line in err.strip().splitlines()) or f"exit code {code}"
                store.put(key, {"not run": why, "command": command})
        say(f"{c.model} fewest {space}: {store[key]}")
    for space, zero in uniform_baselines(s).items():
        key = f"{c.model}/fewest/{space}"
        if key not in store:
            full = c.cluster()
            for n, k in mesh_shapes(full.num_nodes, full.devices_per_node):
                r = megatron(s, full.with_shape(n, k), say, by="fit", zero=zero)
                if r["fits"]:
                    store.put(key, {"devices": n * k, "mesh": f"{n}x{k}", "best": r["best"],
                                    "row": next(row for row in r["rows"] if row["shape"] == r["best"])})
                    break
            else:
                store.put(key, {"devices": None, "why": f"no uniform 3D plan fits any sub-mesh of {full.shape}"})
        say(f"{c.model} fewest {space}: {store[key].get('mesh')}")
    if validate:  # each answer run on its sub-mesh of 40 GiB devices
        for key, r in list(store.records.items()):
            plan_dict = r.get("plan") or r.get("row", {}).get("plan")
            if key.startswith(f"{c.model}/fewest/") and plan_dict and r.get("mesh") and "simulated" not in r:
                r["simulated"] = simulate(s, Plan.from_dict(plan_dict), Cluster.parse(r["mesh"], device_memory=CAPACITY))
                store.put(key, r)
                say(f"  {key}: run {r['simulated']['status']}, measured {format_bytes(r['simulated']['measured_peak_bytes'])}")


