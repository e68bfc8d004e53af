"""Tie a locally launched rank to its launcher, so that no rank outlives it, whatever killed it.

[Note: ranks are the forkserver's children]
The launcher (runtime/processes.py) starts its ranks through multiprocessing's forkserver, so a rank's
parent is the forkserver, not the launcher: ``PR_SET_PDEATHSIG`` alone ties a rank to the forkserver.
And the forkserver ends only when the read end of its "alive" pipe reaches end of file, while every
process it forks receives a copy of the write end (CPython's multiprocessing/forkserver.py,
``connect_to_new_process`` and ``_serve_one``). So after ``kill -9`` of the launcher the ranks kept the
forkserver alive and the forkserver kept the ranks alive, training for as long as the run lasted.

:func:`tie_to_launcher`, called first thing in each rank, breaks that cycle three ways:

1. A daemon thread waits for the launcher to exit and then ends the rank at once (``os._exit``). It
   waits on ``os.pidfd_open(launcher)``, which becomes readable when that process exits (a zombie
   counts: nobody may ever reap a killed launcher) and cannot be fooled by pid reuse; where pidfds are
   unavailable (Linux before 5.3, other systems, some seccomp profiles) it checks the pid every
   ``_POLL_S`` seconds instead.
2. The rank closes its copy of the forkserver's alive pipe, so only the launcher holds the write end:
   the forkserver (and the resource tracker, whose pipe the ranks also hold) then ends with the launcher
   instead of with the last rank, while a launcher that lives on reuses the same forkserver for its next
   run.
3. ``PR_SET_PDEATHSIG``: the kernel kills the rank when the forkserver exits. This backs up the thread
   for a rank stuck in native code that holds the GIL, where the thread could not run.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hybridplan.runtime.result import EXIT_LAUNCHER_GONE

__all__: list[str] = []

_POLL_S = 0.5
"""Seconds between checks of the launcher's pid where no pidfd can be opened: an orphan lingers at most this long."""


def tie_to_launcher(launcher_pid: int) -> None:
    """End this process within a moment of the death of process ``launcher_pid``, and let the forkserver
    that forked it end with the launcher too. Ends this process at once if the launcher is already gone.

    Args:
        launcher_pid: the process id of the launcher, taken by the launcher just before it started the
            ranks (a rank starts within a second, far too soon for the pid to be reused).
    """
    _die_with_parent()
    _release_forkserver()
    wait = _launcher_exit_waiter(launcher_pid)
    threading.Thread(target=_end_after, args=(wait,), name="hybridplan-lifeline", daemon=True).start()


def _end_after(wait: Callable[[], None]) -> None:
    wait()
    os._exit(EXIT_LAUNCHER_GONE)  # no cleanup: peers are going too, and gloo's destructors can block


def _launcher_exit_waiter(pid: int) -> Callable[[], None]:
    """A function that returns once process ``pid`` has exited (ends this process now if it has)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(EXIT_LAUNCHER_GONE)
    except (AttributeError, OSError):  # no pidfd_open here: poll the pid
        return lambda: _poll_until_gone(pid)

    def wait_readable() -> None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll():  # blocks without the GIL; an empty result is only a spurious wake-up
            pass

    return wait_readable


def _poll_until_gone(pid: int) -> None:
    while _exists(pid):
        time.sleep(_POLL_S)


def _exists(pid: int) -> bool:
    """Whether ``pid`` is a living process of this user (a zombie, or another user's process that
    took over the pid, is not the launcher any more)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc: trust kill
        return True


def _release_forkserver() -> None:
    """Close this process's copy of the write end of the forkserver's alive pipe (see the note above).

    A rank never starts processes through the forkserver itself, so it needs no copy. Without one
    (a rank not started by a forkserver) this does nothing.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is None or fd is None:
        return
    try:
        os.close(fd)
    except OSError:  # already closed: nothing holds the forkserver through this process
        pass
    server._forkserver_alive_fd = None


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the forkserver) exits."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the watchdog thread still applies
        pass
