"""One accelerator of a cluster (:class:`DeviceSpec`), and the readers of the fields a cluster TOML gives a device or
a link (plan/cluster.py reads the file): each checks one value and names it in its error. This module imports no
torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hybridplan.errors import ClusterError
from hybridplan.plan.gpus import Gpu, gpu_spec
from hybridplan.units import parse_bandwidth, parse_bytes

__all__ = ["DeviceSpec", "spec_dict", "positive_int", "link_bandwidth_of", "gpu_of", "gpu_link", "device_spec_of"]


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator."""

    type: str = "cpu"
    """Device type name; time profiles are keyed by it."""
    memory_bytes: int | None = None
    """Memory capacity in bytes; ``None`` means unlimited (no out-of-memory check)."""
    speed: float = 1.0
    """Relative compute speed: a layer takes ``time / speed`` on this device."""
    gpu: str | None = None
    """The device's model in the GPU catalogue (plan/gpus.py), e.g. ``"h100-sxm"``: its peak rates, link and CUDA
    terms (the simulated device's cuBLAS workspace); None: no model named (a CPU, or ``--device cuda`` alone)."""

    def __post_init__(self) -> None:
        if self.gpu is not None:
            object.__setattr__(self, "gpu", gpu_spec(self.gpu).key)  # checked, and spelled as the catalogue does
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ClusterError(f"device memory must be positive, got {self.memory_bytes} bytes",
                               fix="give a capacity such as --device-memory 40GiB, or none for unlimited")
        if not (isinstance(self.speed, (int, float)) and 0 < self.speed < math.inf):
            raise ClusterError(f"device speed must be a positive number, got {self.speed!r}")


def spec_dict(spec: DeviceSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": spec.type, "speed": spec.speed}
    if spec.memory_bytes is not None:
        out["memory"] = spec.memory_bytes
    if spec.gpu is not None:
        out["gpu"] = spec.gpu
    return out


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterError(f"{what} must be a positive integer, got {value!r}")
    return value


def link_bandwidth_of(value: Any, where: str) -> float:
    """A link's bytes/s from TOML ("600GB/s", "100Gbps" or a number), positive and finite."""
    bandwidth = parse_bandwidth(value, what=where)
    if not 0 < bandwidth <= math.inf:  # NaN fails; infinite means "free" (as before)
        raise ClusterError(f"{where} must be a positive bandwidth, got {value!r}", fix='e.g. "600GB/s" or "100Gbps"')
    return bandwidth


def gpu_of(value: Any, where: str) -> Gpu:
    """The catalogue GPU a table's ``gpu`` key names."""
    if not isinstance(value, str):
        raise ClusterError(f"{where}: gpu must be the name of a GPU, got {value!r}", fix='e.g. gpu = "h100-sxm"')
    try:
        return gpu_spec(value)
    except ClusterError as e:
        raise ClusterError(f"{where}: {e.message}", fix=e.fix) from None


def gpu_link(data: dict[str, Any], where: str) -> float | None:
    """The intra-node bytes/s a table's ``gpu`` key implies (its GPU's default link), None if it names none or the
    catalogue does not know the link's rate."""
    return gpu_of(data["gpu"], where).link_bandwidth if "gpu" in data else None


def device_spec_of(data: dict[str, Any], base: DeviceSpec, where: str) -> DeviceSpec:
    if not isinstance(data, dict):
        raise ClusterError(f"{where} must be a table, got {data!r}", fix='e.g. [device] with type = "A100"')
    bad = set(data) - {"type", "memory", "speed", "gpu"}
    if bad:
        raise ClusterError(f"{where}: unknown key(s) {sorted(bad)}",
                           fix="use gpu, type, memory, speed (and intra_node in node_overrides)")
    spec = base
    if "gpu" in data:
        model = gpu_of(data["gpu"], where)
        spec = replace(spec, gpu=model.key, memory_bytes=model.memory_bytes, type="cuda")
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
