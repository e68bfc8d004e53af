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
