"""The layer-time profile: what the throughput model knows about each layer of a model.

A :class:`TimeProfile` holds, for a model cut into an ordered chain of layers,

- per layer (:class:`LayerInfo`): the bytes that cross a pipeline-stage boundary placed right after the
  layer (per sample), the bytes of its gradients that data parallelism all-reduces, how many activation
  all-reduces tensor parallelism adds to it, and which parameters it shares with other layers;
- per device type, tensor-parallel degree and micro-batch size (:class:`TimingTable`): the forward and
  backward seconds of every layer on ONE device of that type, for one micro-batch of that many samples.

The JSON form (one object; keys marked * may be omitted)::

    {"format": "hybridplan.time_profile", "version": 1,
     "model": "gpt2-345m",
     "source": "where the numbers come from",                          *  (default "")
     "tensor_comm_in_times": false,                                    *  (default false)
     "host_cores": 2,                                                  *  (default null)
     "links": {"backend": "gloo", "allreduce_latency_s": 2.9e-4,      *  (default null: latency 0)
               "allreduce_bandwidth": 1.0e9, "p2p_latency_s": 1.9e-3, "p2p_bandwidth": 2.6e9, "source": "..."},
     "layers": [
       {"name": "block0", "activation_bytes_per_sample": 2097152, "parameter_bytes": 50384896,
        "tensor_parallel_allreduces": [2, 2],                          *  (default [0, 0])
        "parameter_tensors": 12,                                       *  (default null)
        "shared_parameters": null},                                    *  (default null)
       ...],
     "timings": [
       {"device_type": "T4", "tensor_degree": 1, "micro_batch_size": 1,
        "forward_s": [0.0049, ...], "backward_s": [0.0098, ...],       (one number per layer)
        "optimizer_s_per_byte": 1.2e-11,                               *  (default null)
        "overhead_s": 0.004},                                          *  (default null)
       ...]}

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

[Note: time vs micro-batch size] A micro-batch size between two profiled sizes is interpolated linearly
between them (piecewise-linear in samples through the measured points). Outside the profiled range a layer
takes ``max(F, c * b)`` seconds for ``b`` samples: the roofline form (Williams, Waterman and Patterson,
"Roofline: an insightful visual performance model", CACM 52(4), 2009: attainable time is the larger of a
memory-bound and a compute-bound time), with a fixed cost ``F`` that does not shrink with the batch (reading
the layer's weights, launching its kernels: the memory-bound roof of a small batch) and a per-sample cost
``c`` (the compute-bound roof). ``c`` is the per-sample time of the nearest profiled size (so the curve is
continuous there); ``F`` is where the line through the two smallest profiled sizes meets zero samples, kept
within [0, the smallest time profiled], and 0 with a single profiled size. So a profile with ONE size scales
proportionally to the samples, as AMP's cost model assumes (seed 002 section 3.4 and its ``cost_homo.py``),
which is how imported PipeDream and AMP profiles are read; above the largest profiled size every profile
scales proportionally from it (``c * b`` exceeds ``F`` there).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.profiling.links import LinkCosts

if TYPE_CHECKING:
    from hybridplan.profiling.store import ProfileStore

__all__ = ["FORMAT", "VERSION", "LayerInfo", "TimingTable", "TimeProfile", "time_profile_from_store", "scale_to_samples",
           "parameter_bytes", "parameter_tensors"]

FORMAT = "hybridplan.time_profile"
"""The value of the ``format`` key of every time-profile file."""

VERSION = 1
"""The JSON schema version this module reads and writes."""

_TOP_KEYS = {"format", "version", "model", "source", "tensor_comm_in_times", "host_cores", "links", "layers", "timings"}
_LAYER_KEYS = {"name", "activation_bytes_per_sample", "parameter_bytes", "tensor_parallel_allreduces", "shared_parameters",
               "parameter_tensors"}
_TIMING_KEYS = {"device_type", "tensor_degree", "micro_batch_size", "forward_s", "backward_s"}
_TIMING_OPTIONAL = {"optimizer_s_per_byte", "overhead_s"}


@dataclass(frozen=True, kw_only=True)
class LayerInfo:
    """Static facts about one layer of the chain (independent of device and batch)."""

    name: str
    """Human-readable name, e.g. ``"block3"``."""
    activation_bytes_per_sample: float
    """Bytes per sample that cross a stage boundary placed right after this layer (for a plain chain, the
    layer's output; for a linearised DAG, every earlier output still needed later). Also the volume of the
    layer's tensor-parallel all-reduces."""
    parameter_bytes: float
    """Bytes of this layer's gradients as a data-parallel all-reduce sends them (parameters x bytes per
    gradient element: 4 for fp32 gradients or DeepSpeed's ``fp32_allreduce``, 2 for fp16)."""
    tensor_parallel_allreduces: tuple[int, int] = (0, 0)
    """(forward, backward) all-reduces of the activation this layer needs when tensor-parallel. Megatron
    transformer block: (2, 2) (Shoeybi et al. 2019, section 3, figure 4)."""
    shared_parameters: str | None = None
    """Layers with the same tag hold one parameter tensor (tied embeddings): a stage counts it once."""
    parameter_tensors: int | None = None
    """Trainable parameter tensors of the layer (the runtime all-reduces each on its own); None: not recorded."""


@dataclass(frozen=True, kw_only=True)
class TimingTable:
    """Per-layer seconds on one device of ``device_type`` for a micro-batch of ``micro_batch_size`` samples."""

    device_type: str
    tensor_degree: int
    micro_batch_size: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    optimizer_s_per_byte: float | None = None
    """Seconds of the optimizer step per byte of parameters on the device (None: not measured)."""
    overhead_s: float | None = None
    """Seconds per iteration of a stage beyond its layers and its optimizer step (None: not measured)."""

    @property
    def key(self) -> tuple[str, int, int]:
        """``(device_type, tensor_degree, micro_batch_size)``, unique within a profile."""
        return (self.device_type, self.tensor_degree, self.micro_batch_size)


@dataclass(frozen=True, kw_only=True)
class TimeProfile:
    """Layer times and sizes of one model (format in the module docstring).

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

    def __post_init__(self) -> None:
        self.validate()
        for t in self.timings:
            entry = (t.micro_batch_size, np.asarray(t.forward_s, dtype=float), np.asarray(t.backward_s, dtype=float))
            self._index.setdefault((t.device_type, t.tensor_degree), []).append(entry)
        for entries in self._index.values():
            entries.sort(key=lambda e: e[0])

    # ------------------------------------------------------------------ queries
    @property
    def num_layers(self) -> int:
        """Length of the layer chain."""
        return len(self.layers)

    @property
    def device_types(self) -> tuple[str, ...]:
        """Profiled device types, the reference (first listed) first."""
        return tuple(dict.fromkeys(t.device_type for t in self.timings))

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

    def _tables(self, device_type: str, tensor_degree: int) -> list[TimingTable]:
        return sorted((t for t in self.timings if (t.device_type, t.tensor_degree) == (device_type, tensor_degree)),
                      key=lambda t: t.micro_batch_size)

    def optimizer_seconds_per_byte(self, device_type: str, tensor_degree: int) -> float | None:
        """The optimizer step's seconds per parameter byte on one device of ``device_type`` at ``tensor_degree``:
        the median over the profiled micro-batch sizes (the step does not depend on them); the degree-1 value
        where that degree has none; None where the profile measured none."""
        for t in (tensor_degree, 1):
            values = [x.optimizer_s_per_byte for x in self._tables(device_type, t) if x.optimizer_s_per_byte is not None]
            if values:
                return float(np.median(values))
        return None

    def overhead_seconds(self, device_type: str, tensor_degree: int, samples: float) -> float:
        """Per-iteration seconds of a stage beyond its layers and step, at ``samples`` per micro-batch (the
        measured sizes interpolated and extrapolated as layer times are: [Note: time vs micro-batch size]);
        the degree-1 value where that degree has none; 0 where the profile measured none."""
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
        """The JSON form (module docstring)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "source": self.source,
            "tensor_comm_in_times": self.tensor_comm_in_times,
            "host_cores": self.host_cores,
            **({"links": self.links.to_dict()} if self.links is not None else {}),
            "layers": [
                {
                    "name": layer.name,
                    "activation_bytes_per_sample": layer.activation_bytes_per_sample,
                    "parameter_bytes": layer.parameter_bytes,
                    "tensor_parallel_allreduces": list(layer.tensor_parallel_allreduces),
                    "shared_parameters": layer.shared_parameters,
                    **({"parameter_tensors": layer.parameter_tensors} if layer.parameter_tensors is not None else {}),
                }
                for layer in self.layers
            ],
            "timings": [
                {
                    "device_type": t.device_type,
                    "tensor_degree": t.tensor_degree,
                    "micro_batch_size": t.micro_batch_size,
                    "forward_s": list(t.forward_s),
                    "backward_s": list(t.backward_s),
                    "optimizer_s_per_byte": t.optimizer_s_per_byte,
                    "overhead_s": t.overhead_s,
                }
                for t in self.timings
            ],
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
        where = source_name
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where}: a time profile must be a JSON object, got {type(data).__name__}")
        _check_keys(data, _TOP_KEYS, {"format", "version", "model", "layers", "timings"}, where)
        if data["format"] != FORMAT:
            raise ProfileError(f"{where}: 'format' is {data['format']!r}, expected {FORMAT!r}", fix="is this a time profile?")
        if data["version"] != VERSION:
            raise ProfileError(f"{where}: version {data['version']!r} is not supported (this reader knows version {VERSION})")
        if not isinstance(data["model"], str):
            raise ProfileError(f"{where}: 'model' must be a string, got {data['model']!r}")
        comm = data.get("tensor_comm_in_times", False)
        if not isinstance(comm, bool):
            raise ProfileError(f"{where}: 'tensor_comm_in_times' must be true or false, got {comm!r}")
        source = data.get("source", "")
        if not isinstance(source, str):
            raise ProfileError(f"{where}: 'source' must be a string, got {source!r}")
        cores = data.get("host_cores")
        if cores is not None and (not _is_int(cores) or cores < 1):
            raise ProfileError(f"{where}: 'host_cores' must be a positive integer or null, got {cores!r}")
        layers = _list(data["layers"], f"{where}: 'layers'")
        timings = _list(data["timings"], f"{where}: 'timings'")
        links = None if data.get("links") is None else LinkCosts.from_dict(data["links"], f"{where}: 'links'")
        return cls(
            links=links,
            model=data["model"],
            source=source,
            tensor_comm_in_times=comm,
            host_cores=cores,
            layers=tuple(_layer_from_dict(x, f"{where}: layers[{i}]") for i, x in enumerate(layers)),
            timings=tuple(_timing_from_dict(x, f"{where}: timings[{i}]") for i, x in enumerate(timings)),
        )


def _layer_from_dict(data: Any, where: str) -> LayerInfo:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where} must be an object with keys {sorted(_LAYER_KEYS)}, got {data!r}")
    _check_keys(data, _LAYER_KEYS, {"name", "activation_bytes_per_sample", "parameter_bytes"}, where)
    if not isinstance(data["name"], str):
        raise ProfileError(f"{where}: 'name' must be a string, got {data['name']!r}")
    numbers = {k: _number(data[k], f"{where}: '{k}'") for k in ("activation_bytes_per_sample", "parameter_bytes")}
    ar = data.get("tensor_parallel_allreduces", [0, 0])
    if not isinstance(ar, Sequence) or isinstance(ar, str) or len(ar) != 2 or not all(_is_int(v) for v in ar):
        raise ProfileError(f"{where}: 'tensor_parallel_allreduces' must be [forward, backward] integers, got {ar!r}")
    shared = data.get("shared_parameters")
    if shared is not None and not isinstance(shared, str):
        raise ProfileError(f"{where}: 'shared_parameters' must be a string tag or null, got {shared!r}")
    tensors = data.get("parameter_tensors")
    if tensors is not None and not _is_int(tensors):
        raise ProfileError(f"{where}: 'parameter_tensors' must be an integer or null, got {tensors!r}")
    return LayerInfo(name=data["name"], tensor_parallel_allreduces=(int(ar[0]), int(ar[1])), shared_parameters=shared,
                     parameter_tensors=tensors, **numbers)


def _timing_from_dict(data: Any, where: str) -> TimingTable:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where} must be an object with keys {sorted(_TIMING_KEYS)}, got {data!r}")
    _check_keys(data, _TIMING_KEYS | _TIMING_OPTIONAL, _TIMING_KEYS, where)
    for k in ("tensor_degree", "micro_batch_size"):
        if not _is_int(data[k]):
            raise ProfileError(f"{where}: '{k}' must be an integer, got {data[k]!r}")
    times = {
        k: tuple(_number(v, f"{where}: '{k}'[{i}]") for i, v in enumerate(_list(data[k], f"{where}: '{k}'")))
        for k in ("forward_s", "backward_s")
    }
    optional = {k: None if data.get(k) is None else _number(data[k], f"{where}: '{k}'") for k in sorted(_TIMING_OPTIONAL)}
    return TimingTable(
        device_type=data["device_type"], tensor_degree=data["tensor_degree"], micro_batch_size=data["micro_batch_size"],
        forward_s=times["forward_s"], backward_s=times["backward_s"], optimizer_s_per_byte=optional["optimizer_s_per_byte"],
        overhead_s=optional["overhead_s"],
    )


def parameter_tensors(layers: Sequence[LayerInfo]) -> int:
    """The trainable parameter tensors one copy of ``layers`` holds, shared layers once (as :func:`parameter_bytes`);
    a layer that did not record its count (an older or imported profile) counts 1 if it has parameters: a lower
    bound, every layer with parameters has at least one tensor.

    Example:
        >>> parameter_tensors([LayerInfo(name="a", activation_bytes_per_sample=0, parameter_bytes=8, parameter_tensors=3),
        ...                    LayerInfo(name="b", activation_bytes_per_sample=0, parameter_bytes=8)])
        4
    """
    return sum(layer.parameter_tensors if layer.parameter_tensors is not None else int(layer.parameter_bytes > 0)
               for layer in _each_copy_once(layers))


def parameter_bytes(layers: Sequence[LayerInfo]) -> float:
    """The parameter bytes one copy of ``layers`` holds: layers that share parameters (tied embeddings) count once.

    Example:
        >>> parameter_bytes([LayerInfo(name="a", activation_bytes_per_sample=0, parameter_bytes=8, shared_parameters="e"),
        ...                  LayerInfo(name="b", activation_bytes_per_sample=0, parameter_bytes=8, shared_parameters="e")])
        8.0
    """
    return float(sum(layer.parameter_bytes for layer in _each_copy_once(layers)))


def _each_copy_once(layers: Sequence[LayerInfo]) -> Iterator[LayerInfo]:
    """``layers`` without the repeats of a shared parameter tag (tied embeddings: a stage holds one copy)."""
    seen: set[str] = set()
    for layer in layers:
        if layer.shared_parameters is not None:
            if layer.shared_parameters in seen:
                continue
            seen.add(layer.shared_parameters)
        yield layer


def scale_to_samples(sizes: Sequence[float], values: Sequence[np.ndarray], samples: float) -> np.ndarray:
    """Seconds at ``samples`` per micro-batch from seconds measured at ``sizes`` ([Note: time vs micro-batch
    size]): piecewise-linear between measured sizes, ``max(F, c * samples)`` outside them.

    Args:
        sizes: measured micro-batch sizes, ascending and distinct.
        values: per size, an array of seconds (one per layer, or a single number).
        samples: the micro-batch size wanted (> 0, may be fractional).

    Example:
        >>> [float(x) for x in scale_to_samples([2.0, 4.0], [np.array([3.0]), np.array([5.0])], 1.0)]  # F = 1
        [1.5]
        >>> [float(x) for x in scale_to_samples([2.0, 4.0], [np.array([3.0]), np.array([5.0])], 8.0)]
        [10.0]
    """
    arrays = [np.asarray(v, dtype=float) for v in values]
    for size, v in zip(sizes, arrays):
        if size == samples:
            return v
    if sizes[0] < samples < sizes[-1]:
        hi = next(i for i, s in enumerate(sizes) if s > samples)
        s0, s1 = sizes[hi - 1], sizes[hi]
        w = (samples - s0) / (s1 - s0)
        return arrays[hi - 1] + w * (arrays[hi] - arrays[hi - 1])
    if len(sizes) > 1:
        slope = (arrays[1] - arrays[0]) / (sizes[1] - sizes[0])
        fixed = np.clip(arrays[0] - sizes[0] * slope, 0.0, np.min(arrays, axis=0))
    else:
        fixed = np.zeros_like(arrays[0])
    nearest = 0 if samples < sizes[0] else len(sizes) - 1
    return np.maximum(fixed, arrays[nearest] * (samples / sizes[nearest]))


def _check_keys(data: Mapping[str, Any], known: set[str], required: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}", fix=f"the known keys are {sorted(known)}")
    missing = sorted(required - set(data))
    if missing:
        raise ProfileError(f"{where}: missing key(s) {missing}", fix=f"give {sorted(required)}")


def _list(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ProfileError(f"{where} must be a non-empty list, got {value!r}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where} must be a number, got {value!r}")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _finite_nonneg(value: Any) -> bool:
    return bool(isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
                and math.isfinite(value) and value >= 0)


def time_profile_from_store(store: ProfileStore, *, warn: Callable[[str], None] | None = None) -> TimeProfile:
    """The database's layer times as a :class:`TimeProfile` (written by profiling/timing.py: see its docstring and [Note: layers that cannot be split] there).

    A (device type, degree, micro-batch size) with a layer missing (a failed or unfinished run) is left out,
    and ``warn`` is told.

    Raises:
        ProfileError: if the database holds no complete timing table.
    """
    meta = store.meta()
    say = warn or (lambda msg: print(msg, file=sys.stderr))
    if "time_layers" not in meta:
        raise ProfileError(f"{str(store.path)!r} holds no layer times", fix="measure them with 'hybridplan profile --time'")
    layers = tuple(LayerInfo(name=d["name"], activation_bytes_per_sample=d["activation_bytes_per_sample"],
                             parameter_bytes=d["parameter_bytes"],
                             tensor_parallel_allreduces=tuple(d["tensor_parallel_allreduces"]),
                             shared_parameters=d.get("shared_parameters"), parameter_tensors=d.get("parameter_tensors"))
                   for d in meta["time_layers"])
    unsplittable = {int(t): set(ls) for t, ls in (meta.get("time_unsplittable") or {}).items()}
    times = store.layer_times()
    costs = store.run_costs()
    tables = []
    for (dtype, t, b), rows in sorted(times.items()):
        fwd, bwd = [], []
        for l in range(len(layers)):
            row = rows.get(l)
            if row is None and l in unsplittable.get(t, ()):
                row = times.get((dtype, 1, b), {}).get(l)
            if row is None:
                break
            fwd.append(row[0])
            bwd.append(row[1])
        if len(fwd) < len(layers):
            say(f"layer times of {dtype!r} at tensor degree {t}, micro-batch {b} are incomplete (layer {len(fwd)}"
                " missing): left out; run 'hybridplan profile --time' again to finish them")
            continue
        rate, overhead = _costs_of(costs.get((dtype, t, b), []))
        tables.append(TimingTable(device_type=dtype, tensor_degree=t, micro_batch_size=b, forward_s=tuple(fwd),
                                  backward_s=tuple(bwd), optimizer_s_per_byte=rate, overhead_s=overhead))
    if not tables:
        raise ProfileError(f"{str(store.path)!r} holds no complete layer-time table",
                           fix="run 'hybridplan profile --time' until it finishes")
    identity = meta.get("time_identity", {})
    source = (f"hybridplan profile --time: runtime hooks, median of micro-batches per layer, slowest tensor rank;"
              f" {identity.get('device', 'cpu')} devices, {identity.get('precision', 'fp32')}")
    cores = meta.get("time_host_cores")
    links = meta.get("time_links")
    return TimeProfile(model=str(identity.get("model", meta.get("model", "model"))), layers=layers,
                       timings=tuple(tables), tensor_comm_in_times=True, source=source,
                       host_cores=int(cores) if cores is not None else None,
                       links=LinkCosts.from_dict(links, f"{str(store.path)!r}: time_links") if links is not None else None)


def _costs_of(runs: Sequence[tuple[int, int, float, float, float]]) -> tuple[float | None, float | None]:
    """(optimizer seconds per parameter byte, overhead seconds) of one timing table from its runs' costs
    (profiling/timing.py, [Note: optimizer step and overhead]): the steps of all chunk runs over all their bytes;
    the largest overhead of a chunk run (each pays the per-iteration costs once, as one stage would)."""
    if not runs:
        return None, None
    nbytes = sum(r[2] for r in runs)
    rate = sum(r[3] for r in runs) / nbytes if nbytes > 0 else None
    return rate, max(r[4] for r in runs)
