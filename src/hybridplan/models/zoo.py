"""The model registry: zoo names and user models (``module:function``).

``get_model("gpt-tiny")`` returns a zoo model; ``get_model("hf:llama3-8b")`` a HuggingFace model built
from its configuration (models/hf.py); ``get_model("mypkg.models:build")`` imports
``mypkg.models`` and calls ``build()``, which must return a :class:`LayeredModel` or an
``nn.Sequential`` (wrapped by :func:`hybridplan.models.user.from_sequential`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial

from hybridplan.errors import ModelError
from hybridplan.models.base import LayeredModel
from hybridplan.models.gpt import GPT, GPT_CONFIGS
from hybridplan.models.hf_config import is_hf_name
from hybridplan.models.names import check_model_name

__all__ = ["get_model", "model_names", "register", "resolve_model"]

_FACTORIES: dict[str, Callable[[], LayeredModel]] = {}


def register(name: str, factory: Callable[[], LayeredModel]) -> None:
    """Add a zoo entry (used by the zoo modules at import)."""
    _FACTORIES[name] = factory


for _name, _cfg in GPT_CONFIGS.items():
    register(_name, partial(GPT, _name, _cfg))


def _load_zoo() -> None:
    # Further families register themselves on import; a missing family must not break the others.
    for module in ("moe", "wresnet", "vgg"):
        try:
            importlib.import_module(f"hybridplan.models.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"hybridplan.models.{module}":
                raise


def model_names() -> list[str]:
    """All zoo names, in registration order."""
    _load_zoo()
    return list(_FACTORIES)


def get_model(name: str) -> LayeredModel:
    """A zoo model by name, or a user model from ``module:function``.

    Raises:
        ModelError: for an unknown name, an import failure, or a function returning something else.
    """
    if is_hf_name(name):
        from hybridplan.models.hf import hf_model

        return hf_model(name)
    _load_zoo()
    if name in _FACTORIES:
        return _FACTORIES[name]()
    check_model_name(name)  # names the closest zoo models if it is neither a zoo name nor module:function
    if ":" in name:
        return _user_model(name)
    raise ModelError(f"unknown model {name!r}", fix="run 'hybridplan models' for the zoo")  # a zoo name not registered


def resolve_model(model: str | LayeredModel) -> LayeredModel:
    """A model object from a zoo name, ``module:function``, or an object (returned as it is).

    A run configuration names its model either way (runtime/config.py ``RunConfig.model``): a name
    travels to other processes and into files, an object serves tests and library users.

    Raises:
        ModelError: as :func:`get_model`, for a name.
    """
    return get_model(model) if isinstance(model, str) else model


def _user_model(spec: str) -> LayeredModel:
    from torch import nn

    from hybridplan.models.user import from_sequential

    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelError(
            f"cannot import module {module_name!r} for model {spec!r}: {e}",
            fix="make the module importable (installed, or on PYTHONPATH)",
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ModelError(f"module {module_name!r} has no callable {func_name!r}", fix="give 'module:function'")
    made = func()
    if isinstance(made, LayeredModel):
        return made
    if isinstance(made, nn.Sequential):
        return from_sequential(made, name=spec)
    raise ModelError(
        f"{spec} returned {type(made).__name__}, not a LayeredModel or nn.Sequential",
        fix="return a hybridplan.models.LayeredModel, or an nn.Sequential",
    )
