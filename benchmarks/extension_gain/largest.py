"""The largest trainable model per space: benchmarks/largest_model's method (a search over the model's width,
each probe a profile of that width) with each space's question as the probe: does the space hold a plan
predicted to fit the capacity, and what does its best plan need? (The need aims the next probe:
:func:`~benchmarks.largest_model.search.widest_guided`, the binary search's answer in fewer profiles.)

- **capture** and **extended** (the whole extension, as the last row of :func:`~.settings.spaces`):
  :func:`~hybridplan.workflows.plan_memory.plan_memory` on the mesh with its capacity, which refuses (PlanError)
  when the lowest-memory plan of the space does not fit (the needed memory: tensors, allocator reserve and what
  CUDA holds outside it);
- **megatron-3d**: a uniform 3D plan that fits (:func:`~.megatron.megatron` ``by="fit"``: predicted, or run on
  simulated devices where the profile cannot predict it).

A width's profiles are the model's own settings (:class:`~.settings.Setting`) for the wider model
(:mod:`.widths`); the model's own width uses its own profiles. The search starts at the model's width (where
the lowest-peak column finds a plan that fits; if a space has none, its answer is 0) and ends at
``high_factor`` times it (if that fits, the answer is "at least"). Every probe's
answer is kept in the results file, so an interrupted search resumes; a probe whose profile is missing is not
run (unless ``profile``): the column then says which profile, and the command that makes it.

[Note: twins share their widths] Two zoo models that differ only in their width (GPT-3 2.6B and 6.7B: 32 blocks
of 32 heads, sequence 1,024, vocabulary 51,200; hidden 2,560 and 4,096) with the same training settings are,
widened or narrowed to one width, one model. Their searches share it: a probe is profiled under the first
twin's name (GPT-3 6.7B's 7,680 is ``gpt3_2p6b_w7680``; a twin's own width is its own zoo profile), and a
search starts from what a twin's search in the same results file found inside its range (each such probe
kept with ``from``: the twin). GPT-3 6.7B's largest model is thus searched from 2.6B's probes above 4,096.

[Note: an answer refuted by its run] With ``validate`` the answer's plan runs on simulated devices of the
capacity (:func:`run_answer`). A plan predicted to fit can still run out of memory there: what the caching
allocator reserves beyond the tensor peak (fragmentation) is predicted from the profile's nearest measured span
(predict/reserved.py), and at paper size it is gigabytes that the two-micro-batch profiling runs measure only
roughly. MoE 1.3B at 3,152 hidden (extended space) was predicted to need 42.86 GB of its 42.95 GB devices
(0.09 GB spare); run, its ZeRO-1 stage's first device reserved 40.81 GB where 39.77 GB was predicted (the
tensor peak itself predicted within 5 MB: 35.376 GB predicted, 35.371 GB measured), and ran out of memory. Such
a width is not an answer: its probe is marked not fitting (``refuted``: the run's reason) and the search goes
on below it, so the answer is the widest width whose predicted plan also ran.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hybridplan.errors import PlanError
from hybridplan.models.zoo import get_model
from hybridplan.plan import Cluster, Plan
from hybridplan.units import format_bytes, parse_bytes
from hybridplan.workflows.plan_memory import plan_memory
from hybridplan.workflows.runs import ResultStore

from benchmarks.extension_gain.megatron import megatron
from benchmarks.extension_gain.plans import label, needed, simulate
from benchmarks.extension_gain.settings import MEGATRON, SETTINGS, Setting, profile_commands, spaces, unfinished
from benchmarks.extension_gain.widths import at_width, same_but_width, width_of
from benchmarks.largest_model.search import widest_guided
from benchmarks.paper_profiles import CAPACITY

SPACES = ("capture", "extended", MEGATRON)


class NotProfiled(Exception):
    """A probe's profile is missing and may not be made now: the search stops there."""


def twins(s: Setting) -> list[str]:
    """The models of :data:`~.settings.SETTINGS` that are ``s``'s model at another width (:func:`.widths.same_but_width`)
    with ``s``'s training settings, in that order, ``s``'s own model among them: at any width they are one model,
    profiled and searched once ([Note: twins share their widths])."""
    names = [t.case.model for t in SETTINGS.values() if same_but_width(t.case.model, s.case.model)
             and replace(t, case=replace(t.case, model=s.case.model), work=s.work) == s]
    return names if s.case.model in names else [s.case.model, *names]


def probe_setting(s: Setting, width: int) -> Setting:
    """The setting of the model at ``width``: itself at its own width, a twin zoo model at that one's (its own
    profiles), else a wider or narrower model named after the first twin, profiled into ``work/largest``."""
    names = twins(s)
    if width == width_of(s.case.model)[0]:
        return s
    own = next((m for m in names if width_of(m)[0] == width), None)
    return s.of_model(own, s.work) if own is not None else s.of_model(at_width(names[0], width), s.work / "largest")


def needed_profiles(s: Setting, space: str) -> list[list[str]]:
    """The ``hybridplan profile`` commands of the profiles ``space`` reads: the profile, and the extended space's
    recompute profile."""
    commands = profile_commands(s)
    return commands[:1] + (commands[-1:] if space == "extended" and s.recompute else [])


def ensure_profiles(s: Setting, space: str, profile: bool, say: Callable[[str], None]) -> None:
    """Make (resume) the profiles ``space`` needs for ``s`` if ``profile``, else check that they are finished.

    Raises:
        NotProfiled: naming the unfinished profile and its command.
    """
    from hybridplan.cli import main as hybridplan

    for argv in needed_profiles(s, space):
        db = Path(argv[argv.index("--db") + 1])
        db.parent.mkdir(parents=True, exist_ok=True)
        # searches of other spaces may run beside this one (each with its own results file) and probe the same
        # width: one makes the profile while the others wait, then find it finished
        with open(db.with_name(db.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            why = unfinished(db)
            if why is None:
                continue
            command = "PYTHONPATH=. .venv/bin/hybridplan " + " ".join(argv)
            if not profile:
                raise NotProfiled(f"{why}; make it with: {command} (or run with --profile)")
            say(command)
            if hybridplan(argv) != 0:
                raise NotProfiled(f"profiling failed: {command}")


def answer(s: Setting, space: str, cluster: Cluster, say: Callable[[str], None]) -> dict[str, Any]:
    """Whether ``space`` holds a plan of ``s``'s model predicted to fit ``cluster``'s capacity, and which; with
    what the space's best plan needs (``needed_bytes``) even where it does not fit: the search aims its next
    probe with it (:func:`~benchmarks.largest_model.search.widest_guided`)."""
    if space == MEGATRON:
        r = megatron(s, cluster, say, by="fit")
        row: dict[str, Any] = next((row for row in r["rows"] if row["shape"] == r["best"]), {})
        least = min((row["needed_bytes"] for row in r["rows"] if row.get("needed_bytes") is not None), default=None)
        return {"fits": bool(r["fits"]), "label": f"{r['best']}: {row.get('label')}" if r["best"] else None,
                "needed_bytes": row.get("needed_bytes") if r["fits"] else least,
                **({"plan": row["plan"]} if r["fits"] and "plan" in row else {})}
    options = {} if space == "capture" else list(spaces(s).values())[-1]
    try:
        found = plan_memory(s.db, cluster, **options)
    except PlanError as e:
        # the same search without a capacity: the lowest-memory plan, whatever it needs (the capacity only
        # decides whether it is refused: workflows/plan_memory.py); none where every plan of the space holds a
        # stage the profile could not measure even at its smaller batches (out of memory there too)
        try:
            need: int | None = needed(plan_memory(s.db, s.case.cluster(None), **options).prediction)
        except PlanError:
            need = None
        return {"fits": False, "why": e.message, "needed_bytes": need}
    return {"fits": True, "label": label(found.plan), "needed_bytes": needed(found.prediction),
            "plan": found.plan.to_dict()}


def run_answer(s: Setting, space: str, record: dict[str, Any], cluster: Cluster, profile: bool,
               say: Callable[[str], None]) -> dict[str, Any] | None:
    """The plan a finished search found at its widest width, run on simulated devices of ``cluster`` (the
    capacity its answer was predicted to fit): the answer measured, not only predicted. Kept in the probe
    (``simulated``: the run's status, measured and predicted peaks, seconds); a probe of an earlier search that
    kept no plan is asked again (its profiles made, with ``profile``, or checked; the answer replaces the probe's,
    so a probe that no longer fits says so and :func:`largest` searches below it). None where no plan fits."""
    probe = record["probes"].get(str(record.get("widest")))
    if probe is None or not probe.get("fits"):
        return None
    if "simulated" not in probe:
        sw = probe_setting(s, int(record["widest"]))
        if "plan" not in probe:
            ensure_profiles(sw, space, profile, say)
            probe.pop("label", None)  # (the earlier answer's: a probe that no longer fits has none)
            probe.update(answer(sw, space, cluster, say))
        if "plan" not in probe:
            return None
        say(f"  running {s.case.model} {space} at width {record['widest']} on simulated devices: {probe['label']}")
        ran = simulate(sw, Plan.from_dict(probe["plan"]), cluster,
                       recompute_db=sw.recompute_db if space == "extended" else None)
        probe["simulated"] = {k: ran[k] for k in ("status", "reason", "measured_peak_bytes", "predicted_peak_bytes",
                                                  "seconds")}
    return dict(probe["simulated"])


def largest(s: Setting, store: ResultStore, say: Callable[[str], None], *, profile: bool, capacity: str = CAPACITY,
            high_factor: float = 4.0, spaces_searched: tuple[str, ...] = SPACES, validate: bool = False) -> None:
    """Per space of ``spaces_searched`` (of :data:`SPACES`), the widest model (within ``high_factor`` times the model's width) with a plan
    predicted to fit ``capacity`` per device on the setting's mesh; resumable (module docstring)."""
    width, step = width_of(s.case.model)
    high = int(width * high_factor)
    cluster = s.case.cluster(capacity)
    for space in spaces_searched:
        key = f"{s.case.model}/largest/{space}"
        record: dict[str, Any] = store.records.get(key) or {"probes": {}}
        for stale in ("not run", "widest", "at_least", "high", "parameters", "label"):  # (an earlier search's answer:
            record.pop(stale, None)                                                    # until this one ends, none)
        for twin in twins(s):  # [Note: twins share their widths]
            earlier = store.records.get(f"{twin}/largest/{space}", {}) if twin != s.case.model else {}
            for w, p in earlier.get("probes", {}).items():
                if width <= int(w) <= high and w not in record["probes"] and "needed_bytes" in p:
                    record["probes"][w] = {**p, "from": twin}

        def probe(w: int, space: str = space, record: dict[str, Any] = record, key: str = key) -> tuple[bool, float | None]:
            known = record["probes"].get(str(w))
            if known is None or "needed_bytes" not in known:  # (probes recorded before the need was kept: asked again)
                sw = probe_setting(s, w)
                ensure_profiles(sw, space, profile, say)
                r = {"width": w, "parameters": get_model(sw.case.model).parameter_count(), **answer(sw, space, cluster, say)}
                record["probes"][str(w)] = r
                store.put(key, record)
                say(f"  {s.case.model} {space} width {w}: {'fits' if r['fits'] else 'does not fit'}"
                    f" ({format_bytes(r.get('needed_bytes'))} needed)")
            r = record["probes"][str(w)]
            return bool(r["fits"]), r.get("needed_bytes")

        while True:
            found = search(s, record, space, width, high, step, capacity, probe, say)
            store.put(key, record)
            if found is None or not validate:
                break
            try:
                ran = run_answer(s, space, record, cluster, profile, say)
            except NotProfiled as e:
                say(f"{s.case.model} largest {space}: its plan not run: {e}")
                break
            store.put(key, record)
            if ran is None:  # no plan to run; or asked again (an earlier search's probe), it no longer fits
                if record["probes"][str(found)]["fits"]:
                    break
                say(f"  {s.case.model} {space} width {found}: asked again, does not fit: searching below it")
                continue
            say(f"  run: {ran['status']}, measured {format_bytes(ran['measured_peak_bytes'])}")
            if ran["status"] != "oom":
                break
            # [Note: an answer refuted by its run]
            refuted = record["probes"][str(found)]
            refuted.update({"fits": False, "refuted": ran["reason"]})
            store.put(key, record)
            say(f"  {s.case.model} {space} width {found}: predicted to fit, ran out of memory: searching below it")


def search(s: Setting, record: dict[str, Any], space: str, width: int, high: int, step: int, capacity: str,
           probe: Callable[[int], tuple[bool, float | None]], say: Callable[[str], None]) -> int | None:
    """One widest-width search of ``record``'s space from what its probes know; the answer kept in ``record``
    (the caller stores it). None where a probe's profile is missing (the reason kept as ``not run``)."""
    # what earlier searches (a lower ``high_factor``, an interrupted run) found narrows the bracket: fitting
    # is monotone in the width, so the widest known fit is a low end and the narrowest known miss a high one
    known = {int(w): r for w, r in record["probes"].items() if "needed_bytes" in r and int(w) <= high}
    low = max([width] + [w for w, r in known.items() if r["fits"]])
    top = min([high] + [w for w, r in known.items() if not r["fits"] and w > low])
    # (a refuted width's need was predicted below the capacity: not a point of the growth the guesses follow)
    needs = {w: r["needed_bytes"] for w, r in known.items() if r["needed_bytes"] is not None and "refuted" not in r}
    try:
        found = widest_guided(probe, low, top, step, float(parse_bytes(capacity)), known=needs)
    except NotProfiled as e:
        record["not run"] = str(e)
        say(f"{s.case.model} largest {space}: not run: {e}")
        return None
    best = record["probes"].get(str(found), {})
    record.update({"widest": found, "width_name": "channels" if "wresnet" in s.case.model else "hidden size",
                   "own_width": width, "high": high, "at_least": found == high,
                   "parameters": best.get("parameters"), "label": best.get("label"), "capacity": capacity})
    say(f"{s.case.model} largest {space}: width {found}{' or more' if found == high else ''},"
        f" {best.get('parameters')} parameters")
    return found

