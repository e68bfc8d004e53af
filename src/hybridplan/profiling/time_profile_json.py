"""The JSON form of a time profile: its keys, and each part read with checks and written back.

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

What the keys mean: :mod:`hybridplan.profiling.time_profile`, :class:`~hybridplan.profiling.layer_info.LayerInfo`
and :class:`~hybridplan.profiling.timing_table.TimingTable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hybridplan.errors import ProfileError
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.timing_table import TimingTable

__all__ = ["FORMAT", "VERSION", "parse_time_profile", "layer_to_dict", "timing_to_dict"]

FORMAT = "hybridplan.time_profile"
"""The value of the ``format`` key of every time-profile file."""

VERSION = 1
"""The JSON schema version this module reads and writes."""

_TOP_KEYS = {"format", "version", "model", "source", "tensor_comm_in_times", "host_cores", "links", "layers", "timings"}
_LAYER_KEYS = {"name", "activation_bytes_per_sample", "parameter_bytes", "tensor_parallel_allreduces", "shared_parameters",
               "parameter_tensors"}
_TIMING_KEYS = {"device_type", "tensor_degree", "micro_batch_size", "forward_s", "backward_s"}
_TIMING_OPTIONAL = {"optimizer_s_per_byte", "overhead_s"}


def parse_time_profile(data: Any, source_name: str) -> dict[str, Any]:
    """The fields of a :class:`~hybridplan.profiling.time_profile.TimeProfile` from its JSON form, each checked.

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
    return dict(
        links=links,
        model=data["model"],
        source=source,
        tensor_comm_in_times=comm,
        host_cores=cores,
        layers=tuple(_layer_from_dict(x, f"{where}: layers[{i}]") for i, x in enumerate(layers)),
        timings=tuple(_timing_from_dict(x, f"{where}: timings[{i}]") for i, x in enumerate(timings)),
    )


def layer_to_dict(layer: LayerInfo) -> dict[str, Any]:
    """The JSON form of one layer."""
    return {
        "name": layer.name,
        "activation_bytes_per_sample": layer.activation_bytes_per_sample,
        "parameter_bytes": layer.parameter_bytes,
        "tensor_parallel_allreduces": list(layer.tensor_parallel_allreduces),
        "shared_parameters": layer.shared_parameters,
        **({"parameter_tensors": layer.parameter_tensors} if layer.parameter_tensors is not None else {}),
    }


def timing_to_dict(t: TimingTable) -> dict[str, Any]:
    """The JSON form of one timing table."""
    return {
        "device_type": t.device_type,
        "tensor_degree": t.tensor_degree,
        "micro_batch_size": t.micro_batch_size,
        "forward_s": list(t.forward_s),
        "backward_s": list(t.backward_s),
        "optimizer_s_per_byte": t.optimizer_s_per_byte,
        "overhead_s": t.overhead_s,
    }


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
