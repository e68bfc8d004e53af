"""The hardware a plan runs on: N nodes x k devices, their memory, speed and the links between them.

A cluster comes from the shorthand ``"2x4"`` (2 nodes of 4 devices) or from a TOML file::

    nodes = 4
    devices_per_node = 4

    [device]                 # defaults for every device
    type = "A100-40GB"
    memory = "40GiB"         # capacity; omit for unlimited
    speed = 1.0              # relative compute speed (1.0 = the device the time profiles were measured on)

    [network]
    intra_node = "600GB/s"   # bytes/s between devices of one node ("B" bytes, "b" bits)
    inter_node = "100Gbps"   # between nodes
    # matrix = [[...], ...]  # optional: full device-to-device bandwidth matrix, overrides the two above

    [[node_overrides]]       # optional: heterogeneous nodes
    nodes = [2, 3]
    type = "T4"
    memory = "16GiB"
    speed = 0.25

Devices are numbered globally; device ``d`` is on node ``d // devices_per_node``.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hybridplan.errors import ClusterError, UsageError
from hybridplan.units import format_bandwidth, format_bytes, parse_bandwidth, parse_bytes

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
class DeviceSpec:
    """One accelerator."""

    type: str = "cpu"
    """Device type name; time profiles are keyed by it."""
    memory_bytes: int | None = None
    """Memory capacity in bytes; ``None`` means unlimited (no out-of-memory check)."""
    speed: float = 1.0
    """Relative compute speed: a layer takes ``time / speed`` on this device."""

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ClusterError(f"device memory must be positive, got {self.memory_bytes} bytes",
                               fix="give a capacity such as --device-memory 40GiB, or none for unlimited")
        if not (isinstance(self.speed, (int, float)) and 0 < self.speed < math.inf):
            raise ClusterError(f"device speed must be a positive number, got {self.speed!r}")


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
    ) -> Cluster:
        """A homogeneous cluster of ``num_nodes`` x ``devices_per_node`` identical devices."""
        _check_shape(num_nodes, devices_per_node)  # before making one spec per device
        spec = DeviceSpec(type=device_type, memory_bytes=memory_bytes, speed=speed)
        return cls(
            num_nodes=num_nodes,
            devices_per_node=devices_per_node,
            devices=(spec,) * (num_nodes * devices_per_node),
            intra_node_bandwidth=intra_node_bandwidth,
            inter_node_bandwidth=inter_node_bandwidth,
        )

    @classmethod
    def parse(cls, spec: str | Path, *, device_memory: str | int | None = None, device_type: str = "cpu") -> Cluster:
        """A cluster from the shorthand ``"NxK"`` or a TOML file path.

        Args:
            spec: ``"2x4"`` or the path of a TOML cluster file.
            device_memory: if given ("200MiB"), overrides every device's memory capacity.
            device_type: the devices' type for the shorthand (a run's ``--device``: "cpu" or "cuda"), which
                labels them in reports and layer-time profiles; a TOML file names its own types.

        Raises:
            ClusterError: for a malformed shorthand or file.
        """
        text = str(spec)
        match = _SHORTHAND.match(text)
        if match:
            cluster = cls.uniform(int(match.group(1)), int(match.group(2)), device_type=device_type)
        elif text.endswith(".toml") or Path(text).is_file():
            cluster = cls.from_toml(Path(text))
        else:
            raise ClusterError(
                f"cluster {text!r} is neither the shorthand NxK nor an existing TOML file",
                fix="write e.g. --cluster 2x4 (2 nodes of 4 devices) or --cluster path/to/cluster.toml",
            )
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
            nodes = _positive_int(data["nodes"], f"{source}: nodes")
            k = _positive_int(data["devices_per_node"], f"{source}: devices_per_node")
        except KeyError as e:
            raise ClusterError(f"{source}: missing required key {e.args[0]!r}", fix="give nodes and devices_per_node") from None
        _check_shape(nodes, k)
        try:
            base = _device_spec(data.get("device", {}), DeviceSpec(), f"{source}: [device]")
            per_node = [base] * nodes
            for i, override in enumerate(data.get("node_overrides", [])):
                where = f"{source}: node_overrides[{i}]"
                which = override.get("nodes")
                if not isinstance(which, list) or not all(isinstance(n, int) and 0 <= n < nodes for n in which):
                    raise ClusterError(f"{where}: 'nodes' must be a list of node indices in [0, {nodes})")
                spec = _device_spec({k2: v for k2, v in override.items() if k2 != "nodes"}, base, where)
                for n in which:
                    per_node[n] = spec
            network = data.get("network", {})
            bad = set(network) - {"intra_node", "inter_node", "matrix"}
            if bad:
                raise ClusterError(f"{source}: unknown [network] key(s) {sorted(bad)}", fix="use intra_node, inter_node, matrix")
            intra = parse_bandwidth(network.get("intra_node", DEFAULT_INTRA_NODE_BANDWIDTH), what=f"{source}: network.intra_node")
            inter = parse_bandwidth(network.get("inter_node", DEFAULT_INTER_NODE_BANDWIDTH), what=f"{source}: network.inter_node")
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
        return cls(
            num_nodes=nodes,
            devices_per_node=k,
            devices=devices,
            intra_node_bandwidth=intra,
            inter_node_bandwidth=inter,
            bandwidth_matrix=matrix,
        )

    def with_memory(self, memory_bytes: int | None) -> Cluster:
        """The same cluster with every device's memory capacity set to ``memory_bytes``."""
        return replace(self, devices=tuple(replace(d, memory_bytes=memory_bytes) for d in self.devices))

    def with_shape(self, num_nodes: int, devices_per_node: int) -> Cluster:
        """A cluster of another shape with this cluster's first device spec and bandwidths (for smaller-mesh search)."""
        if self.bandwidth_matrix is not None or len(set(self.devices)) > 1:
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
            intra_node_bandwidth=self.intra_node_bandwidth,
            inter_node_bandwidth=self.inter_node_bandwidth,
        )

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
        return self.intra_node_bandwidth if self.node_of(a) == self.node_of(b) else self.inter_node_bandwidth

    def memory_of(self, device: int) -> int | None:
        """Memory capacity of ``device`` in bytes (``None``: unlimited)."""
        return self.devices[device].memory_bytes

    def describe(self) -> str:
        """One line for humans, e.g. ``2x4 cpu, 200.00 MiB/device, intra 300.00 GB/s, inter 12.50 GB/s``."""
        types = sorted({d.type for d in self.devices})
        mems = sorted({d.memory_bytes for d in self.devices}, key=lambda m: -1 if m is None else m)
        mem = "/".join("unlimited" if m is None else format_bytes(m) for m in mems)
        net = (
            "bandwidth matrix"
            if self.bandwidth_matrix is not None
            else f"intra {format_bandwidth(self.intra_node_bandwidth)}, inter {format_bandwidth(self.inter_node_bandwidth)}"
        )
        return f"{self.shape} {'/'.join(types)}, {mem} per device, {net}"

    def to_dict(self) -> dict[str, Any]:
        """The mapping :meth:`from_dict` reads (bandwidths in bytes/s, memory in bytes)."""
        data: dict[str, Any] = {"nodes": self.num_nodes, "devices_per_node": self.devices_per_node}
        first = self.devices[0]
        data["device"] = _spec_dict(first)
        overrides = []
        for node in range(self.num_nodes):
            spec = self.devices[node * self.devices_per_node]
            if spec != first:
                overrides.append({"nodes": [node], **_spec_dict(spec)})
        if overrides:
            data["node_overrides"] = overrides
        network: dict[str, Any] = {"intra_node": self.intra_node_bandwidth, "inter_node": self.inter_node_bandwidth}
        if self.bandwidth_matrix is not None:
            network["matrix"] = [[0.0 if v == float("inf") else v for v in row] for row in self.bandwidth_matrix]
        data["network"] = network
        return data


def _spec_dict(spec: DeviceSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": spec.type, "speed": spec.speed}
    if spec.memory_bytes is not None:
        out["memory"] = spec.memory_bytes
    return out


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterError(f"{what} must be a positive integer, got {value!r}")
    return value


def _device_spec(data: dict[str, Any], base: DeviceSpec, where: str) -> DeviceSpec:
    bad = set(data) - {"type", "memory", "speed"}
    if bad:
        raise ClusterError(f"{where}: unknown key(s) {sorted(bad)}", fix="use type, memory, speed")
    spec = base
    if "type" in data:
        if not isinstance(data["type"], str) or not data["type"]:
            raise ClusterError(f"{where}: type must be a non-empty string, got {data['type']!r}")
        spec = replace(spec, type=data["type"])
    if "memory" in data:
        spec = replace(spec, memory_bytes=parse_bytes(data["memory"], what=f"{where}: memory"))
    if "speed" in data:
        speed = data["speed"]
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed <= 0:
            raise ClusterError(f"{where}: speed must be a positive number, got {speed!r}")
        spec = replace(spec, speed=float(speed))
    return spec
