"""The profile database: one SQLite file per campaign, written as each run finishes.

Tables:

- ``meta(key, value)``: the campaign's settings as JSON values (model, cluster, schedule, batch sizes,
  profiled micro-batch sizes, seed, training options, format version).
- ``runs(id, key, scenario, batch_size, plan, status, reason, wall_seconds, finished_at)``: every
  profiling run with its outcome ("ok", "oom", "failed"); ``key`` identifies the run so that a
  resumed campaign skips it.
- ``measurements(run_id, device, stage, start, stop, kind, degree, batch_size, microbatch_size, peak,
  <the eight quantities>, timeline)``: one row per device of every successful run.
- ``statistics(scenario, batch_size, layer, statistic, quantity, value)``: per-layer M_i / M_a, refreshed
  by the campaign (profiling/statistics.py); query it with any SQLite client.
- ``weight_stash(kind, degree, layer, bytes)``: per-device bytes a PipeDream-2BW weight stash adds for
  each layer in a stage of that kind and degree (runtime/weight_stash.py), written by the campaign, so
  that a profile taken under one schedule predicts the other (predict/memory.py).
- ``layer_times(device_type, tensor_degree, micro_batch_size, layer, forward_s, backward_s, samples)``:
  per-layer seconds measured by ``hybridplan profile --time`` (profiling/timing.py), the median of
  ``samples`` micro-batches.
- ``run_costs(device_type, tensor_degree, micro_batch_size, start, stop, parameter_bytes, step_s, overhead_s)``:
  per timing run of layers ``[start, stop)``, the optimizer step's seconds, the parameter bytes it updated on
  one device, and the iteration's seconds its layers and step leave unexplained (profiling/timing.py).
  Absent from databases written before it: their profiles have no optimizer or overhead term.
- ``reserved_peaks(run_id, device, tensor_bytes, reserved_bytes)``: on (real or simulated) CUDA devices, the
  tensor peak and the caching allocator's reserved peak of the same iterations of that run
  (``max_memory_allocated``, ``max_memory_reserved``), from which predict/reserved.py predicts the reserved
  peak. Absent from databases written before it, and empty for CPU profiles: their reserved peak is not predicted.
- ``workspaces(run_id, device, name, bytes)``: on simulated CUDA devices, the cuBLAS workspaces
  (``"cublas/forward"``, ...) held at the start of the measured iteration, which its ``static`` includes; a device
  that holds none has one row ``("", 0)``. A device without rows (a CPU, a real CUDA device, a database written
  before the table) keeps its workspaces, if any, in ``static`` (profiling/statistics.py [Note: workspaces are per
  device]).

Each run is committed in one transaction (its ``runs`` row and every row of its devices, or nothing), so a campaign
ended in any way (SIGTERM, SIGINT, SIGKILL, power loss) loses at most the run in flight, and a run recorded again
under its key replaces the earlier record instead of failing on the key.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.profiling.quantities import QUANTITIES, backward_after_backward

__all__ = ["ProfileStore", "StoredRun", "Measurement", "FORMAT_VERSION"]

FORMAT_VERSION = 1

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, scenario TEXT NOT NULL, batch_size INTEGER NOT NULL,
    plan TEXT NOT NULL, status TEXT NOT NULL, reason TEXT, wall_seconds REAL, finished_at REAL);
CREATE TABLE IF NOT EXISTS measurements (
    run_id INTEGER NOT NULL REFERENCES runs(id), device INTEGER NOT NULL, stage INTEGER NOT NULL,
    start INTEGER NOT NULL, stop INTEGER NOT NULL, kind TEXT NOT NULL, degree INTEGER NOT NULL,
    batch_size INTEGER NOT NULL, microbatch_size INTEGER NOT NULL, peak INTEGER NOT NULL,
    {", ".join(f"{q} INTEGER NOT NULL" for q in QUANTITIES)}, timeline TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS measurements_by_span ON measurements(kind, degree, batch_size, start, stop);
CREATE TABLE IF NOT EXISTS statistics (
    scenario TEXT NOT NULL, batch_size INTEGER NOT NULL, layer INTEGER NOT NULL, statistic TEXT NOT NULL,
    quantity TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (scenario, batch_size, layer, statistic, quantity));
CREATE TABLE IF NOT EXISTS weight_stash (
    kind TEXT NOT NULL, degree INTEGER NOT NULL, layer INTEGER NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (kind, degree, layer));
CREATE TABLE IF NOT EXISTS layer_times (
    device_type TEXT NOT NULL, tensor_degree INTEGER NOT NULL, micro_batch_size INTEGER NOT NULL,
    layer INTEGER NOT NULL, forward_s REAL NOT NULL, backward_s REAL NOT NULL, samples INTEGER NOT NULL,
    PRIMARY KEY (device_type, tensor_degree, micro_batch_size, layer));
CREATE TABLE IF NOT EXISTS run_costs (
    device_type TEXT NOT NULL, tensor_degree INTEGER NOT NULL, micro_batch_size INTEGER NOT NULL,
    start INTEGER NOT NULL, stop INTEGER NOT NULL, parameter_bytes REAL NOT NULL, step_s REAL NOT NULL,
    overhead_s REAL NOT NULL, PRIMARY KEY (device_type, tensor_degree, micro_batch_size, start));
CREATE TABLE IF NOT EXISTS reserved_peaks (
    run_id INTEGER NOT NULL REFERENCES runs(id), device INTEGER NOT NULL, tensor_bytes INTEGER NOT NULL,
    reserved_bytes INTEGER NOT NULL, PRIMARY KEY (run_id, device));
CREATE TABLE IF NOT EXISTS workspaces (
    run_id INTEGER NOT NULL REFERENCES runs(id), device INTEGER NOT NULL, name TEXT NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, device, name));
"""


@dataclass(frozen=True)
class StoredRun:
    """A finished profiling run."""

    id: int
    key: str
    scenario: str
    batch_size: int
    plan: dict[str, Any]
    status: str
    reason: str | None
    wall_seconds: float | None


@dataclass(frozen=True)
class Measurement:
    """One device's measurement of a profiled stage."""

    run_id: int
    device: int
    stage: int
    start: int
    stop: int
    kind: str
    degree: int
    batch_size: int
    microbatch_size: int
    peak: int
    quantities: np.ndarray
    workspaces: dict[str, int] | None = None
    """The library workspaces inside ``quantities``' static (table ``workspaces``); None where not recorded."""
    backward_after_backward: int | None = None
    """The later-backward transient of the backwards that follow a backward (profiling/quantities.py
    :func:`~hybridplan.profiling.quantities.backward_after_backward`), from the timeline; None where none does."""


class ProfileStore:
    """A profile database (created if missing).

    Raises:
        ProfileError: if the file exists but is not a hybridplan profile database.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            what = "is a directory" if self.path.is_dir() else "does not exist"
            raise ProfileError(f"profile database {str(self.path)!r} {what}",
                               fix="give the file written by 'hybridplan profile ... --db FILE'")
        try:
            if create:
                self._db = sqlite3.connect(str(self.path), isolation_level=None)
                # another program's database gains none of our tables: only a new (empty) file or ours is written
                existing = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if existing and "meta" not in existing:
                    self._db.close()
                    raise ProfileError(
                        f"{str(self.path)!r} is not a hybridplan profile database (it holds tables "
                        f"{', '.join(sorted(existing)[:3])}{', ...' if len(existing) > 3 else ''} and no 'meta' table)",
                        fix="give a new file name to --db, or the file written by 'hybridplan profile ... --db FILE'")
                self._db.executescript(_SCHEMA)
            else:  # reading a profile never changes the file (nor adds our tables to someone else's database)
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, isolation_level=None)
            self._tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in self._tables:
                raise ProfileError(f"{str(self.path)!r} is not a hybridplan profile database (it has no 'meta' table)",
                                   fix="give the file written by 'hybridplan profile ... --db FILE'")
            version = self.get_meta("format_version")
        except sqlite3.DatabaseError as e:
            raise ProfileError(f"{str(self.path)!r} is not a hybridplan profile database: {e}") from None
        if version is None and create:
            self.set_meta("format_version", FORMAT_VERSION)
        elif version is not None and version != FORMAT_VERSION:
            raise ProfileError(
                f"{str(self.path)!r} has profile format {version}, this hybridplan reads {FORMAT_VERSION}",
                fix="profile again with this version",
            )

    def _has(self, table: str) -> bool:
        """Whether the file has ``table`` (a database read-only may predate a table added later)."""
        return table in self._tables

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._decode(key, row[0])

    def set_meta(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def meta(self) -> dict[str, Any]:
        return {k: self._decode(k, v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    def _decode(self, key: str, text: str) -> Any:
        try:
            return json.loads(text)
        except (json.JSONDecodeError, TypeError):
            raise ProfileError(f"{str(self.path)!r}: meta value {key!r} is not JSON ({str(text)[:40]!r})",
                               fix="the database is damaged: profile again into a new --db") from None

    # ------------------------------------------------------------------ runs
    def find_run(self, key: str) -> StoredRun | None:
        if not self._has("runs"):
            return None
        row = self._db.execute(
            "SELECT id, key, scenario, batch_size, plan, status, reason, wall_seconds FROM runs WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else StoredRun(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6], row[7])

    def runs(self) -> list[StoredRun]:
        if not self._has("runs"):
            return []
        rows = self._db.execute(
            "SELECT id, key, scenario, batch_size, plan, status, reason, wall_seconds FROM runs ORDER BY id"
        ).fetchall()
        return [StoredRun(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]) for r in rows]

    def record_run(
        self,
        *,
        key: str,
        scenario: str,
        batch_size: int,
        plan: Mapping[str, Any],
        status: str,
        reason: str | None,
        wall_seconds: float | None,
        measurements: Sequence[Mapping[str, Any]] = (),
    ) -> int:
        """Store a finished run and its per-device measurements atomically, replacing a run stored under the same
        ``key`` with its rows (a resumed campaign runs an interrupted run again: profiling/campaign.py); returns the
        run id."""
        with self._transaction() as db:
            for (old,) in db.execute("SELECT id FROM runs WHERE key = ?", (key,)).fetchall():
                for table in ("measurements", "reserved_peaks", "workspaces"):
                    db.execute(f"DELETE FROM {table} WHERE run_id = ?", (old,))
                db.execute("DELETE FROM runs WHERE id = ?", (old,))
            cur = db.execute(
                "INSERT INTO runs(key, scenario, batch_size, plan, status, reason, wall_seconds, finished_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, scenario, batch_size, json.dumps(plan), status, reason, wall_seconds, time.time()),
            )
            run_id = cur.lastrowid
            if run_id is None:  # pragma: no cover - sqlite sets it for every INSERT
                raise ProfileError(f"{str(self.path)!r}: the run was not stored")
            cols = ["run_id", "device", "stage", "start", "stop", "kind", "degree", "batch_size", "microbatch_size", "peak",
                    *QUANTITIES, "timeline"]
            for m in measurements:
                values = [run_id] + [m[c] for c in cols[1:10]] + [int(v) for v in m["quantities"]] + [json.dumps(m["timeline"])]
                db.execute(f"INSERT INTO measurements({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values)
                if m.get("reserved") is not None:  # (tensor peak, reserved peak) of the same iterations
                    db.execute("INSERT INTO reserved_peaks(run_id, device, tensor_bytes, reserved_bytes) VALUES (?, ?, ?, ?)",
                               (run_id, m["device"], *(int(v) for v in m["reserved"])))
                if m.get("workspaces") is not None:  # held once per device: profiling/statistics.py
                    db.executemany("INSERT INTO workspaces(run_id, device, name, bytes) VALUES (?, ?, ?, ?)",
                                   [(run_id, m["device"], name, int(n)) for name, n in (m["workspaces"] or {"": 0}).items()])
        return run_id

    def measurements(self, *, kind: str | None = None, degree: int | None = None, batch_size: int | None = None) -> list[Measurement]:
        """Measurements of successful runs, optionally filtered; stage kind "none" is degree 1."""
        if not self._has("measurements"):
            return []
        where, args = [], []
        for col, val in (("kind", kind), ("degree", degree), ("batch_size", batch_size)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        sql = (
            f"SELECT run_id, device, stage, start, stop, kind, degree, batch_size, microbatch_size, peak, timeline, "
            f"{', '.join(QUANTITIES)}"
            f" FROM measurements {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY run_id, device"
        )
        held: dict[tuple[int, int], dict[str, int]] = {}
        if self._has("workspaces"):
            for run_id, device, name, nbytes in self._db.execute("SELECT run_id, device, name, bytes FROM workspaces"):
                entry = held.setdefault((int(run_id), int(device)), {})
                if name:
                    entry[str(name)] = int(nbytes)
        return [Measurement(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], np.array(r[11:], dtype=float),
                            held.get((r[0], r[1])), backward_after_backward(json.loads(r[10])))
                for r in self._db.execute(sql, args)]

    def reserved_peaks(self) -> list[tuple[str, int, int, int, int, int, int, int]]:
        """``(kind, degree, batch_size, microbatch_size, start, stop, tensor_bytes, reserved_bytes)`` of every
        measured device whose run recorded the CUDA caching allocator's reserved peak (table ``reserved_peaks``)."""
        if not self._has("reserved_peaks"):
            return []
        rows = self._db.execute(
            "SELECT m.kind, m.degree, m.batch_size, m.microbatch_size, m.start, m.stop, r.tensor_bytes, r.reserved_bytes"
            " FROM reserved_peaks r JOIN measurements m ON m.run_id = r.run_id AND m.device = r.device"
            " ORDER BY r.run_id, r.device")
        return [(str(k), int(d), int(b), int(mb), int(a), int(z), int(t), int(r)) for k, d, b, mb, a, z, t, r in rows]

    # ------------------------------------------------------------------ statistics
    def replace_statistics(self, scenario: str, batch_size: int, rows: Sequence[tuple[int, str, str, float]]) -> None:
        """Replace the statistics of one scenario and batch size with ``(layer, statistic, quantity, value)`` rows."""
        with self._transaction() as db:
            db.execute("DELETE FROM statistics WHERE scenario = ? AND batch_size = ?", (scenario, batch_size))
            db.executemany(
                "INSERT INTO statistics(scenario, batch_size, layer, statistic, quantity, value) VALUES (?, ?, ?, ?, ?, ?)",
                [(scenario, batch_size, *r) for r in rows],
            )

    # ------------------------------------------------------------------ weight stash
    def replace_weight_stash(self, kind: str, degree: int, per_layer: Sequence[int | None]) -> None:
        """Store the stash bytes of every layer for ``kind`` x ``degree`` (``None``: the layer cannot run so)."""
        with self._transaction() as db:
            db.execute("DELETE FROM weight_stash WHERE kind = ? AND degree = ?", (kind, degree))
            db.executemany(
                "INSERT INTO weight_stash(kind, degree, layer, bytes) VALUES (?, ?, ?, ?)",
                [(kind, degree, layer, int(b)) for layer, b in enumerate(per_layer) if b is not None],
            )

    def weight_stash(self) -> dict[tuple[str, int], dict[int, int]]:
        """``{(kind, degree): {layer: bytes}}`` of every stored scenario."""
        if not self._has("weight_stash"):
            return {}
        out: dict[tuple[str, int], dict[int, int]] = {}
        for kind, degree, layer, nbytes in self._db.execute("SELECT kind, degree, layer, bytes FROM weight_stash"):
            out.setdefault((kind, int(degree)), {})[int(layer)] = int(nbytes)
        return out

    # ------------------------------------------------------------------ layer times
    def record_layer_times(
        self, device_type: str, tensor_degree: int, micro_batch_size: int, rows: Sequence[tuple[int, float, float, int]]
    ) -> None:
        """Store ``(layer, forward_s, backward_s, samples)`` rows of one timing run (replacing earlier ones)."""
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO layer_times(device_type, tensor_degree, micro_batch_size, layer, forward_s,"
                " backward_s, samples) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(device_type, tensor_degree, micro_batch_size, *r) for r in rows],
            )

    def layer_times(self) -> dict[tuple[str, int, int], dict[int, tuple[float, float, int]]]:
        """``{(device_type, tensor_degree, micro_batch_size): {layer: (forward_s, backward_s, samples)}}``."""
        if not self._has("layer_times"):
            return {}
        out: dict[tuple[str, int, int], dict[int, tuple[float, float, int]]] = {}
        rows = self._db.execute(
            "SELECT device_type, tensor_degree, micro_batch_size, layer, forward_s, backward_s, samples FROM layer_times"
            " ORDER BY device_type, tensor_degree, micro_batch_size, layer"
        )
        for dtype, t, b, layer, f, bw, n in rows:
            out.setdefault((dtype, int(t), int(b)), {})[int(layer)] = (float(f), float(bw), int(n))
        return out

    def record_run_costs(self, device_type: str, tensor_degree: int, micro_batch_size: int, start: int, stop: int,
                         parameter_bytes: float, step_s: float, overhead_s: float) -> None:
        """Store the optimizer step and unexplained seconds of one timing run (replacing an earlier one)."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO run_costs(device_type, tensor_degree, micro_batch_size, start, stop,"
                " parameter_bytes, step_s, overhead_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (device_type, tensor_degree, micro_batch_size, start, stop, parameter_bytes, step_s, overhead_s),
            )

    def run_costs(self) -> dict[tuple[str, int, int], list[tuple[int, int, float, float, float]]]:
        """``{(device_type, tensor_degree, micro_batch_size): [(start, stop, parameter_bytes, step_s, overhead_s)]}``."""
        if not self._has("run_costs"):
            return {}
        out: dict[tuple[str, int, int], list[tuple[int, int, float, float, float]]] = {}
        rows = self._db.execute(
            "SELECT device_type, tensor_degree, micro_batch_size, start, stop, parameter_bytes, step_s, overhead_s"
            " FROM run_costs ORDER BY device_type, tensor_degree, micro_batch_size, start"
        )
        for dtype, t, b, start, stop, nbytes, step, over in rows:
            out.setdefault((dtype, int(t), int(b)), []).append((int(start), int(stop), float(nbytes), float(step), float(over)))
        return out

    def statistics_rows(self) -> list[tuple[str, int, int, str, str, float]]:
        if not self._has("statistics"):
            return []
        return list(
            self._db.execute(
                "SELECT scenario, batch_size, layer, statistic, quantity, value FROM statistics"
                " ORDER BY scenario, batch_size, layer, statistic, quantity"
            )
        )
