"""The temporary folders of runs (a launcher's report folder, a node agent's run folder, the link probe's), and the
removal of those a killed process left behind.

A folder made with :func:`tempfile.TemporaryDirectory` is removed when its ``with`` block ends, which a process
ended by ``kill -9`` (or a power loss) never reaches: each such end left a ``/tmp/hybridplan-run-*`` behind. So each
folder's name carries the id of the process that owns it (``hybridplan-run-<pid>-<random>``), and every new one first
removes the folders of its kind whose owner is no longer running (and belongs to this user). A folder of a process
that is alive is never touched, whichever process it is; a pid reused since is taken for alive, which only delays
the removal of its folder. Folders named otherwise (older versions') are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["scratch_dir", "remove_stale"]


@contextmanager
def scratch_dir(kind: str) -> Iterator[str]:
    """A new temporary folder ``hybridplan-<kind>-<pid>-...`` for this process, removed at the end of the block;
    the stale folders of ``kind`` are removed first (:func:`remove_stale`)."""
    remove_stale(kind)
    with tempfile.TemporaryDirectory(prefix=f"hybridplan-{kind}-{os.getpid()}-") as folder:
        yield folder


def remove_stale(kind: str, parent: str | None = None) -> list[str]:
    """Remove the folders ``hybridplan-<kind>-<pid>-*`` in ``parent`` (the temporary folder) of this user whose
    process ``pid`` has ended; returns their paths. Never raises: a folder that cannot be removed stays."""
    parent = parent or tempfile.gettempdir()
    pattern = re.compile(rf"^hybridplan-{re.escape(kind)}-(\d+)-")
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        try:
            if match is None or not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists, of any user (a zombie counts: cheap to wait for, and never wrong)."""
    if pid <= 0:
        return True  # no process of ours: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
