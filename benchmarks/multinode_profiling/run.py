"""Multi-node profiling against local profiling: the same campaign written by local processes and by torchrun
on two "nodes" of this machine (``profile --hosts 127.0.0.1,127.0.0.1 --launcher local``): are the databases
equal, and what does a run cost through torchrun?

Run from the repository root (a few minutes on 2 cores)::

    nice -n 5 .venv/bin/python -m benchmarks.multinode_profiling.run

Covers the slow test tests/cli/test_profile.py ``test_tensor_groups_across_two_nodes_of_two_devices_write_the_local_database``.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from hybridplan.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
MODEL = "tests.cli.user_models:mlp2"  # Linear(16, 32) + ReLU, Linear(32, 10): two layers
CASES = [("2x1", "pipeline"), ("2x2", "pipeline,tensor2")]


def _rows(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table but run durations and end times."""
    with sqlite3.connect(db) as conn:
        out = {}
        for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            cols = [c[1] for c in conn.execute(f"PRAGMA table_info({t})") if c[1] not in ("wall_seconds", "finished_at")]
            out[t] = sorted(conn.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall(), key=repr)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _campaign(args: list[str]) -> tuple[float, int, float]:
    """Seconds, runs, and the mean seconds per run (from the database) of one profile command."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli(args)
    if code != 0:
        raise SystemExit(f"{args} exited with {code}")
    seconds = time.perf_counter() - started
    db = args[args.index("--db") + 1]
    with sqlite3.connect(db) as conn:
        runs, mean = conn.execute("SELECT COUNT(*), AVG(wall_seconds) FROM runs").fetchone()
    return seconds, int(runs), float(mean)


def main() -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    print(f"load average before: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("| cluster | scenarios | runs | local s | local s/run | 2 nodes s | 2 nodes s/run | databases equal |")
    print("|---|---|--:|--:|--:|--:|--:|:-:|")
    with tempfile.TemporaryDirectory() as tmp:
        for cluster, scenarios in CASES:
            base = ["profile", "--model", MODEL, "--cluster", cluster, "--global-batch-size", "8", "--num-microbatches",
                    "2", "--scenarios", scenarios]
            local, multi = Path(tmp) / f"local-{cluster}.sqlite", Path(tmp) / f"multi-{cluster}.sqlite"
            l_s, runs, l_run = _campaign([*base, "--db", str(local)])
            m_s, m_runs, m_run = _campaign([*base, "--db", str(multi), "--hosts", "127.0.0.1,127.0.0.1", "--launcher",
                                            "local", "--master-port", str(_free_port())])
            equal = _rows(local) == _rows(multi) and runs == m_runs
            print(f"| {cluster} | {scenarios} | {runs} | {l_s:.1f} | {l_run:.1f} | {m_s:.1f} | {m_run:.1f} | {'yes' if equal else 'NO'} |",
                  flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
