"""Simulated stage measurements, each distinct one simulated once and kept on disk between commands.

[Note: a simulated stage is a function of its layers' signatures] A simulated profiling run measures one device
of each measured stage (profiling/execution.py ``simulate_stages``), and what that device holds and does is fixed
by: which layers it builds (their :meth:`~hybridplan.models.base.LayeredModel.layer_signature`, not their
indices: a Llama's decoder layers are one layer), whether it holds the batch's inputs (``start == 0``) and
computes the loss (``stop == L``), the shape it receives, its kind, degree and ZeRO level, its micro-batch size,
how many micro-batches it runs and how many forwards it runs ahead (its warm-up, from its schedule and position),
the iterations, the training options (precision, device type, recompute, loss scale), the seed, the capacity
that would stop it, and the code that simulates it (torch's version, hybridplan's runtime and models).
Neighbouring stages do not enter (runtime/sim.py, [Note: simulating one device per stage]). So a campaign over
80 identical decoder layers simulates each distinct span once, not once per place it occurs; and two campaigns
(another cluster, another batch that gives the same micro-batch sizes) share what they measured. A layer whose
signature is None is its own: nothing is shared for it.

A stage's entry is its measurement as simulated (start level, unscaled data share, per-action timeline, the
CUDA reserved pair and workspaces), so a campaign served from the memo writes the database a campaign that
simulated everything writes, to the byte (tests/profiling/test_stage_memo.py).

On disk (:class:`StageMemo` with a directory) each entry is one JSON file named by the SHA-256 of its key and
holding the key itself and a digest of the value: a file that does not parse, whose key differs (a hash
collision) or whose digest does not match is removed and the stage simulated again, never trusted. Writers
write a private temporary file and rename it into place, so concurrent commands never see half an entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StageMemo", "code_digest", "span_identity", "LAYER_CLASSES_META"]

LAYER_CLASSES_META = "layer_classes"
"""Profile meta: each layer's signature, recorded where the campaign guarantees that spans of equal signatures
measure alike ([Note: identical spans predict alike] in predict/span_tables.py)."""

_CODE_FOLDERS = ("runtime", "models")
"""What simulates a stage: a change there may change what a stage holds, so it changes every key."""

_code_digests: dict[tuple[str, ...], str] = {}


def code_digest(folders: tuple[str, ...] = _CODE_FOLDERS) -> str:
    """SHA-256 over torch's version and the source of hybridplan's ``folders`` (by default the runtime and the
    models, which make a simulated stage what it is; computed once a process)."""
    if folders not in _code_digests:
        from importlib.metadata import version

        h = hashlib.sha256(version("torch").encode())  # the installed torch's, without importing it (a second)
        root = Path(__file__).resolve().parent.parent
        for folder in folders:
            for path in sorted((root / folder).rglob("*.py")):
                h.update(path.relative_to(root).as_posix().encode())
                h.update(path.read_bytes())
        _code_digests[folders] = h.hexdigest()
    return _code_digests[folders]


def span_identity(model: Any, start: int, stop: int, specs: list[Any]) -> list[Any] | None:
    """What a stage over layers ``[start, stop)`` of ``model`` is, apart from its position ([Note: a simulated
    stage is a function of its layers' signatures]); None when a layer has no signature (nothing to share)."""
    signatures = [model.layer_signature(i) for i in range(start, stop)]
    if any(s is None for s in signatures):
        return None
    config = {k: v for k, v in model.config().items() if k != "name"}
    received = repr(specs[start]) if 0 < start < len(specs) else None
    return [config, signatures, start == 0, stop == model.num_layers, received]


class StageMemo:
    """Measurements of simulated stages by key; in memory, and in ``directory`` when one is given.

    Args:
        directory: where entries are kept (created); None keeps them for this process only.
        on_unusable: called once with a line when ``directory`` cannot be written (the memo then works in memory).
    """

    def __init__(self, directory: str | Path | None = None, *, on_unusable: Callable[[str], None] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, dict[str, Any]] = {}
        self.hits = 0
        self.misses = 0
        self.rebuilt = 0
        """Entries found on disk unreadable or not matching their key, and simulated again."""
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                probe = self.directory / f".probe-{uuid.uuid4().hex}"
                probe.write_text("")
                probe.unlink()
            except OSError as e:
                if on_unusable is not None:
                    on_unusable(f"note: the cache {str(self.directory)!r} cannot be written ({e.strerror or e}): working"
                                " without it (nothing is kept for the next command)")
                self.directory = None

    @staticmethod
    def key_of(identity: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The measurement stored under ``identity``, or None (a damaged entry is removed: see the module note)."""
        key = self.key_of(identity)
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        value = self._read(self.directory, key, identity) if self.directory is not None else None
        if value is None:
            self.misses += 1
            return None
        self._memory[key] = value
        self.hits += 1
        return value

    def put(self, identity: dict[str, Any], value: dict[str, Any]) -> None:
        """Keep ``value`` under ``identity`` (on disk atomically; a failed write only loses the disk copy)."""
        key = self.key_of(identity)
        self._memory[key] = value
        if self.directory is None:
            return
        text = json.dumps({"key": json.loads(json.dumps(identity, default=str)), "value": value,
                           "digest": _digest(value)})  # the value's key order kept: a hit reads what a miss gave
        path = self.directory / f"{key}.json"
        tmp = self.directory / f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)

    def cached(self, identity: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """``compute()``'s value (JSON data) kept under ``identity``: computed on a miss, read on a hit (in its JSON
        form both times, so a hit and a miss give equal values)."""
        entry = self.get(identity)
        if entry is not None:
            return entry["v"]
        value = json.loads(json.dumps(compute()))
        self.put(identity, {"v": value})
        return value

    def _read(self, directory: Path, key: str, identity: dict[str, Any]) -> dict[str, Any] | None:
        path = directory / f"{key}.json"
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            entry = json.loads(data.decode())
            ok = (isinstance(entry, dict) and entry.get("key") == json.loads(json.dumps(identity, default=str))
                  and isinstance(entry.get("value"), dict) and entry.get("digest") == _digest(entry["value"]))
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            self.rebuilt += 1
            path.unlink(missing_ok=True)
            return None
        return entry["value"]


def _digest(value: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
