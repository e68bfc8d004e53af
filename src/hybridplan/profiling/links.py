"""The links of the runtime's backend as the time model needs them: Hockney's per-message latency and bandwidth.

[Note: Hockney's alpha-beta model] (R. Hockney, "The communication challenge for MPP: Intel Paragon and Meiko
CS-2", Parallel Computing 20(3), 1994): a message of ``n`` bytes takes ``alpha + n / beta`` seconds, ``alpha``
the fixed cost of one message (the software stack, waking the receiver), ``beta`` the bandwidth. A ring
all-reduce of ``n`` bytes over ``p`` processes makes ``2 (p - 1)`` steps, each sending ``n / p`` bytes
(reduce-scatter then all-gather: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 69(2), 2009), so it takes ``2 (p - 1) alpha + 2 (p - 1) / p * n / beta``.

``profile --time`` measures both with the runtime's own backend between two of its own processes
(runtime/link_probe.py: gloo on CPU, NCCL on CUDA) and :func:`link_costs` solves the two equations per kind
of message, from a small (``s`` bytes: all latency) and a large (``L`` bytes) message:

- all-reduce, ``p = 2`` (2 steps): ``alpha = T_s / 2``; ``beta = L / (T_L - T_s)`` (``2 (p-1) / p = 1``);
- point-to-point, ping-pong round trips ``R`` (two messages): ``alpha = R_s / 2``; ``beta = L / ((R_L - R_s) / 2)``.

The all-reduce's ``alpha`` is per ring step and its ``beta`` the ring's bus bandwidth at ``p = 2``; the
time model scales them with ``p`` by the formula above. gloo (the CPU runtime's backend) runs exactly such a
ring when no algorithm is asked for (gloo/allreduce.cc, ``allreduce()``: ``UNSPECIFIED`` goes to ``ring()``;
torch's ProcessGroupGloo asks for none): a small input is cut into ``2p`` segments and each of the two phases
issues ``numSegments - numSegmentsPerRank = 2 (p - 1)`` sends to the ring neighbour, two in flight at a time,
a number of sequential steps proportional to ``p - 1``. NCCL's ring all-reduce also makes ``2 (p - 1)``
steps. The scaling with ``p`` is the algorithms', not measured here (the probe starts two processes).
A large message that measured no slower than the
small one (a disturbed host) leaves ``beta`` unmeasured (None).

Imported profiles (PipeDream, AMP: profiling/importers.py) have no link measurement: ``links`` is None and
the time model charges no latency (alpha = 0) unless the cluster file gives one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridplan.errors import ProfileError

__all__ = ["LinkCosts", "link_costs", "measure_links"]

_KEYS = {"backend", "allreduce_latency_s", "allreduce_bandwidth", "p2p_latency_s", "p2p_bandwidth", "source"}


@dataclass(frozen=True, kw_only=True)
class LinkCosts:
    """Per-message latency and bandwidth of a backend's links on the profiled host (module docstring)."""

    backend: str
    """The torch.distributed backend measured ("gloo", "nccl")."""
    allreduce_latency_s: float
    """Seconds per ring step of an all-reduce (alpha)."""
    allreduce_bandwidth: float | None
    """Bytes/s of an all-reduce's ring (beta); None: not measured."""
    p2p_latency_s: float
    """Seconds per point-to-point message (alpha)."""
    p2p_bandwidth: float | None
    """Bytes/s of a point-to-point message (beta); None: not measured."""
    source: str = ""
    """How they were measured."""

    def __post_init__(self) -> None:
        for name in ("allreduce_latency_s", "p2p_latency_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ProfileError(f"links: {name} must be a finite number of seconds >= 0, got {value!r}")
        for name in ("allreduce_bandwidth", "p2p_bandwidth"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ProfileError(f"links: {name} must be a positive number of bytes/s or null, got {value!r}")
        if not isinstance(self.backend, str) or not isinstance(self.source, str):
            raise ProfileError(f"links: backend and source must be strings, got {self.backend!r}, {self.source!r}")

    def latency(self, kind: str) -> float:
        """alpha of ``kind`` ("allreduce": per ring step, or "p2p")."""
        return self.allreduce_latency_s if kind == "allreduce" else self.p2p_latency_s

    def bandwidth(self, kind: str) -> float | None:
        """beta of ``kind`` ("allreduce" or "p2p"); None if not measured."""
        return self.allreduce_bandwidth if kind == "allreduce" else self.p2p_bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a time profile's ``links``)."""
        return {k: getattr(self, k) for k in sorted(_KEYS)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "links") -> LinkCosts:
        """Parse the JSON form.

        Raises:
            ProfileError: naming the bad key or value.
        """
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where} must be an object with keys {sorted(_KEYS)}, got {data!r}")
        unknown = sorted(set(data) - _KEYS)
        missing = sorted({"backend", "allreduce_latency_s", "p2p_latency_s"} - set(data))
        if unknown or missing:
            raise ProfileError(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}",
                               fix=f"the keys are {sorted(_KEYS)} (bandwidths and source may be omitted)")
        try:
            return cls(backend=data["backend"], allreduce_latency_s=data["allreduce_latency_s"],
                       allreduce_bandwidth=data.get("allreduce_bandwidth"), p2p_latency_s=data["p2p_latency_s"],
                       p2p_bandwidth=data.get("p2p_bandwidth"), source=data.get("source", ""))
        except ProfileError as e:
            raise ProfileError(f"{where}: {e.message}", fix=e.fix) from None


def link_costs(probe: Mapping[str, Any]) -> LinkCosts:
    """alpha and beta from the seconds runtime/link_probe.py measured (the equations of the module docstring).

    Example:
        >>> c = link_costs({"backend": "gloo", "processes": 2, "small_bytes": 4, "large_bytes": 1000,
        ...     "allreduce_small_s": 0.002, "allreduce_large_s": 0.003, "roundtrip_small_s": 0.004,
        ...     "roundtrip_large_s": 0.006})
        >>> (c.allreduce_latency_s, c.allreduce_bandwidth, c.p2p_latency_s, c.p2p_bandwidth)
        (0.001, 1000000.0, 0.002, 1000000.0)
    """
    if probe.get("processes") != 2:
        raise ProfileError(f"the link probe must run 2 processes, got {probe.get('processes')!r}")
    large = float(probe["large_bytes"])
    ar_s, ar_l = float(probe["allreduce_small_s"]), float(probe["allreduce_large_s"])
    rt_s, rt_l = float(probe["roundtrip_small_s"]), float(probe["roundtrip_large_s"])
    ar_bw = large / (ar_l - ar_s) if ar_l > ar_s else None
    p2p_bw = large / ((rt_l - rt_s) / 2) if rt_l > rt_s else None
    source = (f"{probe['backend']}, 2 processes of this host (runtime/link_probe.py): all-reduce and ping-pong of"
              f" {int(probe['small_bytes'])} and {int(large)} bytes")
    return LinkCosts(backend=str(probe["backend"]), allreduce_latency_s=ar_s / 2, allreduce_bandwidth=ar_bw,
                     p2p_latency_s=rt_s / 2, p2p_bandwidth=p2p_bw, source=source)


def measure_links(device_type: str = "cpu") -> LinkCosts:
    """Measure the runtime's backend between two local processes on ``device_type`` (runtime/link_probe.py).

    Raises:
        ProfileError: if the probe failed (its reason).
    """
    from hybridplan.runtime.link_probe import probe_links

    try:
        return link_costs(probe_links(device_type))
    except RuntimeError as e:
        raise ProfileError(str(e), fix="run 'hybridplan run' on a two-device plan to see what fails") from None
