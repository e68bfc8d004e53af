"""The layer-time profile: what the throughput model knows about each layer of a model.

A :class:`TimeProfile` holds, for a model cut into an ordered chain of layers,

- per layer (:class:`LayerInfo`): the bytes that cross a pipeline-stage boundary placed right after the
  layer (per sample), the bytes of its gradients that data parallelism all-reduces, how many activation
  all-reduces tensor parallelism adds to it, and which parameters it shares with other layers;
- per device type, tensor-parallel degree and micro-batch size (:class:`TimingTable`): the forward and
  backward seconds of every layer on ONE device of that type, for one micro-batch of that many samples.

Its JSON form is in :mod:`hybridplan.profiling.time_profile_json`; a database's profile is read by
:mod:`hybridplan.profiling.stored_time_profile`.

``tensor_comm_in_times`` says whether the times at tensor degree > 1 were measured inside a real
tensor-parallel group and so already contain its all-reduces (AMP's profiles do); when false the time model
adds them from ``tensor_parallel_allreduces`` (see :mod:`hybridplan.predict.stage_compute`).

``optimizer_s_per_byte`` is the optimizer step's seconds per byte of parameters a device holds
(``parameter_bytes`` summed over the timed layers, divided by the tensor degree), and ``overhead_s`` the
seconds of one training iteration of a stage that neither its layers nor its optimizer step explain
(profiling/timing.py measures both; null: not measured, e.g. imported profiles, and the time model adds
nothing). ``host_cores`` is set when the devices are processes sharing one host's CPU cores (the CPU
runtime): how many cores the profile's devices shared (null: every device has its own hardware).

``links`` is the per-message latency and the bandwidth of the runtime's backend that ``profile --time``
measured (profiling/links.py, [Note: Hockney's alpha-beta model]); ``parameter_tensors`` the layer's
trainable parameter tensors, one gradient all-reduce each in the runtime's data-parallel sync. A profile
written before they existed, or imported (PipeDream, AMP), has neither: the time model then charges no
per-message latency unless the cluster file gives one (predict/communication.py, [Note: per-message latency]).

The first device type in ``timings`` is the *reference*: a cluster device whose type the profile lacks
runs the reference times divided by its ``speed`` (:class:`hybridplan.plan.cluster.DeviceSpec`).

Layer times at a micro-batch size between or beyond the profiled ones: [Note: time vs micro-batch size] in
profiling/timing_table.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.time_profile_json import (
    _TIMING_OPTIONAL,
    FORMAT,
    VERSION,
    _is_int,
    layer_to_dict,
    parse_time_profile,
    timing_to_dict,
)
from hybridplan.profiling.timing_table import TimingTable, scale_to_samples

__all__ = ["TimeProfile"]


@dataclass(frozen=True, kw_only=True)
class TimeProfile:
    """Layer times and sizes of one model (format in :mod:`hybridplan.profiling.time_profile_json`).

    Example:
        >>> p = TimeProfile(model="toy", layers=(LayerInfo(name="l0", activation_bytes_per_sample=8.0,
        ...     parameter_bytes=16.0),), timings=(TimingTable(device_type="cpu", tensor_degree=1,
        ...     micro_batch_size=2, forward_s=(1.0,), backward_s=(2.0,)),))
        >>> [float(x) for x in p.layer_times("cpu", 1, 4)[0]]
        [2.0]
    """

    model: str
    layers: tuple[LayerInfo, ...]
    timings: tuple[TimingTable, ...]
    tensor_comm_in_times: bool = False
    source: str = ""
    host_cores: int | None = None
    """CPU cores the profile's devices (processes of one host) shared; None: devices have their own hardware."""
    links: LinkCosts | None = None
    """Measured per-message latency and bandwidth of the backend (None: not measured, latency 0)."""
    _index: dict[tuple[str, int], list[tuple[int, np.ndarray, np.ndarray]]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _types: list[str] = field(init=False, repr=False, compare=False, default_factory=list)
    kept: dict[tuple[Any, ...], Any] = field(init=False, repr=False, compare=False, default_factory=dict)
    """What the time model derived from this profile, by key (:meth:`keep`)."""

    def __post_init__(self) -> None:
        self.validate()
        for t in self.timings:
            entry = (t.micro_batch_size, np.asarray(t.forward_s, dtype=float), np.asarray(t.backward_s, dtype=float))
            self._index.setdefault((t.device_type, t.tensor_degree), []).append(entry)
        for entries in self._index.values():
            entries.sort(key=lambda e: e[0])
        self._types.extend(dict.fromkeys(t.device_type for t in self.timings))

    # ------------------------------------------------------------------ queries
    @property
    def num_layers(self) -> int:
        """Length of the layer chain."""
        return len(self.layers)

    @property
    def device_types(self) -> tuple[str, ...]:
        """Profiled device types, the reference (first listed) first (listed once: a throughput search asks millions
        of times)."""
        return tuple(self._types)

    @property
    def reference_device_type(self) -> str:
        """The device type whose times, divided by speed, stand in for unprofiled types."""
        return self.timings[0].device_type

    def tensor_degrees(self, device_type: str | None = None) -> tuple[int, ...]:
        """Tensor-parallel degrees profiled for ``device_type`` (default: the reference type), ascending."""
        dtype = device_type or self.reference_device_type
        return tuple(sorted({tp for (d, tp) in self._index if d == dtype}))

    def activation_bytes(self) -> np.ndarray:
        """Per-sample boundary bytes of every layer, as an array."""
        return np.array([layer.activation_bytes_per_sample for layer in self.layers], dtype=float)

    def layer_times(self, device_type: str, tensor_degree: int, samples: float) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of every layer for a micro-batch of ``samples`` on one device.

        Args:
            device_type: a profiled device type.
            tensor_degree: a profiled tensor-parallel degree for that type.
            samples: samples the device processes per micro-batch (may be fractional).

        Returns:
            ``(forward_s, backward_s)``, arrays of length :attr:`num_layers`.

        Raises:
            ProfileError: if the type or degree was not profiled.
        """
        entries = self._index.get((device_type, tensor_degree))
        if entries is None:
            if device_type not in self.device_types:
                raise ProfileError(
                    f"time profile of {self.model!r} has no timings for device type {device_type!r}"
                    f" (profiled: {list(self.device_types)})",
                    fix="profile this device type, or give the device a type the profile has and a relative speed",
                )
            raise ProfileError(
                f"time profile of {self.model!r} has no timings at tensor-parallel degree {tensor_degree} on"
                f" {device_type!r} (profiled degrees: {list(self.tensor_degrees(device_type))})",
                fix="profile that degree, or search only the profiled degrees",
            )
        if samples <= 0:
            raise ProfileError(f"a micro-batch must hold a positive number of samples, got {samples}")
        sizes = [float(e[0]) for e in entries]
        fwd = scale_to_samples(sizes, [e[1] for e in entries], samples)
        bwd = scale_to_samples(sizes, [e[2] for e in entries], samples)
        return fwd, bwd

    def keep(self, key: tuple[Any, ...], make: Callable[[], Any], cluster: Any = None) -> Any:
        """``make()`` once per ``key`` (and ``cluster``: a value for one cluster is kept beside it, so that another
        object at its id is never mistaken for it), kept in :attr:`kept`: a throughput search asks the time model
        for the same stage configurations under every cut and stage option."""
        full = key if cluster is None else (*key, id(cluster))
        held = self.kept.get(full)
        if held is None or held[0] is not cluster:
            held = self.kept[full] = (cluster, make())
        return held[1]

    def _tables(self, device_type: str, tensor_degree: int) -> list[TimingTable]:
        """The timing tables of ``device_type`` at ``tensor_degree`` by micro-batch size, kept per pair (a throughput
        search asks for a stage's overhead every time it times one)."""
        tables: list[TimingTable] = self.keep(("tables", device_type, tensor_degree), lambda: sorted(
            (t for t in self.timings if (t.device_type, t.tensor_degree) == (device_type, tensor_degree)),
            key=lambda t: t.micro_batch_size))
        return tables

    def optimizer_seconds_per_byte(self, device_type: str, tensor_degree: int) -> float | None:
        """The optimizer step's seconds per parameter byte on one device of ``device_type`` at ``tensor_degree``:
        the median over the profiled micro-batch sizes (the step does not depend on them); the degree-1 value
        where that degree has none; None where the profile measured none. Kept per device type and degree in
        :attr:`kept`: a throughput search asks it for every stage it times (107,323 times for Llama-3-70B on 32x8,
        each a walk over every timing table)."""
        rate: float | None = self.keep(("optimizer seconds per byte", device_type, tensor_degree),
                                       lambda: self._optimizer_seconds_per_byte(device_type, tensor_degree))
        return rate

    def _optimizer_seconds_per_byte(self, device_type: str, tensor_degree: int) -> float | None:
        for t in (tensor_degree, 1):
            values = [x.optimizer_s_per_byte for x in self._tables(device_type, t) if x.optimizer_s_per_byte is not None]
            if values:
                return float(np.median(values))
        return None

    def overhead_seconds(self, device_type: str, tensor_degree: int, samples: float) -> float:
        """Per-iteration seconds of a stage beyond its layers and step, at ``samples`` per micro-batch (the
        measured sizes interpolated and extrapolated as layer times are: [Note: time vs micro-batch size]);
        the degree-1 value where that degree has none; 0 where the profile measured none. Kept in :attr:`kept`
        (a throughput search asks it for every stage it times)."""
        seconds: float = self.keep(("overhead seconds", device_type, tensor_degree, samples),
                                   lambda: self._overhead_seconds(device_type, tensor_degree, samples))
        return seconds

    def _overhead_seconds(self, device_type: str, tensor_degree: int, samples: float) -> float:
        for t in (tensor_degree, 1):
            tables = [x for x in self._tables(device_type, t) if x.overhead_s is not None]
            if tables:
                sizes = [float(x.micro_batch_size) for x in tables]
                values = [np.array([x.overhead_s], dtype=float) for x in tables]
                return float(scale_to_samples(sizes, values, samples)[0])
        return 0.0

    # ------------------------------------------------------------------ rules
    def validate(self) -> None:
        """Check sizes, signs and uniqueness of the tables.

        Raises:
            ProfileError: naming the first bad value and the fix.
        """
        where = f"time profile of {self.model!r}"
        if not self.layers:
            raise ProfileError(f"{where} has no layers", fix="list at least one layer")
        if not self.timings:
            raise ProfileError(f"{where} has no timings", fix="give at least one timing table")
        for i, layer in enumerate(self.layers):
            for name in ("activation_bytes_per_sample", "parameter_bytes"):
                value = getattr(layer, name)
                if not _finite_nonneg(value):
                    raise ProfileError(f"{where}: layers[{i}] ({layer.name!r}) {name} must be a finite number >= 0, got {value!r}")
            if layer.parameter_tensors is not None and not (_is_int(layer.parameter_tensors) and layer.parameter_tensors >= 0):
                raise ProfileError(f"{where}: layers[{i}] ({layer.name!r}) parameter_tensors must be an integer >= 0"
                                   f" or null, got {layer.parameter_tensors!r}")
            ar = layer.tensor_parallel_allreduces
            if len(ar) != 2 or not all(_is_int(v) and v >= 0 for v in ar):
                raise ProfileError(
                    f"{where}: layers[{i}] ({layer.name!r}) tensor_parallel_allreduces must be [forward, backward]"
                    f" non-negative integers, got {list(ar)!r}",
                    fix="a Megatron transformer block has [2, 2]; a layer without tensor-parallel communication [0, 0]",
                )
        seen: set[tuple[str, int, int]] = set()
        for j, t in enumerate(self.timings):
            at = f"{where}: timings[{j}] ({t.device_type!r}, tensor degree {t.tensor_degree}, micro-batch {t.micro_batch_size})"
            if not isinstance(t.device_type, str) or not t.device_type:
                raise ProfileError(f"{where}: timings[{j}] device_type must be a non-empty string, got {t.device_type!r}")
            if not _is_int(t.tensor_degree) or t.tensor_degree < 1:
                raise ProfileError(f"{at}: tensor_degree must be an integer >= 1")
            if not _is_int(t.micro_batch_size) or t.micro_batch_size < 1:
                raise ProfileError(f"{at}: micro_batch_size must be an integer >= 1")
            if t.key in seen:
                raise ProfileError(f"{at} appears twice", fix="keep one table per (device_type, tensor_degree, micro_batch_size)")
            seen.add(t.key)
            for name in ("forward_s", "backward_s"):
                values = getattr(t, name)
                if len(values) != len(self.layers):
                    raise ProfileError(
                        f"{at}: {name} has {len(values)} entries but the profile has {len(self.layers)} layers",
                        fix="give one time per layer, in layer order",
                    )
                bad = next((k for k, v in enumerate(values) if not _finite_nonneg(v)), None)
                if bad is not None:
                    raise ProfileError(f"{at}: {name}[{bad}] must be a finite number of seconds >= 0, got {values[bad]!r}")
            for name in sorted(_TIMING_OPTIONAL):
                value = getattr(t, name)
                if value is not None and not _finite_nonneg(value):
                    raise ProfileError(f"{at}: {name} must be a finite number >= 0 or null, got {value!r}")
        if self.host_cores is not None and (not _is_int(self.host_cores) or self.host_cores < 1):
            raise ProfileError(f"{where}: host_cores must be a positive integer or null, got {self.host_cores!r}",
                               fix="give the CPU cores the profiled processes shared, or null for accelerators")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON form (:mod:`hybridplan.profiling.time_profile_json`)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "source": self.source,
            "tensor_comm_in_times": self.tensor_comm_in_times,
            "host_cores": self.host_cores,
            **({"links": self.links.to_dict()} if self.links is not None else {}),
            "layers": [layer_to_dict(layer) for layer in self.layers],
            "timings": [timing_to_dict(t) for t in self.timings],
        }

    def to_json(self) -> str:
        """Indented JSON, one layer or timing table per line."""
        d = self.to_dict()
        head = json.dumps({k: v for k, v in d.items() if k not in ("layers", "timings")})[:-1]
        layers = ",\n    ".join(json.dumps(x) for x in d["layers"])
        timings = ",\n    ".join(json.dumps(x) for x in d["timings"])
        return f'{head},\n  "layers": [\n    {layers}],\n  "timings": [\n    {timings}]}}\n'

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> TimeProfile:
        """Read and validate a profile file.

        Raises:
            ProfileError: if the file is missing, not JSON, or breaks the format.
        """
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise ProfileError(f"time profile {str(p)!r} does not exist", fix="check the path") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileError(f"time profile {str(p)!r} cannot be read: {getattr(e, 'strerror', None) or e}",
                               fix="give a layer-time JSON file") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(f"time profile {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return cls.from_dict(data, source_name=str(p))

    @classmethod
    def from_dict(cls, data: Any, *, source_name: str = "time profile") -> TimeProfile:
        """Parse and validate the JSON form.

        Raises:
            ProfileError: naming the bad key or value and the fix.
        """
        return cls(**parse_time_profile(data, source_name))


def _finite_nonneg(value: Any) -> bool:
    return bool(isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
                and math.isfinite(value) and value >= 0)
