"""Layered models: the protocol, tensor-parallel rules, and the zoo."""

from hybridplan.models.base import LayeredModel, build_layers, layer_seed
from hybridplan.models.tensor_parallel import TensorParallelGroup, TensorParallelPlan
from hybridplan.models.zoo import get_model, model_names

__all__ = [
    "LayeredModel",
    "TensorParallelGroup",
    "TensorParallelPlan",
    "build_layers",
    "get_model",
    "layer_seed",
    "model_names",
]
