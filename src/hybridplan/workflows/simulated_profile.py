"""A profile without a GPU: the profiling campaign on simulated devices, each distinct stage simulated once, kept
in the user's cache, so that ``plan`` answers for a model and a cluster without ``--db``.

[Note: the simulated profile] ``hybridplan profile --backend sim`` already measures a campaign's stages on fake
tensors (profiling/execution.py: one device per measured stage, two micro-batches); what made it slow on a real
model is that it measured the same work again and again: every decoder layer of a Llama alone, every pair of
them, at every position, in every scenario. Here the campaign runs with

- neighbour chains of one layer (``--neighbors 1``: ``M_a(l)`` from the pair ``[l-1, l+1)``, CAPTURE's nearest
  neighbours), so every measured span holds one or two layers;
- every tensor degree of a node profiled (2, 4, 8, ...: a measured profile stops at 4 and fits higher degrees,
  which misses the parameters' ``1/t``: Llama-2-7B's static bytes at tensor x8 fitted from x2 and x4 came out
  at 5 GiB where the simulated device holds 11 GiB; simulating x8 costs a dozen stages);
- a :class:`~hybridplan.profiling.stage_memo.StageMemo` on disk, so a span is simulated once per distinct
  sequence of layer signatures (a Llama has six: embed, decoder, head, and their pairs), and its auxiliary
  tables once per model;
- the target's micro-batch itself and its half (:func:`_profiled_batches`), where a measured profile takes half and
  a quarter of it (CAPTURE's choice: the GPUs being profiled must not run out of memory). On fake tensors a
  simulation costs the same whatever the batch, and a quantity measured at the target is not extrapolated: a
  straight line through half and a quarter misses a transient whose phase changes above them (Llama-2-7B's layer 9
  as data x2 ZeRO-3 recomputed: its later backward 1,045,479,424 / 1,473,822,720 / 2,451,652,608 bytes at
  micro-batches of 2 / 4 / 8, the line through 2 and 4 121,143,296 short at 8). Over the 228 stages of
  benchmarks/instant_planning's 21 Llama-2-7B plans on 2x8 the stages within 0.5% of their simulated devices went
  from 208 to 217 (the measurement and the stage count: that benchmark's README); and, in the pipeline and tensor
  scenarios, a quarter of the target too (:func:`_replica_batches`): the rows of a data x4 replica and of a data x
  tensor stage's replicas over 4, which a line through the target and its half would extrapolate below
  (profiling/campaign.py [Note: a replica's rows are measured]);

and writes an ordinary profile database (its runs, measurements and statistics the same as a campaign that
simulated every stage: tests/profiling/test_stage_memo.py), which the predictor and every search read as
they read any profile. Plain and recomputed, so the search may recompute any stage; with the data-parallel
ZeRO-3 scenarios, so it may shard any data stage.

A finished database is kept in the cache under the SHA-256 of what it profiles (the model's configuration, the
mesh shape, device type, batch, micro-batches, schedule, training options and the code: profiling/stage_memo.py
``code_digest``): the same question again reads it and simulates nothing. A database is built under a private
name and renamed into place when complete, so an interrupted or concurrent build never leaves a partial one
where another command would read it (the stages it finished stay in the memo and are not simulated again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridplan.plan import Cluster, as_schedule
from hybridplan.profiling.campaign_sizes import splits

__all__ = ["SimulatedProfiles", "default_cache_dir", "simulated_profiles", "cache_entries", "clear_cache",
           "CACHE_ENV"]

CACHE_ENV = "HYBRIDPLAN_CACHE_DIR"
"""Environment variable naming the cache folder (else ``$XDG_CACHE_HOME/hybridplan``, else ``~/.cache/hybridplan``)."""

_NEIGHBORS = 1
"""Chain length of the simulated profile (module note)."""


def _profiled_batches(batch: int, microbatches: int, granularity: int = 1) -> tuple[int, int]:
    """The two global batches the simulated profile measures (module note): the target ``batch`` and its half, or
    twice the target where the half does not split into ``microbatches`` micro-batches of a multiple of
    ``granularity`` samples (a micro-batch of one sample: one and two are measured)."""
    return (batch, batch // 2) if batch % 2 == 0 and splits(batch // 2, microbatches, granularity) else (2 * batch, batch)


def _replica_batches(batches: tuple[int, int], microbatches: int, per_node: int, granularity: int = 1) -> tuple[int, ...]:
    """The further global batch the pipeline and tensor scenarios are profiled at (module note): half the smaller
    profiled one, the rows of a data x4 replica at the target, where it splits into ``microbatches`` micro-batches of
    a multiple of ``granularity`` samples and a node has the 4 devices such a replica group needs; else none.

    >>> _replica_batches((64, 32), 8, 8), _replica_batches((64, 32), 8, 2), _replica_batches((16, 8), 8, 8)
    ((16,), (), ())
    """
    quarter = min(batches) // 2
    return (quarter,) if per_node >= 4 and min(batches) % 2 == 0 and splits(quarter, microbatches, granularity) else ()


_PROFILE_NAME = re.compile(r"[0-9a-f]{32}\.sqlite")
"""A cached profile's file name: the SHA-256 prefix of its campaign."""


def default_cache_dir() -> Path:
    """The user's cache folder for hybridplan (the platform convention: XDG on Linux)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hybridplan"


@dataclass(frozen=True)
class SimulatedProfiles:
    """The profile databases of a question: plain, and recomputed (None when not asked for)."""

    db: Path
    recompute_db: Path | None
    simulated: int
    """Stages and tables simulated by this call (0: everything was in the cache)."""
    reused: int
    """Stages and tables read from the cache."""
    seconds: float
    cached: bool
    """Whether the cache folder was usable (else the databases live until the ``with`` block ends)."""
    tables: Path | None = None
    """Where a search over these profiles keeps its stage matrices (workflows/table_cache.py); None: not kept."""


@contextmanager
def simulated_profiles(model: str, cluster: Cluster, *, global_batch_size: int, num_microbatches: int,
                       schedule: str = "1f1b", precision: str = "fp32", device_type: str = "cpu", zero: bool = True,
                       recompute: bool = True, cache_dir: str | Path | None = None,
                       progress: Callable[[str], None] | None = None,
                       run_options: dict[str, Any] | None = None) -> Iterator[SimulatedProfiles]:
    """The simulated profiles of ``model`` on ``cluster``'s shape (module note), built where the cache lacks them.

    Args:
        model: zoo name, ``hf:...`` or ``module:function``.
        cluster: the mesh (its shape and device type; capacities are not used: every stage is measured).
        global_batch_size, num_microbatches, schedule: the targets the profile is taken for.
        precision, device_type: the training options of every simulated stage.
        zero: profile the data-parallel ZeRO-3 scenarios too (the search may then shard data stages 2 and 3 ways).
        recompute: a second profile with every layer recomputed (the search may then recompute any stage).
        cache_dir: the cache folder (default :func:`default_cache_dir`); if it cannot be written, the work is done
            in a temporary folder and a line says so.
        progress: one line per event.
        run_options: more RunConfig options of every simulated stage (an engine's: runtime/engines.py); they key
            the profiles and the stages like the others.

    Raises:
        HybridPlanError: a bad model, batch or cluster (before anything is simulated).
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    gpu = cluster.devices[0].gpu  # a named GPU's CUDA terms (plan/gpus.py): the simulated device's cuBLAS workspace
    more = dict(run_options or {})
    question = _question(model, cluster, gpu, global_batch_size, num_microbatches, schedule, precision, device_type,
                         zero, recompute, more)
    answered = _answered(root, question)
    if answered is not None:  # asked before: the model need not even be built ([Note: the question index])
        for what, path in zip(("profile", "recomputed profile"), answered):
            say(f"{what} of {model} on {cluster.shape} read from the cache ({path})")
        yield SimulatedProfiles(db=answered[0], recompute_db=answered[1] if recompute else None, simulated=0, reused=0,
                                seconds=time.perf_counter() - started, cached=True, tables=root / "tables")
        return
    from hybridplan.models.zoo import resolve_model  # torch: only when the question was not answered before
    from hybridplan.profiling.campaign import CampaignConfig
    from hybridplan.profiling.stage_memo import StageMemo, code_digest

    layered = resolve_model(model)
    config = layered.config()
    signatures = [layered.layer_signature(i) for i in range(layered.num_layers)]
    if None in signatures or len(set(signatures)) == len(signatures):
        why = (f"{model} does not name what its layers are (LayeredModel.layer_signature)" if None in signatures
               else f"no two layers of {model} are alike")
        say(f"note: {why}: every stage is simulated, none shared")
    batches = _profiled_batches(global_batch_size, num_microbatches, layered.sample_granularity)
    replicas = _replica_batches(batches, num_microbatches, cluster.devices_per_node, layered.sample_granularity)
    scenarios = _scenarios(layered, cluster.devices_per_node, batches, num_microbatches, zero)
    memo = StageMemo(root / "stages", on_unusable=say)
    shape = Cluster.uniform(cluster.num_nodes, cluster.devices_per_node, device_type=device_type, memory_bytes=None,
                            gpu=gpu)
    options: dict[str, Any] = {"backend": "sim", "device_type": device_type, "precision": precision, **more}
    configs = [CampaignConfig(model=model, cluster=shape, global_batch_size=global_batch_size,
                              num_microbatches=num_microbatches, schedule=as_schedule(schedule), zero=zero, neighbors=_NEIGHBORS,
                              batch_sizes=batches, replica_batch_sizes=replicas, scenarios=scenarios,
                              run_options={**options, **({"activation_checkpointing": True} if ac else {})})
               for ac in ((False, True) if recompute else (False,))]
    with tempfile.TemporaryDirectory(prefix="hybridplan-profile-") as scratch:
        folder = root / "profiles" if memo.directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        paths, todo = [], []
        for cfg in configs:
            identity = {"code": code_digest(), "model": config, "shape": shape.shape,
                        "device": device_type, "batch": global_batch_size, "microbatches": num_microbatches,
                        "schedule": schedule, "options": cfg.run_options, "zero": zero, "neighbors": _NEIGHBORS,
                        "scenarios": [s.name for s in scenarios], "batch_sizes": batches,
                        **({"replica_batch_sizes": replicas} if replicas else {}),
                        **({"gpu": gpu} if gpu is not None else {})}
            key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]
            path = folder / f"{key}.sqlite"
            what = "recomputed profile" if cfg.run_options.get("activation_checkpointing") else "profile"
            if path.exists():
                say(f"{what} of {model} on {shape.shape} read from the cache ({path})")
            else:
                say(f"simulating the {what} of {model} on {shape.shape} {device_type} devices ({precision}): each"
                    " distinct stage once")
                todo.append((what, cfg, path))
            paths.append(path)
        if len(todo) > 1 and memo.directory is not None and len(os.sched_getaffinity(0)) > 1:
            # the last (the recomputed profile, the longer) is built here meanwhile: this process has the model
            # built and torch loaded already, which a worker spends seconds on
            here_what, here_cfg, here_path = todo[-1]
            counts = _build_in_parallel(todo[:-1], memo.directory, say, meanwhile=lambda: _build(
                here_cfg, here_path, memo, lambda msg: say(f"  [{here_what}] {msg.strip()}")))
            memo.misses, memo.hits = memo.misses + counts[0], memo.hits + counts[1]
        for what, cfg, path in todo:
            if not path.exists():  # built here: alone, or after a worker that failed (its stages are in the memo)
                _build(cfg, path, memo, say)
        if memo.directory is not None and question is not None:
            _remember(root, question, paths)
        yield SimulatedProfiles(db=paths[0], recompute_db=paths[1] if recompute else None, simulated=memo.misses,
                                reused=memo.hits, seconds=time.perf_counter() - started,
                                cached=memo.directory is not None,
                                tables=root / "tables" if memo.directory is not None else None)


def _question(model: str, cluster: Cluster, gpu: str | None, batch: int, microbatches: int, schedule: str,
              precision: str, device_type: str, zero: bool, recompute: bool, options: dict[str, Any]) -> str | None:
    """The SHA-256 of what a question's profiles depend on, computed without building the model: for a
    HuggingFace configuration, its checked ``config.json`` (models/hf_config.py, no torch); None for other
    models, whose code the name alone does not pin ([Note: the question index])."""
    from hybridplan.models.hf_config import is_hf_name, load_hf_config
    from hybridplan.profiling.stage_memo import code_digest

    if not is_hf_name(model):
        return None
    identity = {"code": code_digest(), "config": load_hf_config(model), "shape": cluster.shape, "gpu": gpu,
                "batch": batch, "microbatches": microbatches, "schedule": schedule, "precision": precision,
                "device": device_type, "zero": zero, "recompute": recompute, "neighbors": _NEIGHBORS,
                # :func:`_profiled_batches` and :func:`_replica_batches` (functions of what is above)
                "profiled": "the target and its half; a quarter in the pipeline and tensor scenarios",
                **({"options": options} if options else {})}  # no key without options: earlier questions still hit
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _answered(root: Path, question: str | None) -> list[Path] | None:
    """The profiles a question was answered with before, if the index names them and they are all there.

    [Note: the question index] A profile's own name is the SHA-256 of its campaign (model configuration, mesh,
    scenarios, options, code), which takes the built model to compute (its scenarios depend on which layers
    split): 4-5 s for a 7B HuggingFace model, most of a warm ``plan``. ``profiles/<question>.json`` maps the
    question, as the command line states it, to the profiles' files; a missing or damaged index entry, or one
    naming a file no longer there, only means the long way round."""
    if question is None:
        return None
    try:
        names = json.loads((root / "profiles" / f"{question}.json").read_text())
        if not isinstance(names, list) or not all(isinstance(n, str) and _PROFILE_NAME.fullmatch(n) for n in names):
            return None  # only a profile's own name: an index never points outside the cache
        paths = [root / "profiles" / name for name in names]
    except (OSError, ValueError):
        return None
    return paths if paths and all(p.is_file() for p in paths) else None


def _remember(root: Path, question: str, paths: list[Path]) -> None:
    """Write the question index entry for ``paths`` (atomically; an unwritable folder costs only time)."""
    index = root / "profiles" / f"{question}.json"
    tmp = index.with_name(f".{question}.{os.getpid()}.{uuid.uuid4().hex}.json")
    try:
        tmp.write_text(json.dumps([p.name for p in paths]))
        os.replace(tmp, index)
    except OSError:
        tmp.unlink(missing_ok=True)


def _scenarios(model: Any, per_node: int, batches: tuple[int, int], microbatches: int, zero: bool) -> tuple[Any, ...]:
    """The campaign's default scenarios at the profiled ``batches``, and tensor-parallel ones at every power of two up
    to the node (module note)."""
    from hybridplan.profiling.campaign_sizes import default_scenarios
    from hybridplan.profiling.partitions import Scenario

    micro = [b // microbatches for b in batches]
    shape = Cluster.uniform(1, per_node)
    out = list(default_scenarios(model, shape, micro, zero=zero))
    degree = 8
    while degree <= per_node:
        if any(model.tensor_parallel_problem(layer, degree) is None for layer in range(model.num_layers)):
            out.append(Scenario("tensor", degree))
        degree *= 2
    return tuple(out)


def _build(cfg: Any, path: Path, memo: Any, say: Callable[[str], None]) -> None:
    """Run the campaign into a private file, then rename it to ``path`` (module note)."""
    from hybridplan.profiling.campaign import Campaign
    from hybridplan.profiling.store import ProfileStore

    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex}.sqlite")
    try:
        before = memo.misses
        with ProfileStore(tmp) as store:
            summary = Campaign(cfg, store, memo=memo, progress=_quiet(say)).run()
        if summary.unmeasured:
            say(f"  could not measure: {summary.unmeasured}")
        os.replace(tmp, path)
        say(f"  {summary.runs_total} profiling runs, {memo.misses - before} stage(s) and table(s) simulated, the rest"
            f" read from the cache, in {summary.seconds:.1f} s")
    finally:
        tmp.unlink(missing_ok=True)


def _build_in_parallel(todo: list[tuple[str, Any, Path]], memo_dir: Path, say: Callable[[str], None], *,
                       meanwhile: Callable[[], None] = lambda: None) -> tuple[int, int]:
    """Build each profile of ``todo`` in a process of its own, and run ``meanwhile`` here while they work (the plain
    and the recomputed profile share no stage, so two cores build both in the time of one); returns the stages
    the workers simulated and read from the memo.

    The workers are the forkserver's (runtime/processes.py), tied to this process as ranks are
    (runtime/lifeline.py): whatever ends this command ends them. They share the memo on disk, whose writes are
    atomic (profiling/stage_memo.py). A worker that fails leaves its profile to be built here."""
    import multiprocessing as mp
    import queue
    import threading

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "hybridplan.workflows.simulated_profile"])
    messages = ctx.Queue()
    me = os.getpid()
    procs = [ctx.Process(target=_build_worker, args=(what, cfg, path, memo_dir, me, messages), daemon=True)
             for what, cfg, path in todo]
    counts = [0, 0]

    def take(timeout: float) -> bool:
        try:
            message = messages.get(timeout=timeout)
        except queue.Empty:
            return False
        if message[0] == "line":
            say(message[1])
        else:
            counts[0], counts[1] = counts[0] + message[1], counts[1] + message[2]
        return True

    try:
        for p in procs:
            p.start()
        say(f"  {len(procs) + 1} profiles built side by side, here and in processes {[p.pid for p in procs]}")
        done = threading.Event()

        def relay() -> None:  # the workers' lines as they come, while this process builds its own
            while not done.is_set() or any(p.is_alive() for p in procs):
                take(0.2)
            while take(0.1):
                pass

        relaying = threading.Thread(target=relay, daemon=True)
        relaying.start()
        try:
            meanwhile()
        finally:
            done.set()  # the relay then ends with the workers (which the ``finally`` below ends on an error)
        relaying.join()
        for (what, _, _), p in zip(todo, procs):
            if p.exitcode != 0:
                say(f"  the worker building the {what} ended with code {p.exitcode}: building it here")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
    return counts[0], counts[1]


def _build_worker(what: str, cfg: Any, path: Path, memo_dir: Path, launcher: int, messages: Any) -> None:
    """One profile of :func:`_build_in_parallel`, in a worker process."""
    from hybridplan.profiling.stage_memo import StageMemo
    from hybridplan.runtime.lifeline import tie_to_launcher

    tie_to_launcher(launcher)
    memo = StageMemo(memo_dir)
    _build(cfg, path, memo, lambda msg: messages.put(("line", f"  [{what}] {msg.strip()}")))
    messages.put(("counts", memo.misses, memo.hits))


def _quiet(say: Callable[[str], None]) -> Callable[[str], None]:
    """The campaign's lines, one in ten of its per-run lines (a simulated campaign runs a hundred in a minute)."""
    count = [0]

    def line(msg: str) -> None:
        if msg.startswith("["):
            count[0] += 1
            if count[0] % 10:
                return
        say("  " + msg)

    return line


def cache_entries(cache_dir: str | Path | None = None) -> list[tuple[str, int, int]]:
    """What the cache holds: ``(kind, files, bytes)`` for the stage memo and the profiles."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = []
    for kind, pattern in (("stages", "*.json"), ("profiles", "*.sqlite"), ("tables", "*.npz")):
        files = [p for p in (root / kind).glob(pattern) if not p.name.startswith(".")] if (root / kind).is_dir() else []
        out.append((kind, len(files), sum(p.stat().st_size for p in files)))
    return out


def clear_cache(cache_dir: str | Path | None = None) -> int:
    """Remove the cache's stage memo, profiles and stage matrices; returns the files removed."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    removed = 0
    for kind in ("stages", "profiles", "tables"):
        folder = root / kind
        if folder.is_dir():
            removed += sum(1 for p in folder.iterdir() if p.is_file())
            shutil.rmtree(folder)
    return removed
