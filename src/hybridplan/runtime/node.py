"""The node agent: hybridplan's process on each machine of a multi-node run, which starts torchrun there
for every run the head node asks for, and ends everything it started when the head goes away.

The head (runtime/multinode.py) starts one agent per host through the launcher (``ssh {host}``,
``srun``, ...) and talks to it through the agent's stdin and stdout, one JSON object a line:

- the agent first says hello (``{"hello": hostname, "pid": ..., "error": ...}``; node 0 checks first
  that the rendezvous port is free, and says so in ``error`` if it is not);
- for each run the head sends ``{"run": id, "config": <RunConfig JSON>, "nnodes", "node_rank", "nproc",
  "master_addr", "master_port", "timeout_s"}``; the agent runs ``torchrun --nnodes N --node-rank R
  --nproc-per-node K --master-addr A --master-port P -m hybridplan.runtime.torchrun --config ...
  --report-dir ...`` (torchrun's static rendezvous: node rank R's ranks are R*K .. R*K+K-1, as the plan's
  device indices assume), and answers ``{"run": id, "exit_code", "timed_out", "reports": [...],
  "log_tail"}`` with the report of each of its ranks (runtime/result.py).

Lines the agent writes start with :data:`PREFIX`, so that whatever else a login shell prints is ignored.
The head needs no shared file system: the configuration comes through stdin, the reports go back
through stdout.

No process outlives the head: when the agent's stdin ends (the head exited, however it ended, or the
ssh connection broke) it terminates torchrun and exits; torchrun's ranks, which torchrun starts in
sessions of their own, end with the agent (``HYBRIDPLAN_LAUNCHER_PID``, runtime/lifeline.py). A run
that passes its timeout is ended here, on each node, and reported as timed out.

Deliberately torch-free: the agent starts in a fraction of a second, and the head's start-up checks
(hosts reachable, port free) take no longer than that.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from hybridplan.runtime.scratch import scratch_dir

__all__ = ["PREFIX", "main"]

PREFIX = "hybridplan-node: "
"""The start of every line the agent writes for the head."""
_GRACE_S = 5.0
"""Seconds torchrun gets to end its ranks after SIGTERM before SIGKILL."""
_LAUNCHER_PID = "HYBRIDPLAN_LAUNCHER_PID"  # runtime/torchrun.py LAUNCHER_PID (not imported: it imports torch)
_LOG_TAIL = 2000
"""Characters of torchrun's output sent back with a failed run."""

_current: subprocess.Popen[bytes] | None = None
"""The torchrun running now, ended if the head goes away."""


def main(argv: list[str] | None = None) -> None:
    """Serve the head until its messages end (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m hybridplan.runtime.node")
    parser.add_argument("--check-port", type=int, help="refuse to start if this TCP port is taken here (node 0)")
    parser.add_argument("--check-addr", default="", help="... or if this address is not one of this machine's")
    args = parser.parse_args(argv)
    # Ctrl-C in the head's terminal reaches this process too (``--launcher local``): let the head end
    # the agents by closing their stdin instead, after it has stopped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
    threading.Thread(target=_read_head, args=(messages,), name="hybridplan-head", daemon=True).start()
    error = _cannot_listen(args.check_addr, args.check_port) if args.check_port is not None else None
    _say({"hello": socket.gethostname(), "pid": os.getpid(), "error": error})
    if error is not None:
        return
    while (message := messages.get()) is not None:
        _say(_run(message))


def _read_head(messages: queue.Queue[dict[str, Any] | None]) -> None:
    """Pass the head's messages on; at the end of stdin, end torchrun and this process."""
    for line in sys.stdin:
        if line.strip():
            messages.put(json.loads(line))
    _end(_current)
    os._exit(0)  # the main thread may be waiting for torchrun: do not wait for it


def _cannot_listen(addr: str, port: int) -> str | None:
    """Why the rendezvous can not listen at ``addr:port`` here, or None if it can: the port is taken, or
    the address (``--master-addr``) is not this machine's, where no other node would find the rendezvous."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"--master-addr {addr!r} does not resolve on {socket.gethostname()} ({e.strerror})"
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore: a closed connection's TIME_WAIT is no owner
        try:
            s.bind(where)
            s.listen()
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                return f"--master-addr {addr!r} is not an address of {socket.gethostname()}, the first host"
            return f"port {port} on {socket.gethostname()} is not free ({e.strerror})"
    return None


def _run(message: dict[str, Any]) -> dict[str, Any]:
    """Run this node's part of one run; the answer for the head."""
    global _current
    with scratch_dir("node") as tmp:  # a killed agent's folder is removed by the next one on this host
        config, reports, log = Path(tmp) / "run.json", Path(tmp) / "reports", Path(tmp) / "torchrun.log"
        config.write_text(message["config"])
        reports.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(message["nnodes"]),
               "--node-rank", str(message["node_rank"]), "--nproc-per-node", str(message["nproc"]),
               "--master-addr", message["master_addr"], "--master-port", str(message["master_port"]),
               "-m", "hybridplan.runtime.torchrun", "--config", str(config), "--report-dir", str(reports)]
        env = {**os.environ, _LAUNCHER_PID: str(os.getpid())}
        with log.open("wb") as out:
            _current = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # the agent alone ends it (a terminal's Ctrl-C does not)
            timed_out = False
            try:
                code = _current.wait(timeout=float(message["timeout_s"]))
            except subprocess.TimeoutExpired:
                timed_out = True
                _end(_current)
                code = _current.wait()
        _current = None
        found = [json.loads(p.read_text()) for p in sorted(reports.glob("rank*.json"))]
        tail = log.read_bytes()[-_LOG_TAIL:].decode(errors="replace") if code != 0 else ""
    return {"run": message["run"], "exit_code": code, "timed_out": timed_out, "reports": found, "log_tail": tail}


def _end(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate torchrun (it ends its ranks), then kill it after :data:`_GRACE_S`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _say(message: dict[str, Any]) -> None:
    try:
        sys.stdout.write(PREFIX + json.dumps(message) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the head is gone: the reader thread is ending torchrun and this process
        _end(_current)
        os._exit(0)


if __name__ == "__main__":
    main()
