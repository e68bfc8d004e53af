"""Run a plan on several machines: the entry point of the processes torchrun starts, one per device.

::

    hybridplan run --model gpt-tiny --cluster 2x4 --plan plan.json --write-config run.json
    torchrun --nnodes 2 --nproc-per-node 4 ... -m hybridplan.runtime.torchrun --config run.json --out result.json

torchrun sets up the rendezvous (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, the store); each process runs
its rank (runtime/rank.py), then rank 0 gathers every rank's report and writes the result, as the local
launcher does (runtime/result.py ``aggregate``). There is no watchdog here: torchrun ends the other
processes when one fails.

Started by hybridplan's own multi-node launcher (runtime/multinode.py, through the node agent of
runtime/node.py), each rank also writes its report to ``--report-dir`` (as a locally launched rank does,
so that the launcher finds a failed run's root cause the same way) and ends with the exit code of
runtime/result.py; and it ends itself when the node agent, named by ``HYBRIDPLAN_LAUNCHER_PID``, dies
(runtime/lifeline.py): torchrun starts its ranks in sessions of their own, which a signal to torchrun's
process group does not reach. ``python -m hybridplan.runtime.worker`` is this entry point's former name and
still runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from hybridplan.runtime.config import config_from_json
from hybridplan.runtime.rank import process_group_backend, process_group_device, rank_failure, run_rank
from hybridplan.runtime.lifeline import tie_to_launcher
from hybridplan.runtime.result import RankReport, aggregate, save_report

__all__ = ["main", "LAUNCHER_PID"]

LAUNCHER_PID = "HYBRIDPLAN_LAUNCHER_PID"
"""Environment variable naming the process whose death ends every rank (runtime/node.py sets it)."""


def main(argv: list[str] | None = None, *, prog: str = "python -m hybridplan.runtime.torchrun") -> NoReturn:
    """Run this process's rank of the run in ``--config``; rank 0 writes the result to ``--out``.

    Never returns: a finished rank ends the process with code 0 (see the end); a failing rank raises
    (rank 0 after writing ``{"status", "reason"}`` to ``--out``), so that torchrun sees the failure.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", required=True, help="run configuration written by 'hybridplan run --write-config'")
    parser.add_argument("--out", help="result JSON (written by rank 0)")
    parser.add_argument("--report-dir", help="folder on this machine where each of its ranks writes rank<N>.json")
    args = parser.parse_args(argv)
    if not (args.out or args.report_dir):
        parser.error("give --out (the result, written by rank 0), --report-dir (each rank's report), or both")
    if os.environ.get(LAUNCHER_PID):
        tie_to_launcher(int(os.environ[LAUNCHER_PID]))
    cfg = config_from_json(Path(args.config).read_text())
    if cfg.backend != "real":
        parser.error(f"{args.config} asks for backend {cfg.backend!r}; torchrun runs real devices only"
                     " (simulate with hybridplan.runtime.launch.launch, in one process)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(1)
    if cfg.share_gpu and cfg.device_type == "cuda":  # several processes per GPU (runtime/shared_gpu.py)
        local %= max(1, torch.cuda.device_count())
    device = torch.device("cuda", local) if cfg.device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(cfg.device_type, share_gpu=cfg.share_gpu),
                            timeout=timedelta(seconds=cfg.timeout_s),
                            device_id=process_group_device(device, share_gpu=cfg.share_gpu))
    try:
        report = run_rank(rank, cfg, device=device)
    except BaseException as exc:
        failure = rank_failure(rank, exc)
        if rank == 0 and args.out:
            Path(args.out).write_text(json.dumps({"status": failure.status, "reason": failure.reason}))
        if not args.report_dir:
            raise
        save_report(failure, args.report_dir)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(failure.exit_code)  # torchrun sees the failure and ends the other ranks
    if args.report_dir:
        save_report(report, args.report_dir)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, report.to_dict())
    if rank == 0 and args.out:
        aggregate(cfg, [RankReport.from_dict(d) for d in gathered], wall_seconds=None).save(args.out)
    dist.barrier()  # every rank has finished the gather before any rank's sockets close
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip destroy_process_group and interpreter teardown: on CPU, gloo's background threads
    # occasionally abort the process ("terminate called without an active exception") while
    # being torn down, which torchrun reports as a failed rank after a successful run.
    os._exit(0)


if __name__ == "__main__":
    main()
