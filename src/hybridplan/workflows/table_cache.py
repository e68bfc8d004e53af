"""The search's stage matrices kept on disk, so that a question asked again is answered without predicting again.

A memory search asks the predictor for every stage of its space: ``stage_memory_matrix(kind, degree, position,
L, ...)`` for every stage configuration and pipeline position (search/memory/objective.py ``StageTable``), which
for Llama-2-7B on 2x8 (88 configurations, 8 positions, 34 layers) takes most of a warm ``plan`` (7-12 s). The
matrices are a function of the profile databases, the targets the predictor was made for and the code that
predicts; :func:`table_memo` keeps them in one ``.npz`` file named by the SHA-256 of exactly that, read before
the search and rewritten (atomically) when the search computed new ones. A damaged or unreadable file is
ignored and rebuilt; an unwritable folder only costs the next search its time.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["table_memo"]

_CODE = ("predict", "profiling")
"""The packages whose code makes a stage matrix from a profile."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def table_memo(predictor: Any, folder: Path | None, *, dbs: list[Path], options: dict[str, Any]) -> Iterator[None]:
    """Give ``predictor`` the stage matrices kept for its profiles and ``options`` in ``folder`` (None: none),
    and keep what it computed by the end of the block."""
    if folder is None:
        yield
        return
    from hybridplan.profiling.stage_memo import code_digest

    identity = {"code": code_digest(_CODE), "dbs": [_digest(p) for p in dbs], "options": options}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]
    path = folder / f"{key}.npz"
    predictor.matrices = {}
    try:
        with np.load(path, allow_pickle=False) as kept:
            predictor.matrices = {name: kept[name] for name in kept.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # no file yet, or a damaged one: computed again and rewritten
    known = len(predictor.matrices)
    try:
        yield
    finally:
        if len(predictor.matrices) > known:
            tmp = folder / f".{key}.{os.getpid()}.{uuid.uuid4().hex}.npz"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                _write(tmp, predictor.matrices)
                os.replace(tmp, path)
            except OSError:
                pass  # an unwritable cache: the next search computes them again
            finally:
                tmp.unlink(missing_ok=True)


def _write(path: Path, matrices: dict[str, np.ndarray]) -> None:
    """``matrices`` as an ``.npz`` file (``np.load`` reads it) compressed at zlib's fastest level: mostly inf and
    repeats, they take a tenth of their bytes even so (Llama-3-70B on 32x8: 14,336 matrices, 780 MB, 24.5 MB on disk
    written in 1.5 s, where ``np.savez_compressed``'s default level took 3.7 s for 20.3 MB)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, matrix in matrices.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(matrix), allow_pickle=False)
