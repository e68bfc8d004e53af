"""What the package claims about its dependencies is what CI tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared_torch_minimum() -> tuple[int, int]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in deps if re.match(r"torch\b", d)]
    match = re.fullmatch(r"torch>=(\d+)\.(\d+)(\.\d+)?", torch)
    assert match, torch
    return int(match.group(1)), int(match.group(2))


def test_the_declared_torch_minimum_is_the_tested_version():
    """pyproject's lowest torch is the one constraints.txt pins for CI: exact memory counts differ between torch
    versions (a stage without parameters keeps a 1-byte storage under 2.11), so an untested older torch must not
    be claimed."""
    pins = re.findall(r"^torch==(\d+)\.(\d+)\.\d+$", (ROOT / "constraints.txt").read_text(), re.M)
    assert [(int(a), int(b)) for a, b in pins] == [_declared_torch_minimum()]


def test_the_installed_torch_is_at_least_the_declared_minimum():
    import torch

    installed = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert installed >= _declared_torch_minimum(), torch.__version__
