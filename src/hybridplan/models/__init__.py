"""Layered models: the protocol, tensor-parallel rules, and the zoo.

The names are imported on first use (PEP 562): :mod:`hybridplan.models.names` checks model names
without torch, and importing it must not import torch through this package.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "LayeredModel",
    "TensorParallelGroup",
    "TensorParallelPlan",
    "build_layers",
    "get_model",
    "layer_seed",
    "model_names",
]

_HOME = {
    "LayeredModel": "base",
    "build_layers": "base",
    "layer_seed": "base",
    "TensorParallelGroup": "tensor_parallel",
    "TensorParallelPlan": "tensor_parallel",
    "get_model": "zoo",
    "model_names": "zoo",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'hybridplan.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hybridplan.models.{_HOME[name]}"), name)
