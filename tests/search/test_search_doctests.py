"""The examples in the search modules' docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["space", "objective", "fewest"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"hybridplan.search.{module}"))
    assert result.attempted > 0 and result.failed == 0
