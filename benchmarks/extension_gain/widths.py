"""A zoo model at another width, as a user model: what the largest-model search grows.

The width is a GPT's or a GShard MoE's hidden size, a Wide-ResNet's stem channels (``num_channels``, as
benchmarks/largest_model grows it); everything else (layers, heads, experts, sequence, batch) stays. The
names are made on demand (PEP 562 module ``__getattr__``), so that every width works as ``--model``, e.g. from
the repository root::

    PYTHONPATH=. .venv/bin/hybridplan profile --model benchmarks.extension_gain.widths:gpt3_2p6b_w3072 ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hybridplan.models.base import LayeredModel
from hybridplan.models.gpt import GPT, GPT_CONFIGS
from hybridplan.models.moe import MOE_CONFIGS, MoE
from hybridplan.models.wresnet import WRESNET_CONFIGS, WResNet

_FAMILIES: list[tuple[dict, Callable[..., LayeredModel], str]] = [(GPT_CONFIGS, GPT, "hidden_size"), (MOE_CONFIGS, MoE, "hidden_size"), (WRESNET_CONFIGS, WResNet, "num_channels")]


def _mangled(model: str) -> str:
    """A zoo name as part of a Python name: ``gpt3-2.6b`` -> ``gpt3_2p6b``."""
    return model.replace("-", "_").replace(".", "p")


def _family(model: str) -> tuple[object, Callable[..., LayeredModel], str]:
    for configs, cls, field in _FAMILIES:
        if model in configs:
            return configs[model], cls, field
    raise SystemExit(f"{model}: no width to grow (GPT, MoE and Wide-ResNet zoo models have one)")


def width_of(model: str) -> tuple[int, int]:
    """The zoo model's width and the step widths move in: a GPT's or MoE's hidden size in multiples of its heads
    (attention splits the hidden size among them), a Wide-ResNet's channels in multiples of its GroupNorm
    groups (which must divide every channel count)."""
    cfg, _, field = _family(model)
    step = getattr(cfg, "norm_groups") if field == "num_channels" else getattr(cfg, "num_heads")
    return int(getattr(cfg, field)), int(step)


def same_but_width(a: str, b: str) -> bool:
    """Whether zoo models ``a`` and ``b`` differ in their width only, so that at any width they are the same model
    (GPT-3 2.6B and 6.7B: 32 blocks of 32 heads, the same sequence and vocabulary; hidden 2,560 and 4,096)."""
    try:
        (cfg_a, cls_a, field), (cfg_b, cls_b, _) = _family(a), _family(b)
    except SystemExit:
        return False
    return cls_a is cls_b and replace(cfg_a, **{field: 0}) == replace(cfg_b, **{field: 0})  # type: ignore[type-var]


def at_width(model: str, width: int) -> str:
    """The model's name at ``width``: the zoo name itself at its own width, else a user model of this module."""
    own, step = width_of(model)
    if width % step:
        raise SystemExit(f"{model}: width {width} is not a multiple of {step}")
    return model if width == own else f"{__name__}:{_mangled(model)}_w{width}"


def __getattr__(name: str) -> Callable[[], LayeredModel]:
    base, sep, width = name.rpartition("_w")
    model = next((m for configs, _, _ in _FAMILIES for m in configs if _mangled(m) == base), None)
    if not sep or not width.isdigit() or model is None:
        raise AttributeError(name)
    cfg, cls, field = _family(model)
    return lambda: cls(f"{__name__}:{name}", replace(cfg, **{field: int(width)}))  # type: ignore[type-var]
