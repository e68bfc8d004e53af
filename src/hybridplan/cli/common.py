"""Options shared by several commands."""

from __future__ import annotations

import argparse

from hybridplan.cluster import Cluster


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
