"""Model names, checked without importing torch, and the rule for models named by data files.

A model is named by a zoo name (``gpt-tiny``), by ``hf:NAME_OR_PATH`` (a HuggingFace configuration:
data, hybridplan/models/hf_config.py) or by ``module:function`` (user code that builds it).
:func:`check_model_name` tells a well-formed name from a typo in milliseconds, so the command line can
reject a bad ``--model`` before it imports torch (seconds). Which model a data file may name is the rule
of models/profiled.py.
"""

from __future__ import annotations

import re

from hybridplan.errors import ModelError
from hybridplan.models.hf_config import check_transformers, is_hf_name, load_hf_config

__all__ = ["ZOO_NAMES", "is_zoo_name", "is_code_name", "is_hf_name", "check_model_name"]

ZOO_NAMES: tuple[str, ...] = (
    "gpt-tiny", "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.6b", "gpt3-6.7b",
    "moe-tiny", "moe-380m", "moe-690m", "moe-1.3b", "moe-2.4b", "moe-7.1b", "moe-10b",
    "wresnet-tiny", "wresnet-250m", "wresnet-500m", "wresnet-1b", "wresnet-2b", "wresnet-4b",
    "vgg11", "vgg11-tiny",
)
"""Every zoo name, in registration order (tests/models/test_names.py checks it equals the registry's)."""

_CODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_zoo_name(name: str) -> bool:
    """Whether ``name`` is a zoo model."""
    return name in ZOO_NAMES


def is_code_name(name: str) -> bool:
    """Whether ``name`` has the form ``module:function`` (a user model: building it runs that code).

    ``hf:...`` is never code (a module named ``hf`` cannot be a user model's)."""
    return not is_hf_name(name) and bool(_CODE_NAME.match(name))


def check_model_name(name: str) -> None:
    """Check that ``name`` is a zoo name, a usable ``hf:`` configuration (read, checked, and transformers
    installed) or a well-formed ``module:function``, without importing torch or the module.

    Raises:
        ModelError: for anything else, with the zoo names closest to it.

    >>> check_model_name("gpt-tiny"); check_model_name("mypkg.models:build")
    """
    if is_hf_name(name):
        load_hf_config(name)
        check_transformers()
        return
    if is_zoo_name(name) or is_code_name(name):
        return
    if ":" in name:
        raise ModelError(f"model {name!r} is not of the form module:function",
                         fix="write e.g. --model mypkg.models:build (a dotted module, a colon, a function name)")
    family = name.split("-")[0]
    close = [n for n in ZOO_NAMES if n.split("-")[0] == family]
    raise ModelError(
        f"unknown model {name!r}",
        fix=(f"did you mean one of {close}? " if close else "")
        + "run 'hybridplan models' for the zoo, give hf:NAME_OR_PATH for a HuggingFace config, or 'module:function'"
        " returning a LayeredModel or nn.Sequential",
    )
