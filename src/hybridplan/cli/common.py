"""Options shared by several commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridplan.cluster import Cluster

if TYPE_CHECKING:
    from hybridplan.plan import Plan
    from hybridplan.predict.memory import MemoryPredictor
    from hybridplan.predict.time_profile import TimeProfile


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="zoo name (see 'hybridplan models') or module:function")


def add_cluster(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--cluster", required=required, help="NxK (N nodes of K devices) or a cluster TOML file")
    p.add_argument("--device-memory", help="per-device memory capacity, e.g. 200MiB or 40GB (overrides the cluster's)")


def cluster_from(args: argparse.Namespace) -> Cluster:
    return Cluster.parse(args.cluster, device_memory=args.device_memory)


def add_training(p: argparse.ArgumentParser) -> None:
    """Training settings shared by run, profile and validate (runtime/config.py RunConfig)."""
    p.add_argument("--backend", choices=("real", "sim"), default="real",
                   help="real: one process per device (default); sim: fake tensors, no device memory needed")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="device type; with --backend sim, cuda reports peaks in CUDA allocator terms")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or mixed precision with fp32 master weights (default fp32)")
    p.add_argument("--loss-scale", type=float, help="static loss scale of fp16 runs (default 128)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each layer's activations in backward")


def training_options(args: argparse.Namespace) -> dict:
    """The RunConfig fields of :func:`add_training`'s options."""
    return {
        "backend": args.backend,
        "device_type": args.device,
        "precision": args.precision,
        "loss_scale": args.loss_scale,
        "activation_checkpointing": args.activation_checkpointing,
    }


def profile_meta(db: str | None) -> dict:
    """The profile database's settings (empty without a database)."""
    from hybridplan.profiling.store import ProfileStore

    if not db:
        return {}
    with ProfileStore(db, create=False) as store:
        return store.meta()


def find_time_profile(path: str | None, db: str | None) -> TimeProfile | None:
    """The layer-time profile: the JSON file ``path`` if given, else the layer times of database ``db``, else None."""
    from hybridplan.predict.time_profile import TimeProfile
    from hybridplan.profiling.store import ProfileStore
    from hybridplan.profiling.timing import time_profile_from_store

    if path:
        return TimeProfile.load(path)
    if db:
        with ProfileStore(db, create=False) as store:
            if store.get_meta("time_layers") is not None:
                return time_profile_from_store(store, warn=lambda msg: print(msg, file=sys.stderr))
    return None


def load_time_profile(path: str | None, db: str | None) -> TimeProfile:
    """:func:`find_time_profile`, required.

    Raises:
        UsageError: if neither ``path`` nor ``db`` gives layer times.
    """
    from hybridplan.errors import UsageError

    profile = find_time_profile(path, db)
    if profile is None:
        raise UsageError(
            "a time prediction needs layer times" + (f", and {db!r} holds none" if db else ""),
            fix="give --time-profile FILE, or a --db measured with 'hybridplan profile --time'",
        )
    return profile


def load_memory_predictor(db: str | None, **targets: Any) -> MemoryPredictor | None:
    """The memory predictor of database ``db`` (None without one, or if it holds no memory campaign)."""
    from hybridplan.predict.memory import MemoryPredictor

    meta = profile_meta(db)
    if "num_layers" not in meta or "batch_sizes" not in meta:
        return None
    return MemoryPredictor.from_db(db, **{k: v for k, v in targets.items() if v is not None})


def output_plan(args: argparse.Namespace, plan: Plan) -> bool:
    """Write ``plan`` to ``--out`` if given, and print its JSON if ``--json``; True when it was printed,
    so the command prints nothing else (its stdout is the JSON)."""
    if args.out:
        Path(args.out).write_text(plan.to_json())
    if args.json:
        print(plan.to_json(), end="")
        return True
    return False
