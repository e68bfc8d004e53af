"""TimeProfile: JSON round trip, validation messages, and the micro-batch lookup rules."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridplan.errors import ProfileError
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.layer_info import LayerInfo
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.time_profile_json import FORMAT
from hybridplan.profiling.timing_table import TimingTable


def _profile() -> TimeProfile:
    return TimeProfile(
        model="toy",
        source="hand-written",
        layers=(
            LayerInfo(name="embed", activation_bytes_per_sample=8.0, parameter_bytes=100.0, shared_parameters="emb"),
            LayerInfo(name="block", activation_bytes_per_sample=8.0, parameter_bytes=50.0, tensor_parallel_allreduces=(2, 2)),
            LayerInfo(name="head", activation_bytes_per_sample=4.0, parameter_bytes=100.0, shared_parameters="emb"),
        ),
        timings=(
            TimingTable(device_type="A", tensor_degree=1, micro_batch_size=2, forward_s=(1.0, 2.0, 3.0), backward_s=(2.0, 4.0, 6.0)),
            TimingTable(device_type="A", tensor_degree=1, micro_batch_size=4, forward_s=(3.0, 4.0, 5.0), backward_s=(6.0, 8.0, 10.0)),
            TimingTable(device_type="A", tensor_degree=2, micro_batch_size=2, forward_s=(0.5, 1.0, 1.5), backward_s=(1.0, 2.0, 3.0)),
            TimingTable(device_type="B", tensor_degree=1, micro_batch_size=2, forward_s=(2.0, 2.0, 2.0), backward_s=(4.0, 4.0, 4.0)),
        ),
    )


def test_json_round_trip(tmp_path: Path) -> None:
    p = _profile()
    p.save(tmp_path / "t.json")
    q = TimeProfile.load(tmp_path / "t.json")
    assert q == p
    assert json.loads((tmp_path / "t.json").read_text())["format"] == FORMAT


def test_optional_keys_default() -> None:
    d = _profile().to_dict()
    for layer in d["layers"]:
        del layer["tensor_parallel_allreduces"], layer["shared_parameters"]
    del d["source"], d["tensor_comm_in_times"], d["host_cores"]
    for t in d["timings"]:  # a profile written before the optimizer step and the overhead were measured
        del t["optimizer_s_per_byte"], t["overhead_s"]
    q = TimeProfile.from_dict(d)
    assert q.host_cores is None and all(t.optimizer_s_per_byte is None and t.overhead_s is None for t in q.timings)
    assert q.layers[1].tensor_parallel_allreduces == (0, 0) and q.layers[0].shared_parameters is None
    assert q.tensor_comm_in_times is False and q.source == ""


def test_queries() -> None:
    p = _profile()
    assert p.num_layers == 3
    assert p.device_types == ("A", "B") and p.reference_device_type == "A"
    assert p.tensor_degrees("A") == (1, 2) and p.tensor_degrees("B") == (1,)
    np.testing.assert_array_equal(p.activation_bytes(), [8.0, 8.0, 4.0])


def test_micro_batch_lookup_exact_interpolated_and_scaled() -> None:
    p = _profile()
    fwd, bwd = p.layer_times("A", 1, 2)
    np.testing.assert_allclose(fwd, [1.0, 2.0, 3.0])
    fwd, bwd = p.layer_times("A", 1, 3)  # halfway between sizes 2 and 4
    np.testing.assert_allclose(fwd, [2.0, 3.0, 4.0])
    np.testing.assert_allclose(bwd, [4.0, 6.0, 8.0])
    # below the range: max(F, t(2) * b / 2), F where the line through sizes 2 and 4 meets 0 samples, in [0, t(2)]:
    # forward lines 1 + (b - 2), 2 + (b - 2), 3 + (b - 2) -> F = (-1 -> 0, 0, 1)
    fwd, _ = p.layer_times("A", 1, 1)
    np.testing.assert_allclose(fwd, [0.5, 1.0, 1.5])
    fwd, _ = p.layer_times("A", 1, 0.5)  # the fixed cost of the last layer shows: max(1, 3 * 0.25)
    np.testing.assert_allclose(fwd, [0.25, 0.5, 1.0])
    fwd, _ = p.layer_times("A", 1, 8)  # above: proportional to the size-4 table
    np.testing.assert_allclose(fwd, [6.0, 8.0, 10.0])
    fwd, _ = p.layer_times("A", 2, 1)  # single table: proportional
    np.testing.assert_allclose(fwd, [0.25, 0.5, 0.75])


def test_roofline_extrapolation_by_hand() -> None:
    """A layer measured at 1, 2 and 4 samples: 3 s, 4 s, 6 s (a fixed 2 s + 1 s per sample, then compute-bound)."""
    layers = (LayerInfo(name="l", activation_bytes_per_sample=0.0, parameter_bytes=0.0),)
    tables = tuple(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=b, forward_s=(t,), backward_s=(2 * t,))
                   for b, t in ((1, 3.0), (2, 4.0), (4, 6.0)))
    p = TimeProfile(model="m", layers=layers, timings=tables)
    assert p.layer_times("A", 1, 3)[0][0] == pytest.approx(5.0)      # between 2 and 4: 4 + (6 - 4) / 2
    assert p.layer_times("A", 1, 8)[0][0] == pytest.approx(12.0)     # above: 6 s * 8 / 4
    assert p.layer_times("A", 1, 0.25)[0][0] == pytest.approx(2.0)   # below: F = 3 - 1 * (4 - 3) = 2 > 3 * 0.25
    assert p.layer_times("A", 1, 0.8)[1][0] == pytest.approx(4.8)    # backward: max(F = 4, 6 * 0.8)
    # the same layer profiled at one size scales proportionally (AMP's assumption, imported profiles)
    one = TimeProfile(model="m", layers=layers, timings=tables[1:2])
    assert one.layer_times("A", 1, 0.5)[0][0] == pytest.approx(1.0) and one.layer_times("A", 1, 6)[0][0] == pytest.approx(12.0)


def test_optimizer_rate_overhead_and_cores() -> None:
    layers = (LayerInfo(name="l", activation_bytes_per_sample=0.0, parameter_bytes=0.0),)

    def table(t: int, b: int, rate: float | None, over: float | None) -> TimingTable:
        return TimingTable(device_type="A", tensor_degree=t, micro_batch_size=b, forward_s=(1.0,), backward_s=(1.0,),
                           optimizer_s_per_byte=rate, overhead_s=over)

    p = TimeProfile(model="m", layers=layers, host_cores=2, timings=(
        table(1, 2, 1e-9, 0.010), table(1, 4, 3e-9, 0.014), table(1, 8, 2e-9, 0.022), table(2, 2, None, None)))
    assert p.optimizer_seconds_per_byte("A", 1) == pytest.approx(2e-9)  # median of the three sizes
    assert p.optimizer_seconds_per_byte("A", 2) == pytest.approx(2e-9)  # degree 2 measured none: degree 1's
    assert p.overhead_seconds("A", 1, 3) == pytest.approx(0.012)        # halfway between 0.010 and 0.014
    assert p.overhead_seconds("A", 1, 16) == pytest.approx(0.044)       # above: 0.022 * 16 / 8
    assert p.overhead_seconds("A", 2, 4) == pytest.approx(0.014)
    q = TimeProfile.from_dict(json.loads(p.to_json()))
    assert q == p and q.host_cores == 2 and q.timings[1].overhead_s == 0.014
    bare = TimeProfile(model="m", layers=layers, timings=(table(1, 2, None, None),))
    assert bare.optimizer_seconds_per_byte("A", 1) is None and bare.overhead_seconds("A", 1, 2) == 0.0


@pytest.mark.parametrize(
    "device, degree, match",
    [("C", 1, "no timings for device type 'C'"), ("B", 2, "no timings at tensor-parallel degree 2")],
)
def test_lookup_errors(device: str, degree: int, match: str) -> None:
    with pytest.raises(ProfileError, match=match) as info:
        _profile().layer_times(device, degree, 2)
    assert info.value.fix


def _mutate(edit: Any) -> dict[str, Any]:
    d = _profile().to_dict()
    edit(d)
    return d


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.update(format="something"), "'format' is 'something'"),
        (lambda d: d.update(version=7), "version 7 is not supported"),
        (lambda d: d.pop("layers"), r"missing key\(s\) \['layers'\]"),
        (lambda d: d.update(colour="red"), r"unknown key\(s\) \['colour'\]"),
        (lambda d: d["layers"][1].update(parameter_bytes=-5), r"layers\[1\] \('block'\) parameter_bytes must be a finite number >= 0, got -5"),
        (lambda d: d["layers"][0].update(activation_bytes_per_sample="big"), "must be a number, got 'big'"),
        (lambda d: d["layers"][0].update(tensor_parallel_allreduces=[2]), r"\[forward, backward\]"),
        (lambda d: d["timings"][0]["forward_s"].pop(), "forward_s has 2 entries but the profile has 3 layers"),
        (lambda d: d["timings"][0]["backward_s"].__setitem__(1, float("nan")), r"backward_s\[1\] must be a finite number"),
        (lambda d: d["timings"].append(dict(d["timings"][0])), "appears twice"),
        (lambda d: d["timings"][0].update(tensor_degree=0), "tensor_degree must be an integer >= 1"),
        (lambda d: d["timings"][0].update(micro_batch_size=1.5), "'micro_batch_size' must be an integer, got 1.5"),
        (lambda d: d["timings"][0].update(device_type=""), "device_type must be a non-empty string"),
        (lambda d: d.update(timings=[]), "'timings' must be a non-empty list"),
        (lambda d: d.update(tensor_comm_in_times="yes"), "must be true or false"),
        (lambda d: d.update(host_cores=0), "'host_cores' must be a positive integer or null, got 0"),
        (lambda d: d["timings"][0].update(overhead_s=-1.0), r"overhead_s must be a finite number >= 0 or null, got -1.0"),
        (lambda d: d["timings"][0].update(optimizer_s_per_byte="fast"), r"'optimizer_s_per_byte' must be a number"),
    ],
)
def test_malformed_profiles_name_the_value(edit: Any, match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        TimeProfile.from_dict(_mutate(edit))


def test_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        TimeProfile.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": ')
    with pytest.raises(ProfileError, match="not valid JSON.*line 1"):
        TimeProfile.load(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ProfileError, match="must be a JSON object"):
        TimeProfile.load(tmp_path / "list.json")


_times = st.lists(st.floats(0, 10, allow_nan=False), min_size=3, max_size=3)


@settings(max_examples=30, deadline=None)
@given(
    acts=st.lists(st.floats(0, 1e9, allow_nan=False), min_size=3, max_size=3),
    fwd=_times,
    bwd=_times,
    mbs=st.integers(1, 64),
    tp=st.integers(1, 8),
    comm=st.booleans(),
)
def test_round_trip_property(acts: list[float], fwd: list[float], bwd: list[float], mbs: int, tp: int, comm: bool) -> None:
    p = TimeProfile(
        model="prop",
        tensor_comm_in_times=comm,
        layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=a, parameter_bytes=a / 2) for i, a in enumerate(acts)),
        timings=(TimingTable(device_type="X", tensor_degree=tp, micro_batch_size=mbs, forward_s=tuple(fwd), backward_s=tuple(bwd)),),
    )
    assert TimeProfile.from_dict(json.loads(p.to_json())) == p


OLD_FILE = """{"format": "hybridplan.time_profile", "version": 1, "model": "gpt-tiny", "source": "hybridplan profile --time",
  "tensor_comm_in_times": true, "host_cores": 2,
  "layers": [
    {"name": "embed", "activation_bytes_per_sample": 131072.0, "parameter_bytes": 1179648.0, "tensor_parallel_allreduces": [0, 0], "shared_parameters": null},
    {"name": "block0", "activation_bytes_per_sample": 131072.0, "parameter_bytes": 3158016.0, "tensor_parallel_allreduces": [2, 2], "shared_parameters": null}],
  "timings": [
    {"device_type": "cpu", "tensor_degree": 1, "micro_batch_size": 32, "forward_s": [0.001, 0.01], "backward_s": [0.002, 0.02], "optimizer_s_per_byte": 1e-9, "overhead_s": 0.004}]}
"""
"""A time profile as the code before per-message latency wrote it (checked once: TimeProfile.to_json of commit
81d292f writes exactly these keys)."""


def test_a_profile_written_before_links_loads_with_no_latency(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(OLD_FILE)
    p = TimeProfile.load(tmp_path / "old.json")
    assert p.links is None and [layer.parameter_tensors for layer in p.layers] == [None, None]
    # written again, it is the file the old code wrote (no new keys appear)
    assert json.loads(p.to_json()) == json.loads(OLD_FILE)


def test_links_and_tensor_counts_round_trip(tmp_path: Path) -> None:
    links = LinkCosts(backend="gloo", allreduce_latency_s=2e-4, allreduce_bandwidth=1e9, p2p_latency_s=1e-3,
                      p2p_bandwidth=None, source="probe")
    p = TimeProfile.from_dict(json.loads(OLD_FILE))
    q = dataclasses.replace(p, links=links, layers=tuple(dataclasses.replace(layer, parameter_tensors=n)
                                                         for layer, n in zip(p.layers, (2, 12))))
    q.save(tmp_path / "t.json")
    back = TimeProfile.load(tmp_path / "t.json")
    assert back == q and back.links == links and [layer.parameter_tensors for layer in back.layers] == [2, 12]


@pytest.mark.parametrize("links, message", [
    ({"backend": "gloo", "allreduce_latency_s": -1.0, "p2p_latency_s": 0.0}, "allreduce_latency_s"),
    ({"backend": "gloo", "allreduce_latency_s": 0.0, "p2p_latency_s": 0.0, "p2p_bandwidth": 0}, "p2p_bandwidth"),
    ({"backend": "gloo", "allreduce_latency_s": 0.0}, "missing key(s) ['p2p_latency_s']"),
    ("fast", "must be an object"),
])
def test_bad_links_are_named(links: Any, message: str) -> None:
    data = json.loads(OLD_FILE) | {"links": links}
    with pytest.raises(ProfileError, match=re.escape(message)):
        TimeProfile.from_dict(data)
