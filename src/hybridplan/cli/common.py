"""Options shared by several commands, and the checks every command makes before its work starts.

Nothing here imports torch: a command parses and checks its arguments and files first (milliseconds),
then imports what does the work (torch takes seconds), so a bad argument is answered at once.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridplan.cli.outputs import check_output, write_output  # the commands take them from here
from hybridplan.plan.cluster import Cluster
from hybridplan.errors import UsageError
from hybridplan.limits import GLOBAL_BATCH_WHY, MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MICROBATCHES_WHY, shown

if TYPE_CHECKING:
    from hybridplan.plan import Plan
    from hybridplan.runtime.hosts import Hosts
    from hybridplan.predict.memory import MemoryPredictor


# ---------------------------------------------------------------------- commands
def add_command(sub: argparse._SubParsersAction, name: str, *, help: str, description: str, reads: str, writes: str,
                examples: list[str]) -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` says what it does, what it reads, what it writes, and examples."""
    import textwrap

    text = "\n\n".join([textwrap.fill(description, 100), textwrap.fill(f"Reads: {reads}", 100),
                         textwrap.fill(f"Writes: {writes}", 100)])
    return sub.add_parser(name, help=help, description=text,
                          epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


# ---------------------------------------------------------------------- argument types
def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a count or a size; 0 never means "the default")."""
    try:
        value = int(text)
    except ValueError:  # also for more digits than Python converts (4,300)
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {shown(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {shown(text)}")
    return value


def bounded_int(high: int, why: str) -> Callable[[str], int]:
    """An argparse type: a positive integer of at most ``high`` (``why``: the bound's reason, hybridplan/limits.py)."""

    def parse(text: str) -> int:
        digits = text.strip().lstrip("+")
        if digits.isdigit() and len(digits) > 4000:  # before int(), which converts at most 4,300 digits
            raise argparse.ArgumentTypeError(f"must be at most {high:,}: {why}; got an integer of {len(digits):,} digits")
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,}: {why}; got {value:,}")
        return value

    return parse


global_batch = bounded_int(MAX_GLOBAL_BATCH, GLOBAL_BATCH_WHY)
"""An argparse type: ``--global-batch-size``."""

microbatches = bounded_int(MAX_MICROBATCHES, MICROBATCHES_WHY)
"""An argparse type: ``--num-microbatches``."""


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def model_name(text: str) -> str:
    """An argparse type: a zoo name, ``hf:NAME_OR_PATH`` or ``module:function``, checked without importing torch."""
    from hybridplan.errors import ModelError
    from hybridplan.models.names import check_model_name

    try:
        check_model_name(text)
    except ModelError as e:
        raise argparse.ArgumentTypeError(str(e).replace("\n  fix:", ";")) from None
    return text


def add_model(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, required: bool = True, help: str | None = None) -> None:
    p.add_argument("--model", required=required, type=model_name,
                   help=help or "zoo name (see 'hybridplan models'), hf:NAME_OR_PATH (a HuggingFace"
                   " config.json) or module:function")


def add_cluster(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--cluster", required=required, help="NxK (N nodes of K devices) or a cluster TOML file")
    p.add_argument("--device-memory", help="per-device memory capacity, e.g. 200MiB or 40GB (overrides the cluster's"
                   " and --gpu's); on CUDA the device's whole memory, as nvidia-smi counts it")


def gpu_name(text: str) -> str:
    """An argparse type: a GPU of the catalogue (plan/gpus.py), spelled as the catalogue does."""
    from hybridplan.errors import ClusterError
    from hybridplan.plan.gpus import gpu_spec

    try:
        return gpu_spec(text).key
    except ClusterError as e:
        raise argparse.ArgumentTypeError(str(e).replace("\n  fix:", ";")) from None


def add_device(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, help: str) -> None:
    """``--device`` (cpu or cuda; ``help`` says what it changes for the command) and ``--gpu``, which names the GPU and
    implies cuda. The default device is resolved after parsing (:func:`resolve_device`): cuda with ``--gpu``, else cpu."""
    p.add_argument("--device", choices=("cpu", "cuda"), help=f"{help} (default cpu; cuda with --gpu)")
    p.add_argument("--gpu", type=gpu_name, metavar="NAME",
                   help="the GPU every device is, e.g. h100-sxm ('hybridplan gpus' lists them): implies --device cuda;"
                   " sets each device's memory as the card states it, the link within a node and the CUDA terms of"
                   " simulated devices (cuBLAS workspace); --device-memory overrides its memory")


def resolve_device(args: argparse.Namespace) -> None:
    """Settle ``--device`` from ``--gpu`` (:func:`add_device`): cuda with a GPU, else cpu when not given; a GPU with
    ``--device cpu`` is refused. Idempotent; the CLI calls it before a command starts, :func:`cluster_from` again.

    Raises:
        UsageError: for ``--device cpu`` with ``--gpu``.
    """
    if not hasattr(args, "device") or getattr(args, "device_given", None) is not None:
        return
    args.device_given = args.device is not None
    gpu = getattr(args, "gpu", None)
    if gpu is not None and args.device == "cpu":
        raise UsageError(f"--gpu {gpu} names a GPU, but --device cpu asks for CPU devices",
                         fix="drop --device cpu (--gpu implies --device cuda), or drop --gpu")
    args.device = "cuda" if gpu is not None else (args.device or "cpu")


def cluster_from(args: argparse.Namespace) -> Cluster:
    """The ``--cluster``; its devices are of the ``--device`` type where the command has that option (a CUDA
    run's devices are labelled "cuda" in its output and its layer-time profile, not "cpu"), of the ``--gpu``'s model
    and memory where given. A cluster file that names GPUs makes the command's devices cuda too. Says on stderr what
    it assumed: a ``--device-memory`` that differs from the ``--gpu``'s (the explicit figure wins), and a
    ``--device-memory`` given without ``--device`` or a GPU (CPU devices).

    Raises:
        UsageError: for ``--device cpu`` with a GPU named by ``--gpu`` or the cluster file.
    """
    from hybridplan.units import format_bytes, parse_bytes

    resolve_device(args)
    device = getattr(args, "device", "cpu")
    gpu = getattr(args, "gpu", None)
    cluster = Cluster.parse(args.cluster, device_memory=args.device_memory, device_type=device, gpu=gpu)
    named = sorted({d.gpu for d in cluster.devices if d.gpu is not None})
    if named and device == "cpu" and hasattr(args, "device"):
        if args.device_given:
            raise UsageError(f"the cluster file {args.cluster!r} names GPUs ({', '.join(named)}), but --device cpu asks"
                             " for CPU devices", fix="drop --device cpu (a GPU implies cuda), or the file's gpu keys")
        args.device = device = "cuda"
    if gpu is not None and args.device_memory is not None:
        stated = cluster.gpu_of(0)
        given = parse_bytes(args.device_memory, what="--device-memory")
        if stated is not None and given != stated.memory_bytes:
            print(f"note: --device-memory {args.device_memory} ({format_bytes(given)}) differs from the {gpu}'s"
                  f" {stated.memory_stated} ({format_bytes(stated.memory_bytes)}); planning with --device-memory",
                  file=sys.stderr)
    elif (not named and args.device_memory is not None and hasattr(args, "device") and not args.device_given
          and device == "cpu" and not getattr(args, "db", None)):  # with --db the profile says what the devices are
        print(f"note: --device-memory {args.device_memory} without --device or --gpu: planning for CPU devices (no CUDA"
              " context, caching allocator or cuBLAS workspaces); for GPUs name them, e.g. --gpu h100-sxm"
              " ('hybridplan gpus' lists them), or add --device cuda", file=sys.stderr)
    if device == "cuda":
        from hybridplan.runtime.gpu_memory import check_cuda_capacity  # imports no torch

        check_cuda_capacity(cluster)
    return cluster


def add_training(p: argparse.ArgumentParser) -> None:
    """Training settings shared by run, profile and validate (runtime/config.py RunConfig)."""
    p.add_argument("--backend", choices=("real", "sim"), default="real",
                   help="real: one process per device (default); sim: fake tensors, no device memory needed")
    add_device(p, help="device type; with --backend sim, cuda reports peaks in CUDA allocator terms")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or mixed precision with fp32 master weights (default fp32)")
    p.add_argument("--loss-scale", type=positive_float, help="static loss scale of fp16 runs (default 128)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each layer's activations in backward")
    add_share_gpu(p)


def add_share_gpu(p: argparse.ArgumentParser) -> None:
    """``--share-gpu``: several ranks on one GPU (runtime/shared_gpu.py)."""
    p.add_argument("--share-gpu", action="store_true",
                   help="several ranks on one GPU (a testing and profiling mode: gloo, transfers staged through host "
                   "memory, per-rank peaks, times not representative); on with --device cuda when the plan has more "
                   "ranks than visible GPUs")


def training_options(args: argparse.Namespace) -> dict:
    """The RunConfig fields of :func:`add_training`'s options."""
    return {
        "backend": args.backend,
        "device_type": args.device,
        "precision": args.precision,
        "loss_scale": args.loss_scale,
        "activation_checkpointing": args.activation_checkpointing,
        # only when asked: a profile's identity (its run options) stays what it was without the mode
        **({"share_gpu": True} if args.share_gpu else {}),
    }


def note_scaling(predictor: MemoryPredictor) -> None:
    """Print the predictor's one-line warning if its target batch is far beyond the profiled ones."""
    note = predictor.scaling_note()
    if note is not None:
        print(note, file=sys.stderr)


def output_plan(args: argparse.Namespace, plan: Plan) -> bool:
    """Write ``plan`` to ``--out`` if given, and print its JSON if ``--json``; True when it was printed,
    so the command prints nothing else (its stdout is the JSON)."""
    if args.out:
        write_output(args.out, plan.to_json(), "--out")
    if args.json:
        print(plan.to_json(), end="")
        return True
    return False


# ---------------------------------------------------------------------------------------------- several machines
_DEFAULT_PORT = 29500
"""torchrun's own default --master-port."""


def add_hosts(p: argparse.ArgumentParser, what: str) -> None:
    """``--hosts`` and its companions: ``what`` ("run every profiling run") with torchrun across machines
    (runtime/multinode.py; docs/runtime.md, "Multi-node")."""
    m = p.add_argument_group("several machines (docs/runtime.md, Multi-node)")
    m.add_argument("--hosts", help=f"{what} with torchrun across these machines, one per node of --cluster, node 0 first:"
                   " host names (node1,node2), a SLURM node list (gpu[01-04]), or 'slurm' (this allocation's nodes)")
    m.add_argument("--launcher", help="how this command starts its agent on each host: ssh (default), srun (default with "
                   "--hosts slurm), local (every host is this machine), or a template with {host}, e.g. 'ssh -p 2222 {host}'")
    m.add_argument("--master-addr", help="address of the first host that every host reaches (default: the first host)")
    m.add_argument("--master-port", type=_port, help="torchrun's rendezvous port on the first host (default 29500)")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (1 to 65535), got {text!r}")
    return value


def check_host_options(args: argparse.Namespace) -> None:
    """Refuse :func:`add_hosts`'s companions without ``--hosts``."""
    given = [o for o, v in (("--launcher", args.launcher), ("--master-addr", args.master_addr),
                            ("--master-port", args.master_port)) if v is not None]
    if given and args.hosts is None:
        raise UsageError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --hosts",
                         fix="list the machines with --hosts, or drop them")


def hosts_from(args: argparse.Namespace, cluster: Cluster) -> Hosts | None:
    """The machines of ``--hosts`` and its companions, checked against the cluster (None: this machine)."""
    from hybridplan.runtime.hosts import Hosts, check_address, check_launcher, parse_hosts

    check_host_options(args)
    if args.hosts is None:
        return None
    if args.backend == "sim":
        raise UsageError("--hosts starts real processes on several machines; simulated devices (--backend sim) run in"
                         " this process", fix="drop --hosts or --backend sim")
    hosts = parse_hosts(args.hosts, os.environ)
    if len(hosts) != cluster.num_nodes:
        raise UsageError(f"--hosts names {len(hosts)} host(s) ({','.join(hosts[:8])}{',...' if len(hosts) > 8 else ''}) but"
                         f" cluster {cluster.shape} has {cluster.num_nodes} node(s)",
                         fix="give one host per node of --cluster")
    launcher = args.launcher if args.launcher is not None else ("srun" if args.hosts.strip() == "slurm" else "ssh")
    master_addr = check_address(args.master_addr) if args.master_addr is not None else hosts[0]
    return Hosts(hosts=tuple(hosts), launcher=check_launcher(launcher), master_addr=master_addr,
                 master_port=args.master_port or _DEFAULT_PORT)
