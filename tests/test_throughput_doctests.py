"""The examples in the docstrings of the throughput, timing and 2BW modules run."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", [
    "runtime.layer_timer", "runtime.weight_stash", "models.slice", "profiling.timing", "predict.stash",
    "predict.time_model", "search.feasibility", "search.throughput", "search.pipedream_2bw",
])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"hybridplan.{module}"))
    assert result.attempted > 0 and result.failed == 0
