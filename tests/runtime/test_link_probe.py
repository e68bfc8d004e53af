"""The link probe on real processes: two gloo ranks started as a run starts them (runtime/link_probe.py)."""

from __future__ import annotations

import math

import pytest

from hybridplan.runtime.link_probe import LARGE_BYTES, SMALL_BYTES, probe_links


@pytest.mark.distributed
def test_probe_measures_gloo_between_two_processes() -> None:
    r = probe_links("cpu")
    assert r["backend"] == "gloo" and r["processes"] == 2 and (r["small_bytes"], r["large_bytes"]) == (SMALL_BYTES, LARGE_BYTES)
    for key in ("allreduce_small_s", "allreduce_large_s", "roundtrip_small_s", "roundtrip_large_s"):
        assert 0 < r[key] < 10 and math.isfinite(r[key]), (key, r[key])
