"""The process of one locally launched device: tie itself to the launcher, join the process group,
run its rank, write its report, exit with its code.

The real-process backend (runtime/processes.py) starts one such process per device through a
forkserver that has imported this module (and so torch) once. The rank writes its report
(:class:`~hybridplan.runtime.result.RankReport` or :class:`~hybridplan.runtime.result.RankFailure`, as
JSON) to ``rank<N>.json`` in the launcher's report folder and exits with the matching code of
runtime/result.py.

Ranks on several machines are started by torchrun instead (runtime/torchrun.py); ``python -m
hybridplan.runtime.worker --config ... --out ...``, that entry point's former name, still runs it.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from hybridplan.models.boundaries import BoundarySpec
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.lifeline import tie_to_launcher
from hybridplan.runtime.rank import process_group_backend, process_group_device, rank_failure, run_rank
from hybridplan.runtime.result import EXIT_OK, RankFailure, RankReport, save_report

__all__ = ["spawn_entry"]


def spawn_entry(
    rank: int,
    world: int,
    cfg: RunConfig,
    store_port: int,
    report_dir: str,
    launcher_pid: int,
    specs: list[BoundarySpec] | None = None,
) -> None:
    """Entry point of a locally spawned rank: never returns (exits with 0, 1 failed, or 3 out of memory).

    The rank ends at once (code 4) if process ``launcher_pid`` dies (runtime/lifeline.py): its parent is
    the forkserver, which would otherwise keep it running.
    """
    tie_to_launcher(launcher_pid)
    torch.set_num_threads(1)
    report: RankReport | RankFailure
    try:
        store = dist.TCPStore("127.0.0.1", store_port, world + 1, is_master=False, timeout=timedelta(seconds=cfg.timeout_s))
        if cfg.device_type == "cuda":
            torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
        device = torch.device(cfg.device_type, rank % max(1, torch.cuda.device_count())) if cfg.device_type == "cuda" else torch.device("cpu")
        backend = process_group_backend(cfg.device_type, share_gpu=cfg.share_gpu)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg.timeout_s),
                                device_id=process_group_device(device, share_gpu=cfg.share_gpu))
        report = run_rank(rank, cfg, device=device, specs=specs)
        code = EXIT_OK
    except BaseException as exc:  # every failure must reach the launcher as a report
        report = rank_failure(rank, exc)
        code = report.exit_code
    save_report(report, report_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: peers may be gone and gloo's destructors can block


if __name__ == "__main__":  # the torchrun entry point's former name (module docstring)
    from hybridplan.runtime.torchrun import main

    main(prog="python -m hybridplan.runtime.worker")
