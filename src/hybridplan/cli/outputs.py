"""The files a command writes (``--out``, ``--db``, ``--png``, ...): checked before any work, written whole, never lost.

[Note: what an output path may be]
- A regular file, or a path that does not exist yet: written into a temporary file beside it, then renamed over it
  (``os.replace``), so a reader never sees half a file and a failed write leaves the old one.
- A symbolic link: followed. The file it points to is written (beside it, then renamed over it) and the link is kept,
  as ``echo > link`` would do; a dangling link creates the file it names. Renaming over the link itself would replace
  the link by a file and leave its target unchanged, which is never what was asked.
- Anything else that exists (a directory, a FIFO, a device such as /dev/null or /dev/full, a socket): refused, before
  any work and again when the result is written. A rename would replace it by a regular file (as root,
  ``--out /dev/null`` would replace the system's /dev/null); writing into it in place would lose the result or block.
A finished result whose write fails at the end (the folder went away, the disk filled, the target became a FIFO) is
written to a file in the temporary folder instead, and the command says where (exit code 2).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

from hybridplan.errors import UsageError

__all__ = ["check_output", "write_output"]


def _target(path: Path) -> Path:
    """The file a write to ``path`` changes: ``path``, or the file its symbolic links lead to (see the note)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists and is no regular file (following symbolic links); None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing (or unreadable: the write will say)
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def _temporary(target: Path) -> Path:
    """The temporary file a write to ``target`` goes through: beside it, so that the rename stays on one file system."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def check_output(path: str | Path | None, option: str) -> None:
    """Fail now, before any work, if ``path`` cannot be written as :func:`write_output` writes it.

    The check writes: it creates the temporary file :func:`write_output` would use beside the target and removes it
    again. Permission bits alone would not do (root may write anywhere, yet not into a missing folder, a read-only
    file system or a path that is a folder).

    Raises:
        UsageError: naming the option, the path and why: a directory, a FIFO, a device or a socket (see the module's
            note), or a folder that cannot be written.
    """
    if path is None:
        return
    p = Path(path)
    target = _target(p)
    kind = _not_regular(target)
    if kind == "a directory":
        raise UsageError(f"{option} {str(p)!r} is a directory", fix=f"give a file name, e.g. {option} {p / 'out.json'}")
    if kind is not None:
        raise UsageError(f"{option} {str(p)!r} is {kind}, not a regular file: writing would replace it",
                         fix="give the path of a regular file (a new one, or one to overwrite)")
    tmp = _temporary(target)
    try:
        with open(tmp, "x"):
            pass
    except OSError as e:
        raise UsageError(f"{option} {str(p)!r} cannot be written: {e.strerror or e}",
                         fix="choose a path in an existing folder you can write to") from None
    tmp.unlink()


def write_output(path: str | Path, text: str, option: str) -> None:
    """Write a finished result to ``path`` as the module's note says; if that fails now (the folder went away, the
    disk filled, the path became something other than a file), write it to a file in the temporary folder instead,
    so the result is never lost, and say where.

    Raises:
        UsageError: after the fallback was written, naming both paths (exit code 2).
    """
    p = Path(path)
    target = _target(p)
    tmp = _temporary(target)
    kind = _not_regular(target)
    if kind is not None:
        reason = f"it is {kind} now"
    else:
        try:
            tmp.write_text(text)
            if target.exists():  # the new file keeps the old one's permissions
                os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
            os.replace(tmp, target)
            return
        except OSError as e:
            reason = e.strerror or str(e)
            with contextlib.suppress(OSError):
                tmp.unlink()
    fallback = Path(tempfile.gettempdir()) / f"hybridplan-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{p.name or 'output'}"
    try:
        fallback.write_text(text)
    except OSError as e:  # nowhere to write: the text goes to the terminal rather than nowhere
        print(text, file=sys.stderr)
        raise UsageError(f"could not write {option} {str(p)!r} ({reason}) nor {str(fallback)!r} ({e.strerror or e});"
                         " the result was printed above") from None
    raise UsageError(f"could not write {option} {str(p)!r} ({reason}); the result was written to {str(fallback)!r}",
                     fix="move it where you want it, and check the output path next time")
