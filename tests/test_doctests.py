"""Every example in the package's docstrings runs (``>>>`` lines), in every module."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import hybridplan

MODULES = sorted(m.name for m in pkgutil.walk_packages(hybridplan.__path__, "hybridplan.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_examples_are_found():
    """Modules known to hold examples are seen (the walk would otherwise pass vacuously)."""
    found = {m for m in MODULES if doctest.DocTestFinder().find(importlib.import_module(m))
             and any(t.examples for t in doctest.DocTestFinder().find(importlib.import_module(m)))}
    for module in ("hybridplan.search.memory.space", "hybridplan.search.time.throughput", "hybridplan.plan.schedule",
                   "hybridplan.predict.time_model", "hybridplan.units", "hybridplan.search.progress"):
        assert module in found
