"""The hardware a plan runs on: N nodes x k devices, their memory, speed and the links between them.

A cluster comes from the shorthand ``"2x4"`` (2 nodes of 4 devices) or from a TOML file::

    nodes = 4
    devices_per_node = 4

    [device]                 # defaults for every device
    gpu = "a100-40gb"        # optional: a GPU of the catalogue (plan/gpus.py, 'hybridplan gpus'); sets type "cuda",
                             # the memory and the node's intra_node link, unless given here
    type = "A100-40GB"
    memory = "40GiB"         # capacity; omit for unlimited
    speed = 1.0              # relative compute speed (1.0 = the device the time profiles were measured on)

    [network]
    intra_node = "600GB/s"   # bytes/s between devices of one node ("B" bytes, "b" bits)
    inter_node = "100Gbps"   # between nodes
    # matrix = [[...], ...]  # optional: full device-to-device bandwidth matrix, overrides the two above
    intra_node_latency = "20us"  # optional: seconds per message within a node ("us", "ms", "s" or a number)
    inter_node_latency = "5us"   # optional: between nodes

    [[node_overrides]]       # optional: heterogeneous nodes, everything about them in one place
    nodes = [2, 3]           # which nodes (indices from 0)
    gpu = "t4"               # as in [device]: these nodes' memory and link follow from it, unless given here
    type = "T4"
    memory = "16GiB"
    speed = 0.25
    intra_node = "32GB/s"    # between two devices of one of these nodes (e.g. PCIe 4.0 x16 instead of NVLink)

Devices are numbered globally; device ``d`` is on node ``d // devices_per_node``. Every key of an override is
optional (what it omits comes from ``[device]`` and ``[network]``); a node named by several overrides takes
the last. Two devices of different nodes talk at ``inter_node``; of one node, at that node's ``intra_node``.
A ``matrix`` gives every pair instead, so it cannot be combined with a per-node ``intra_node``.

A ``gpu`` names the device's model in the GPU catalogue (plan/gpus.py): the table it is in takes the GPU's memory as
the card states it and the type "cuda" where it gives no ``memory`` or ``type`` of its own, and its nodes take the
GPU's default link (NVLink or PCIe, one direction) as ``intra_node`` where neither that table nor, for ``[device]``,
``[network]`` gives one (and no ``matrix`` gives every link). A ``gpu`` given in ``[device]`` stays a node override's
unless the override names another.

The latencies are Hockney's ``alpha``, the fixed seconds of one message on a link whatever its size (the
bandwidths are its ``beta``); the time model charges them per message the runtime sends
(predict/communication.py, [Note: per-message latency]). Omitted, a link's latency is the one ``profile --time``
measured with the runtime's backend (the time profile's ``links``), or 0 for a profile without one.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hybridplan.errors import ClusterError, UsageError
from hybridplan.plan.device_spec import (
    DeviceSpec,
    device_spec_of,
    gpu_link,
    gpu_of,
    link_bandwidth_of,
    positive_int,
    spec_dict,
)
from hybridplan.plan.gpus import Gpu, gpu_spec
from hybridplan.units import format_bandwidth, format_bytes, parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["DeviceSpec", "Cluster", "DEFAULT_INTRA_NODE_BANDWIDTH", "DEFAULT_INTER_NODE_BANDWIDTH"]

DEFAULT_INTRA_NODE_BANDWIDTH = 300e9
"""Bytes/s within a node when none is given: NVLink 3 on an A100 node, 600 GB/s bidirectional (NVIDIA A100
datasheet), i.e. 300 GB/s per direction."""

DEFAULT_INTER_NODE_BANDWIDTH = 12.5e9
"""Bytes/s between nodes when none is given: 100 Gbps InfiniBand, the CAPTURE testbed (seed 001, section IV)."""

MAX_DEVICES = 2**20
"""The largest mesh accepted (1,048,576 devices, e.g. 1024x1024): about ten times the largest training
clusters reported to date; a larger shorthand is a typo, and describing it would take gigabytes."""



def _check_shape(num_nodes: int, devices_per_node: int) -> None:
    if num_nodes < 1 or devices_per_node < 1:
        raise ClusterError(f"a cluster needs at least 1 node of at least 1 device, got {num_nodes}x{devices_per_node}",
                           fix="use e.g. --cluster 1x4")
    if num_nodes * devices_per_node > MAX_DEVICES:
        raise ClusterError(
            f"cluster {num_nodes}x{devices_per_node} has {num_nodes * devices_per_node:,} devices, more than the"
            f" {MAX_DEVICES:,} hybridplan plans for",
            fix="check the shorthand: NxK is N nodes of K devices each, e.g. --cluster 128x8",
        )


_SHORTHAND = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """N nodes of k devices each, with per-device specs and link bandwidths."""

    num_nodes: int
    """Number of nodes (N)."""
    devices_per_node: int
    """Devices per node (k); a pipeline stage never spans nodes."""
    devices: tuple[DeviceSpec, ...]
    """One spec per global device index."""
    intra_node_bandwidth: float = DEFAULT_INTRA_NODE_BANDWIDTH
    """Bytes/s between two devices of one node."""
    inter_node_bandwidth: float = DEFAULT_INTER_NODE_BANDWIDTH
    """Bytes/s between devices of different nodes."""
    bandwidth_matrix: tuple[tuple[float, ...], ...] | None = field(default=None, compare=True)
    """Optional full matrix of bytes/s from device i to device j; overrides the two bandwidths above."""
    node_intra_bandwidths: tuple[float, ...] | None = None
    """Optional bytes/s within each node (one per node; e.g. NVLink nodes beside PCIe nodes); overrides
    ``intra_node_bandwidth``. ``None``: every node has ``intra_node_bandwidth``."""
    intra_node_latency: float | None = None
    """Seconds per message between two devices of one node (Hockney's alpha); ``None``: not given (the time
    profile's measured latency applies)."""
    inter_node_latency: float | None = None
    """Seconds per message between devices of different nodes; ``None``: not given."""

    def __post_init__(self) -> None:
        _check_shape(self.num_nodes, self.devices_per_node)
        if len(self.devices) != self.num_devices:
            raise ClusterError(
                f"cluster {self.num_nodes}x{self.devices_per_node} has {self.num_devices} devices"
                f" but {len(self.devices)} device specs were given"
            )
        if self.bandwidth_matrix is not None:
            n = self.num_devices
            if len(self.bandwidth_matrix) != n or any(len(row) != n for row in self.bandwidth_matrix):
                raise ClusterError(
                    f"bandwidth matrix must be {n}x{n} for a {self.num_nodes}x{self.devices_per_node} cluster",
                    fix="give one row per device with one entry per device",
                )
        if self.node_intra_bandwidths is not None:
            if len(self.node_intra_bandwidths) != self.num_nodes:
                raise ClusterError(f"{len(self.node_intra_bandwidths)} per-node bandwidths for {self.num_nodes} nodes",
                                   fix="give one intra-node bandwidth per node")
            if self.bandwidth_matrix is not None:
                raise ClusterError("a bandwidth matrix and per-node intra-node bandwidths both describe the links",
                                   fix="give one or the other: the matrix, or intra_node per node_overrides")
            bad = [b for b in self.node_intra_bandwidths if not 0 < b <= math.inf]
            if bad:
                raise ClusterError(f"intra-node bandwidth must be positive, got {bad[0]!r}")
        for name in ("intra_node_latency", "inter_node_latency"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < math.inf:
                raise ClusterError(f"{name} must be a finite number of seconds >= 0, got {value!r}", fix='e.g. "5us"')

    # ------------------------------------------------------------------ construction
    @classmethod
    def uniform(
        cls,
        num_nodes: int,
        devices_per_node: int,
        *,
        device_type: str = "cpu",
        memory_bytes: int | None = None,
        speed: float = 1.0,
        intra_node_bandwidth: float = DEFAULT_INTRA_NODE_BANDWIDTH,
        inter_node_bandwidth: float = DEFAULT_INTER_NODE_BANDWIDTH,
        gpu: str | None = None,
    ) -> Cluster:
        """A homogeneous cluster of ``num_nodes`` x ``devices_per_node`` identical devices (``gpu``: their model in
        the GPU catalogue, which sets nothing else here; :meth:`parse` derives the memory and link from it)."""
        _check_shape(num_nodes, devices_per_node)  # before making one spec per device
        spec = DeviceSpec(type=device_type, memory_bytes=memory_bytes, speed=speed, gpu=gpu)
        return cls(
            num_nodes=num_nodes,
            devices_per_node=devices_per_node,
            devices=(spec,) * (num_nodes * devices_per_node),
            intra_node_bandwidth=intra_node_bandwidth,
            inter_node_bandwidth=inter_node_bandwidth,
        )

    @classmethod
    def parse(cls, spec: str | Path, *, device_memory: str | int | None = None, device_type: str | None = None,
              gpu: str | Gpu | None = None) -> Cluster:
        """A cluster from the shorthand ``"NxK"`` or a TOML file path.

        Args:
            spec: ``"2x4"`` or the path of a TOML cluster file.
            device_memory: if given ("200MiB"), overrides every device's memory capacity (also a ``gpu``'s).
            device_type: the devices' type for the shorthand (a run's ``--device``: "cpu" or "cuda"; default "cpu",
                "cuda" with a ``gpu``), which labels them in reports and layer-time profiles; a TOML file names its
                own types.
            gpu: a GPU of the catalogue (plan/gpus.py) every device is: their memory as the card states it and, for
                the shorthand, the GPU's default link within a node (a TOML file keeps its own links).

        Raises:
            ClusterError: for a malformed shorthand or file, or an unknown GPU.
        """
        model = gpu_spec(gpu) if gpu is not None else None
        kind = device_type or ("cuda" if model is not None else "cpu")
        if model is not None and kind == "cpu":
            raise ClusterError(f"GPU {model.key!r} named for devices of type 'cpu'",
                               fix="drop the device type (a GPU's devices are 'cuda'), or the GPU")
        text = str(spec)
        match = _SHORTHAND.match(text)
        if match:
            link = model.link_bandwidth if model is not None and model.link_bandwidth is not None else None
            cluster = cls.uniform(int(match.group(1)), int(match.group(2)), device_type=kind,
                                  intra_node_bandwidth=link or DEFAULT_INTRA_NODE_BANDWIDTH)
        elif text.endswith(".toml") or Path(text).is_file():
            cluster = cls.from_toml(Path(text))
        else:
            raise ClusterError(
                f"cluster {text!r} is neither the shorthand NxK nor an existing TOML file",
                fix="write e.g. --cluster 2x4 (2 nodes of 4 devices) or --cluster path/to/cluster.toml",
            )
        if model is not None:
            cluster = cluster.with_gpu(model, device_type=kind)
        if device_memory is not None:
            capacity = parse_bytes(device_memory, what="--device-memory")
            if capacity < 1:
                raise ClusterError(f"--device-memory {device_memory!r} is not a capacity (it must be positive)",
                                   fix="give the capacity of one device, e.g. --device-memory 40GiB")
            cluster = cluster.with_memory(capacity)
        return cluster

    @classmethod
    def from_toml(cls, path: Path) -> Cluster:
        """Load a cluster file (format in the module docstring)."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ClusterError(f"cluster file {str(path)!r} does not exist", fix="check the path") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ClusterError(f"cluster file {str(path)!r} cannot be read: {getattr(e, 'strerror', None) or e}",
                               fix="give a TOML cluster file (format: hybridplan/plan/cluster.py)") from None
        except tomllib.TOMLDecodeError as e:
            raise ClusterError(f"cluster file {str(path)!r} is not valid TOML: {e}") from None
        except RecursionError:  # tomllib parses nested arrays and tables recursively
            raise ClusterError(f"cluster file {str(path)!r} nests arrays or tables too deeply to read (a cluster file"
                               " nests at most a table of nodes)",
                               fix="give a TOML cluster file (format: hybridplan/plan/cluster.py)") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "cluster") -> Cluster:
        """Build a cluster from the parsed TOML (or JSON) mapping."""
        known = {"nodes", "devices_per_node", "device", "network", "node_overrides"}
        unknown = set(data) - known
        if unknown:
            raise ClusterError(
                f"{source}: unknown key(s) {sorted(unknown)}", fix=f"the known top-level keys are {sorted(known)}"
            )
        try:
            nodes = positive_int(data["nodes"], f"{source}: nodes")
            k = positive_int(data["devices_per_node"], f"{source}: devices_per_node")
        except KeyError as e:
            raise ClusterError(f"{source}: missing required key {e.args[0]!r}", fix="give nodes and devices_per_node") from None
        _check_shape(nodes, k)
        try:
            base = device_spec_of(data.get("device", {}), DeviceSpec(), f"{source}: [device]")
            network = data.get("network", {})
            if not isinstance(network, dict):
                raise ClusterError(f"{source}: [network] must be a table, got {network!r}",
                                   fix='write [network] with intra_node = "...", inter_node = "..."')
            bad = set(network) - {"intra_node", "inter_node", "matrix", "intra_node_latency", "inter_node_latency"}
            if bad:
                raise ClusterError(f"{source}: unknown [network] key(s) {sorted(bad)}",
                                   fix="use intra_node, inter_node, matrix, intra_node_latency, inter_node_latency")
            latencies = {k: parse_seconds(network[k], what=f"{source}: network.{k}")
                         for k in ("intra_node_latency", "inter_node_latency") if k in network}
            device_link = gpu_link(data.get("device", {}), f"{source}: [device]") if "matrix" not in network else None
            intra = link_bandwidth_of(network.get("intra_node", device_link or DEFAULT_INTRA_NODE_BANDWIDTH),
                               f"{source}: network.intra_node")
            inter = link_bandwidth_of(network.get("inter_node", DEFAULT_INTER_NODE_BANDWIDTH), f"{source}: network.inter_node")
            per_node = [base] * nodes
            node_intra = [intra] * nodes
            overrides = data.get("node_overrides", [])
            if not isinstance(overrides, list) or not all(isinstance(o, dict) for o in overrides):
                raise ClusterError(f"{source}: node_overrides must be a list of tables, got {overrides!r}",
                                   fix="write each as [[node_overrides]] with nodes = [...] and the keys to change")
            for i, override in enumerate(overrides):
                where = f"{source}: node_overrides[{i}]"
                which = override.get("nodes")
                if (not isinstance(which, list)
                        or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < nodes for n in which)):
                    raise ClusterError(f"{where}: 'nodes' must be a list of node indices in [0, {nodes}),"
                                       f" got {which!r}", fix=f"e.g. nodes = [0, 1]; the cluster has {nodes} node(s)")
                spec = device_spec_of({k2: v for k2, v in override.items() if k2 not in ("nodes", "intra_node")}, base, where)
                bandwidth = (link_bandwidth_of(override["intra_node"], f"{where}: intra_node") if "intra_node" in override
                             else gpu_link(override, where) if "matrix" not in network else None)
                for n in which:
                    per_node[n] = spec
                    if bandwidth is not None:
                        node_intra[n] = bandwidth
            matrix = None
            if "matrix" in network:
                rows = network["matrix"]
                if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
                    raise ClusterError(f"{source}: network.matrix must be a list of rows")
                matrix = tuple(
                    tuple(
                        float("inf") if i == j else parse_bandwidth(v, what=f"{source}: network.matrix[{i}][{j}]")
                        for j, v in enumerate(row)
                    )
                    for i, row in enumerate(rows)
                )
        except UsageError as e:
            raise ClusterError(e.message, fix=e.fix) from None
        devices = tuple(per_node[d // k] for d in range(nodes * k))
        per_node_links = None if all(b == intra for b in node_intra) else tuple(node_intra)
        if per_node_links is not None and matrix is not None:
            raise ClusterError(f"{source}: network.matrix gives every link, so a per-node intra_node cannot apply",
                               fix="drop intra_node from node_overrides, or drop the matrix")
        return cls(
            num_nodes=nodes,
            devices_per_node=k,
            devices=devices,
            intra_node_bandwidth=intra,
            inter_node_bandwidth=inter,
            bandwidth_matrix=matrix,
            node_intra_bandwidths=per_node_links,
            **latencies,
        )

    def with_gpu(self, gpu: str | Gpu, *, device_type: str = "cuda") -> Cluster:
        """The same cluster with every device a ``gpu`` of the catalogue, of that GPU's memory and ``device_type``
        (its links unchanged)."""
        model = gpu_spec(gpu)
        return replace(self, devices=tuple(replace(d, gpu=model.key, memory_bytes=model.memory_bytes, type=device_type)
                                           for d in self.devices))

    def with_memory(self, memory_bytes: int | None) -> Cluster:
        """The same cluster with every device's memory capacity set to ``memory_bytes``."""
        return replace(self, devices=tuple(replace(d, memory_bytes=memory_bytes) for d in self.devices))

    def with_shape(self, num_nodes: int, devices_per_node: int) -> Cluster:
        """A cluster of another shape with this cluster's first device spec and bandwidths (for smaller-mesh search)."""
        if self.bandwidth_matrix is not None or self.node_intra_bandwidths is not None or len(set(self.devices)) > 1:
            raise ClusterError(
                "cannot reshape a heterogeneous cluster or one with a bandwidth matrix",
                fix="give the smaller cluster explicitly as a TOML file",
            )
        d = self.devices[0]
        return Cluster.uniform(
            num_nodes,
            devices_per_node,
            device_type=d.type,
            memory_bytes=d.memory_bytes,
            speed=d.speed,
            gpu=d.gpu,
            intra_node_bandwidth=self.intra_node_bandwidth,
            inter_node_bandwidth=self.inter_node_bandwidth,
        ).with_latencies(self.intra_node_latency, self.inter_node_latency)

    def with_latencies(self, intra_node: float | None, inter_node: float | None) -> Cluster:
        """The same cluster with these per-message latencies (seconds; None: not given)."""
        return replace(self, intra_node_latency=intra_node, inter_node_latency=inter_node)

    # ------------------------------------------------------------------ queries
    @property
    def num_devices(self) -> int:
        """Total devices, N x k."""
        return self.num_nodes * self.devices_per_node

    @property
    def shape(self) -> str:
        """The shorthand, e.g. ``"2x4"``."""
        return f"{self.num_nodes}x{self.devices_per_node}"

    def node_of(self, device: int) -> int:
        """The node that holds global device index ``device``."""
        return device // self.devices_per_node

    def devices_of_node(self, node: int) -> range:
        """Global device indices of ``node``."""
        return range(node * self.devices_per_node, (node + 1) * self.devices_per_node)

    def bandwidth(self, a: int, b: int) -> float:
        """Bytes/s from device ``a`` to device ``b`` (infinite for a == b)."""
        if a == b:
            return float("inf")
        if self.bandwidth_matrix is not None:
            return self.bandwidth_matrix[a][b]
        node = self.node_of(a)
        if node != self.node_of(b):
            return self.inter_node_bandwidth
        return self.intra_node_bandwidth if self.node_intra_bandwidths is None else self.node_intra_bandwidths[node]

    def latency(self, a: int, b: int) -> float | None:
        """Seconds per message from device ``a`` to device ``b`` as the cluster gives it (None: not given; 0 for a == b)."""
        if a == b:
            return 0.0
        return self.inter_node_latency if self.node_of(a) != self.node_of(b) else self.intra_node_latency

    def slowest_link(self, devices: Sequence[int]) -> float:
        """The lowest bandwidth between any two of ``devices`` (infinite for fewer than two).

        Equal to the minimum of :meth:`bandwidth` over every ordered pair, in time linear in the group
        without a matrix (a group of 64 data replicas has 4032 pairs, and the throughput search asks often).
        """
        if len(set(devices)) < 2:
            return float("inf")
        if self.bandwidth_matrix is not None:
            return min(self.bandwidth_matrix[a][b] for a in devices for b in devices if a != b)
        count: dict[int, int] = {}
        for d in set(devices):
            count[self.node_of(d)] = count.get(self.node_of(d), 0) + 1
        links = [self.bandwidth(self.devices_per_node * n, self.devices_per_node * n + 1)
                 for n, c in count.items() if c > 1]
        if len(count) > 1:
            links.append(self.inter_node_bandwidth)
        return min(links)

    def memory_of(self, device: int) -> int | None:
        """Memory capacity of ``device`` in bytes (``None``: unlimited)."""
        return self.devices[device].memory_bytes

    def gpu_of(self, device: int) -> Gpu | None:
        """The catalogue entry of ``device``'s GPU (plan/gpus.py: peak rates, bandwidth, link), None if none is named."""
        name = self.devices[device].gpu
        return gpu_spec(name) if name is not None else None

    def describe(self) -> str:
        """One line for humans, e.g. ``2x4 cpu, 200.00 MiB/device, intra 300.00 GB/s, inter 12.50 GB/s`` (a device
        of a named GPU shows the GPU: ``2x8 cuda h100-sxm, ...``)."""
        types = sorted({d.type if d.gpu is None else f"{d.type} {d.gpu}" for d in self.devices})
        mems = sorted({d.memory_bytes for d in self.devices}, key=lambda m: -1 if m is None else m)
        mem = "/".join("unlimited" if m is None else format_bytes(m) for m in mems)
        intra = sorted(set(self.node_intra_bandwidths or (self.intra_node_bandwidth,)))
        net = (
            "bandwidth matrix"
            if self.bandwidth_matrix is not None
            else f"intra {'/'.join(format_bandwidth(b) for b in intra)}, inter {format_bandwidth(self.inter_node_bandwidth)}"
        )
        return f"{self.shape} {'/'.join(types)}, {mem} per device, {net}"

    def to_dict(self) -> dict[str, Any]:
        """The mapping :meth:`from_dict` reads (bandwidths in bytes/s, memory in bytes)."""
        data: dict[str, Any] = {"nodes": self.num_nodes, "devices_per_node": self.devices_per_node}
        first = self.devices[0]
        data["device"] = spec_dict(first)
        overrides = []
        for node in range(self.num_nodes):
            spec = self.devices[node * self.devices_per_node]
            intra = self.intra_node_bandwidth if self.node_intra_bandwidths is None else self.node_intra_bandwidths[node]
            if spec != first or intra != self.intra_node_bandwidth:
                overrides.append({"nodes": [node], **spec_dict(spec)}
                                 | ({"intra_node": intra} if intra != self.intra_node_bandwidth else {}))
        if overrides:
            data["node_overrides"] = overrides
        network: dict[str, Any] = {"intra_node": self.intra_node_bandwidth, "inter_node": self.inter_node_bandwidth}
        if self.bandwidth_matrix is not None:
            network["matrix"] = [[0.0 if v == float("inf") else v for v in row] for row in self.bandwidth_matrix]
        for key in ("intra_node_latency", "inter_node_latency"):
            if getattr(self, key) is not None:
                network[key] = getattr(self, key)
        data["network"] = network
        return data
