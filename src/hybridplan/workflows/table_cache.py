"""The search's stage matrices (and the throughput search's stage peaks) kept on disk, so that a question asked
again is answered without predicting again.

A memory search asks the predictor for every stage of its space: ``stage_memory_matrix(kind, degree, position,
L, ...)`` for every stage configuration and pipeline position (search/memory/objective.py ``StageTable``), which
for Llama-2-7B on 2x8 (88 configurations, 8 positions, 34 layers) takes most of a warm ``plan`` (7-12 s). The
matrices are a function of the profile databases, the targets the predictor was made for and the code that
predicts; :func:`table_memo` keeps them in one ``.npz`` file named by the SHA-256 of exactly that, read before
the search and rewritten (atomically) when the search computed new ones. A damaged or unreadable file is
ignored and rebuilt; an unwritable folder only costs the next search its time.

A throughput search (search/time/throughput.py) asks its feasibility check for the stage matrices of every
micro-batch size it tries and for the per-stage peaks of every plan whose stage options it weighs (a whole plan
predicted per option: 3,640 of them for Llama-3-70B on 32x8, about half of a warm question); :func:`feasibility_memo`
keeps both, and its verdict on each plan it checked whole (kept, or why not, and the plan's peak), the same way,
named also by the targets, the cluster's capacities and the model they were checked against.
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

__all__ = ["table_memo", "feasibility_memo"]

_CODE = ("predict", "profiling")
"""The packages whose code makes a stage matrix from a profile."""
_SEARCH_CODE = ("plan", "models", "predict", "profiling", "search")
"""The packages whose code makes the throughput search's stage matrices and peaks (validity by the model's rules,
the capacities' comparisons)."""


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
    path = _path(folder, _CODE, dbs, options)
    predictor.matrices = _read(path)
    known = len(predictor.matrices)
    try:
        yield
    finally:
        if len(predictor.matrices) > known:
            _replace(path, predictor.matrices)


@contextmanager
def feasibility_memo(fit: Any, folder: Path | None, *, dbs: list[Path], options: dict[str, Any]) -> Iterator[None]:
    """Give the throughput search's feasibility check ``fit`` (search/time/feasibility.py) the stage matrices, stage
    peaks and verdicts kept for its profiles and ``options`` in ``folder`` (None: none), and keep what it computed
    by the end of the block. ``options`` must name everything else they depend on: the targets, the cluster's
    capacities, the model. The peaks are kept as one padded table (a row per plan, NaN past its stages) with the
    plans' keys beside it, the verdicts as four columns."""
    if folder is None:
        yield
        return
    path = _path(folder, _SEARCH_CODE, dbs, {"feasibility": True, **options})
    kept = _read(path)
    peaks = _columns(kept, ("peak_keys", "peaks"))
    verdicts = _columns(kept, ("verdict_keys", "verdict_kinds", "verdict_reasons", "verdict_peaks"))
    fit.matrices.update(kept)
    if peaks is not None:
        fit.peaks.update({str(k): [float(v) for v in row if not np.isnan(v)] for k, row in zip(*peaks)})
    if verdicts is not None:
        fit.verdicts.update({str(k): (str(kind), str(reason), float(peak)) for k, kind, reason, peak in zip(*verdicts)})
    known = len(fit.matrices), len(fit.peaks), len(fit.verdicts)
    try:
        yield
    finally:
        if (len(fit.matrices), len(fit.peaks), len(fit.verdicts)) != known:
            width = max((len(v) for v in fit.peaks.values()), default=0)
            table = np.full((len(fit.peaks), width), np.nan)
            for row, values in zip(table, fit.peaks.values()):
                row[:len(values)] = values
            kinds, reasons, plan_peaks = zip(*fit.verdicts.values()) if fit.verdicts else ((), (), ())
            _replace(path, {**fit.matrices, "peak_keys": np.array(list(fit.peaks), dtype=str), "peaks": table,
                            "verdict_keys": np.array(list(fit.verdicts), dtype=str),
                            "verdict_kinds": np.array(kinds, dtype=str), "verdict_reasons": np.array(reasons, dtype=str),
                            "verdict_peaks": np.array(plan_peaks, dtype=float)})


def _columns(kept: dict[str, np.ndarray], names: tuple[str, ...]) -> list[np.ndarray] | None:
    """The arrays ``names`` taken out of ``kept``, where all are there and of one length (else None: not trusted)."""
    found = [kept.pop(name, None) for name in names]
    arrays = [a for a in found if a is not None]
    return arrays if len(arrays) == len(names) and len({len(a) for a in arrays}) == 1 else None


def _path(folder: Path, code: tuple[str, ...], dbs: list[Path], options: dict[str, Any]) -> Path:
    """The file of what the code of ``code``'s packages computes from the profiles ``dbs`` for ``options``."""
    from hybridplan.profiling.stage_memo import code_digest

    identity = {"code": code_digest(code), "dbs": [_digest(p) for p in dbs], "options": options}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return folder / f"{key}.npz"


def _read(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``path``; none where it is missing or damaged (then computed again and rewritten)."""
    try:
        with np.load(path, allow_pickle=False) as kept:
            return {name: kept[name] for name in kept.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return {}


def _replace(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` under a private name and rename it into place; an unwritable folder only costs
    the next search its time."""
    tmp = path.parent / f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex}.npz"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(tmp, arrays)
        os.replace(tmp, path)
    except OSError:
        pass
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
