"""Hockney's alpha and beta from the probe's seconds (profiling/links.py), worked out by hand."""

from __future__ import annotations

import pytest

from hybridplan.errors import ProfileError
from hybridplan.profiling.links import LinkCosts, link_costs


def _probe(**seconds: float) -> dict:
    return {"backend": "gloo", "processes": 2, "small_bytes": 4, "large_bytes": 4_000_000,
            "allreduce_small_s": 6e-4, "allreduce_large_s": 4.6e-3, "roundtrip_small_s": 2e-3,
            "roundtrip_large_s": 6e-3} | seconds


def test_alpha_and_beta_by_hand() -> None:
    c = link_costs(_probe())
    # all-reduce over 2: 2 ring steps of alpha -> 0.3 ms each; 4 MB take 4.6 - 0.6 = 4 ms more -> 1 GB/s
    assert c.allreduce_latency_s == pytest.approx(3e-4) and c.allreduce_bandwidth == pytest.approx(1e9)
    # ping-pong: 2 messages -> 1 ms each; 4 MB add (6 - 2) / 2 = 2 ms per message -> 2 GB/s
    assert c.p2p_latency_s == pytest.approx(1e-3) and c.p2p_bandwidth == pytest.approx(2e9)
    assert LinkCosts.from_dict(c.to_dict()) == c


def test_a_large_message_no_slower_than_a_small_one_leaves_beta_unmeasured() -> None:
    c = link_costs(_probe(allreduce_large_s=5e-4))  # a disturbed host
    assert c.allreduce_bandwidth is None and c.allreduce_latency_s == pytest.approx(3e-4)
    assert c.latency("p2p") == pytest.approx(1e-3) and c.bandwidth("allreduce") is None


def test_the_probe_must_have_two_processes() -> None:
    with pytest.raises(ProfileError, match="2 processes"):
        link_costs(_probe() | {"processes": 4})
