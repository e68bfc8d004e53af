"""Shared test setup: ``tests/`` on ``sys.path`` (so test files, and the processes they spawn, can
``import gloo``), and the ``gloo_pool`` fixture for multi-process tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from gloo import GlooPool  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def gloo_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], GlooPool]]:
    """``gloo_pool(world)``: a pool of ``world`` gloo processes shared by the session's tests.

    Spawning and importing torch costs seconds per process on this 2-core machine; a job milliseconds.
    """
    pools: dict[int, GlooPool] = {}

    def get(world: int) -> GlooPool:
        if world not in pools:
            pools[world] = GlooPool(world, tmp_path_factory.mktemp(f"gloo{world}"))
        return pools[world]

    yield get
    for pool in pools.values():
        pool.close()
