"""HuggingFace model configurations, read and checked without torch: ``--model hf:NAME_OR_PATH``.

``hf:`` names a transformers decoder-only LM by its ``config.json``: one shipped here (:data:`HF_CONFIGS`,
``hf:llama3-8b``), a ``config.json`` file, or a directory holding one. Only the configuration is read:
weights are never needed (layers are built from it and seeded like the zoo's) and nothing is downloaded
(no hub access exists). [Note: a file is data] holds for it: a ``config.json`` is JSON, and the model
is built from transformers' own classes for the architectures of :data:`SUPPORTED` — never
``trust_remote_code`` nor an ``auto_map`` entry — so a profile database naming ``hf:...`` may be
followed without running code it names.

:func:`load_hf_config` answers in milliseconds, so the command line rejects an unknown name, a path
without a ``config.json``, a malformed file, an unsupported architecture, or a missing transformers
before any long work (and before importing torch). Building is hybridplan/models/hf.py.

The training sequence length is the config's ``max_position_embeddings`` at most :data:`DEFAULT_MAX_SEQ_LEN`;
a name ending with ``,seq=N`` (``hf:llama3-8b,seq=8192``) trains on ``N`` tokens instead, up to the config's
positions. The length is part of the name, so every run, profile and cache entry made for it says so, and it is
kept in the configuration as :data:`SEQ_LEN_KEY` (its identity in caches and profiles).

The shipped configurations are the public ``config.json`` values of the model cards named beside each
(the fields that size the model; dropout and token ids do not). ``*-tiny`` ones are small versions of
the same architectures for tests and demos.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hybridplan.errors import ModelError
from hybridplan.limits import JSONDataError, count_problem, find_huge, load_json, shown

__all__ = [
    "HF_PREFIX",
    "HF_CONFIGS",
    "SUPPORTED",
    "DEFAULT_MAX_SEQ_LEN",
    "is_hf_name",
    "load_hf_config",
    "hf_seq_len",
    "SEQ_LEN_KEY",
    "check_transformers",
]

HF_PREFIX = "hf:"
"""Model names starting with this are HuggingFace configurations."""

SUPPORTED: tuple[str, ...] = ("llama", "mistral", "qwen2", "mixtral", "gpt2")
"""``model_type`` values hybridplan builds (transformers' own classes for each)."""

SEQ_SUFFIX = ",seq="
"""A model name ending with this and a number of tokens trains on that sequence length."""

SEQ_LEN_KEY = "hybridplan_seq_len"
"""The configuration key holding a length given by :data:`SEQ_SUFFIX` (not a transformers key: removed before
transformers reads the configuration)."""

DEFAULT_MAX_SEQ_LEN = 2048
"""Training sequence length: the config's ``max_position_embeddings`` (``n_positions``), at most this.
2048 is the GPT-3 training context (Brown et al., 2020, section 2.3), the zoo's longest being 1024;
a config.json with a smaller ``max_position_embeddings`` sets a shorter one (the tiny configs: 16)."""

_LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B config.json
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "initializer_range": 0.02,
}
_LLAMA3_70B = {  # meta-llama/Meta-Llama-3-70B config.json
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "initializer_range": 0.02,
}
_LLAMA2_7B = {  # meta-llama/Llama-2-7b-hf config.json
    "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
    "tie_word_embeddings": False, "initializer_range": 0.02,
}
_MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1 config.json
    "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4096, "hidden_act": "silu",
    "tie_word_embeddings": False, "initializer_range": 0.02,
}
_QWEN2_7B = {  # Qwen/Qwen2-7B config.json
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": 131072,
    "max_window_layers": 28, "hidden_act": "silu", "tie_word_embeddings": False, "initializer_range": 0.02,
}
_GPT2 = {  # openai-community/gpt2 config.json (124M)
    "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
    "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "initializer_range": 0.02,
    "tie_word_embeddings": True,
}
_MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json
    "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
    "sliding_window": None, "router_aux_loss_coef": 0.02, "hidden_act": "silu", "tie_word_embeddings": False,
    "initializer_range": 0.02,
}


def _tiny(base: dict[str, Any], **sizes: Any) -> dict[str, Any]:
    return {**base, **sizes}


_TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16}

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-tiny": _tiny(_LLAMA3_8B, **_TINY),
    # a sliding window shorter than the sequence, so that its mask matters
    "mistral-tiny": _tiny(_MISTRAL_7B, **_TINY, sliding_window=8),
    # Qwen2 has biases on q, k and v
    "qwen2-tiny": _tiny(_QWEN2_7B, **_TINY, sliding_window=16),
    "gpt2-tiny": _tiny(_GPT2, vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=16, tie_word_embeddings=False,
                       bos_token_id=0, eos_token_id=0),
    "mixtral-tiny": _tiny(_MIXTRAL_8X7B, **{**_TINY, "intermediate_size": 48}, num_local_experts=4),
    "llama3-8b": _LLAMA3_8B,
    "llama3-70b": _LLAMA3_70B,
    "llama2-7b": _LLAMA2_7B,
    "mistral-7b": _MISTRAL_7B,
    "qwen2-7b": _QWEN2_7B,
    "gpt2": _GPT2,
    "mixtral-8x7b": _MIXTRAL_8X7B,
}
"""Shipped configurations, ``hf:<key>``."""


def is_hf_name(name: str) -> bool:
    """Whether ``name`` is a HuggingFace model name (``hf:...``); it may still fail :func:`load_hf_config`."""
    return name.startswith(HF_PREFIX)


def _shipped_hint() -> str:
    return ", ".join(f"hf:{k}" for k in HF_CONFIGS)


def load_hf_config(name: str) -> dict[str, Any]:
    """The configuration dict that ``name`` (``hf:NAME_OR_PATH``) stands for, checked.

    A shipped name wins over a path of the same spelling. A path is a ``config.json`` file or a
    directory holding one.

    Raises:
        ModelError: an unknown shipped name with no such path, a directory without ``config.json``, a file
            that is not a JSON object, a missing ``model_type``, an unsupported architecture, or sizes
            that are missing or not positive integers.
    """
    base, seq = _split_seq_len(name)
    config = _load(name, base[len(HF_PREFIX):] if is_hf_name(base) else base)
    if seq is not None:
        positions = int(config["n_positions"] if config["model_type"] == "gpt2" else config["max_position_embeddings"])
        if seq > positions:
            raise ModelError(f"model {name!r}: a sequence of {seq:,} tokens is longer than the model's {positions:,}"
                             " positions", fix=f"give {SEQ_SUFFIX}N with N at most {positions:,}")
        config[SEQ_LEN_KEY] = seq
    return config


def _split_seq_len(name: str) -> tuple[str, int | None]:
    """``name`` without a :data:`SEQ_SUFFIX` ending, and the length it gives (None without one)."""
    base, suffix, tail = name.rpartition(SEQ_SUFFIX)
    if not suffix:
        return name, None
    problem = (count_problem(int(tail), _BOUNDS["positions"][0], why=_BOUNDS["positions"][1])
               if tail.isdigit() and len(tail) < 20 else f"is {tail[:20]!r}, not a whole number of tokens")
    if problem is not None:
        raise ModelError(f"model {name!r}: the sequence length {problem}",
                         fix=f"end the name with {SEQ_SUFFIX}N, N tokens (e.g. hf:llama3-8b{SEQ_SUFFIX}8192)")
    return base, int(tail)


def _load(name: str, spec: str) -> dict[str, Any]:
    """The checked configuration of ``spec`` (a shipped name or a path); ``name`` is what the user wrote."""
    if spec in HF_CONFIGS:
        return dict(HF_CONFIGS[spec])
    path = Path(spec)
    if not spec or not path.exists():
        raise ModelError(
            f"model {name!r}: {spec!r} is neither a shipped HuggingFace config nor an existing path",
            fix=f"use one of {_shipped_hint()}, or hf:DIR / hf:FILE.json with a transformers config.json",
        )
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelError(f"model {name!r}: directory {str(path)!r} has no config.json",
                         fix="give a directory holding a transformers config.json, or the file itself")
    try:
        config = load_json(file.read_text())
    except (OSError, UnicodeDecodeError, JSONDataError) as e:
        raise ModelError(f"model {name!r}: {str(file)!r} is not readable JSON: {e}",
                         fix="give a transformers config.json (a JSON object)") from None
    if not isinstance(config, dict):
        raise ModelError(f"model {name!r}: {str(file)!r} holds a JSON {type(config).__name__}, not an object",
                         fix="give a transformers config.json (a JSON object)")
    _check_config(name, config)
    return config


# (bound, why): the largest value of each size accepted, far above every published model and far below sizes
# whose layers could not even be described (a typo such as 10**12 would otherwise reach torch).
_BOUNDS: dict[str, tuple[int, str]] = {
    "layers": (2**14, "128 times the deepest published decoder LM (128 layers: Megatron-LM's 1T-parameter model,"
               " Narayanan et al., SC 2021)"),
    "hidden": (2**21, "over 80 times the widest published (hidden 25,600: the same model)"),
    "heads": (2**21, "as many heads as channels of the widest hidden size accepted"),
    "intermediate": (2**23, "over 80 times the widest published MLP (102,400: the same model)"),
    "vocab": (2**25, "128 times the largest published vocabulary (262,144: Gemma 3)"),
    "positions": (2**30, "about 100 times the longest published context (10,485,760 tokens: Llama 4 Scout)"),
    "experts": (2**17, "64 times the most experts of a published model (2,048: Switch-C, Fedus et al., JMLR 2022)"),
}

# config.json keys of the sizes every config must give: GPT-2 names them its own way
_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {"vocab": "vocab_size", "hidden": "n_embd", "layers": "n_layer", "heads": "n_head", "positions": "n_positions"},
    "other": {"vocab": "vocab_size", "hidden": "hidden_size", "intermediate": "intermediate_size",
              "layers": "num_hidden_layers", "heads": "num_attention_heads", "positions": "max_position_embeddings"},
}


def _check_config(name: str, config: dict[str, Any]) -> None:
    """Every size the model is built from: present, a positive integer, within :data:`_BOUNDS`, and consistent (heads
    dividing the hidden size, key/value heads dividing the heads, Mixtral's experts), before transformers sees it."""
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ModelError(
            f"model {name!r}: architecture {shown(kind)} (model_type) is not supported",
            fix=f"hybridplan builds model_type {list(SUPPORTED)} (decoder-only LMs); give a config.json of one of them",
        )
    keys = _KEYS["gpt2" if kind == "gpt2" else "other"]
    sizes = {size: _size(name, config, key, _BOUNDS[size]) for size, key in keys.items()}
    huge = find_huge(config)
    if huge is not None:
        raise ModelError(f"model {name!r}: {huge[0]} is {huge[1]!r}; no field of a config.json needs more than 19"
                         " digits", fix="give the value of the model card's config.json")
    hidden, heads = sizes["hidden"], sizes["heads"]
    if hidden % heads:
        raise ModelError(f"model {name!r}: {keys['hidden']} {hidden} is not divisible by {keys['heads']} {heads}",
                         fix=f"give {keys['hidden']} a multiple of {keys['heads']} (each head takes hidden / heads"
                         " channels)")
    if kind != "gpt2":
        kv = config.get("num_key_value_heads")
        if kv is not None:
            kv = _size(name, config, "num_key_value_heads", (heads, "the attention heads"))
            if heads % kv:
                raise ModelError(f"model {name!r}: num_attention_heads {heads} is not a multiple of num_key_value_heads"
                                 f" {kv}", fix="give num_key_value_heads dividing num_attention_heads")
        given = config.get("head_dim") is not None
        head_dim = _size(name, config, "head_dim", _BOUNDS["hidden"]) if given else hidden // heads
        if head_dim % 2:
            raise ModelError(f"model {name!r}: each head has {head_dim} channels ("
                             + ("head_dim" if given else f"hidden_size {hidden} / num_attention_heads {heads}")
                             + "), an odd number, and rotary embeddings rotate channel pairs",
                             fix="give the heads an even number of channels")
    window = config.get("sliding_window")
    if window is not None:
        _size(name, config, "sliding_window", _BOUNDS["positions"])
    if kind == "mixtral":
        experts = _size(name, config, "num_local_experts", _BOUNDS["experts"])
        _size(name, config, "num_experts_per_tok", (experts, f"the {experts} experts of num_local_experts"))


def _size(name: str, config: dict[str, Any], key: str, bound: tuple[int, str]) -> int:
    """``config[key]`` as a positive integer at most ``bound[0]`` (``bound[1]`` says why), or a ModelError."""
    high, why = bound
    value = config.get(key)
    problem = "is missing" if value is None else count_problem(value, high, why=why)
    if problem is None and value is not None:
        return int(value)
    raise ModelError(f"model {name!r}: {key} {problem}",
                     fix=f"give {key} in the config.json as a positive integer of at most {high:,}, as in the model"
                     " card's")


def hf_seq_len(config: dict[str, Any]) -> int:
    """The training sequence length of a configuration (see :data:`DEFAULT_MAX_SEQ_LEN` and :data:`SEQ_SUFFIX`)."""
    if isinstance(config.get(SEQ_LEN_KEY), int):
        return int(config[SEQ_LEN_KEY])
    limit = config.get("n_positions") if config.get("model_type") == "gpt2" else config.get("max_position_embeddings")
    if not isinstance(limit, int) or limit < 1:
        return DEFAULT_MAX_SEQ_LEN
    return min(limit, DEFAULT_MAX_SEQ_LEN)


def check_transformers() -> None:
    """Check that transformers is installed, without importing it.

    Raises:
        ModelError: if it is not, saying how to install it under the torch pin.
    """
    if importlib.util.find_spec("transformers") is None:
        raise ModelError(
            "hf: models need the transformers package, which is not installed",
            fix="install it with the torch pin kept: pip install -c constraints.txt 'hybridplan[hf]'"
            " (or: pip install -c constraints.txt transformers)",
        )
