"""The largest numbers hybridplan accepts from a user, and JSON read with its nesting and digits bounded.

A number in a plan, a config.json or on the command line is checked against a bound before any work
starts: a typo such as ``"global_batch_size": 10**30`` would otherwise reach the ranks (a random-number
generator overflowing in C++ frames) or loop for ever (``2**40`` micro-batches). Each bound says why it is
where it is: far beyond any published training run, far below where hybridplan itself breaks.

JSON is read with :func:`load_json`: a document nested deeper than Python's parser recurses (about 1,000
levels; a plan nests 4, a config.json 3) and an integer of thousands of digits (Python refuses to convert more
than 4,300) become a :class:`JSONDataError` or a :class:`HugeInt` naming the value, not a RecursionError or a
ValueError from deep inside the parser. This module imports no torch.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "MAX_GLOBAL_BATCH",
    "GLOBAL_BATCH_WHY",
    "MAX_MICROBATCHES",
    "MICROBATCHES_WHY",
    "MAX_LAYERS",
    "MAX_BYTES",
    "HugeInt",
    "JSONDataError",
    "load_json",
    "count_problem",
    "find_huge",
    "shown",
]

MAX_GLOBAL_BATCH = 2**24
"""Samples per iteration (16,777,216): 256 times the largest published training batch (65,536 images: Ying et
al., "Image classification at supercomputer scale", 2018); ``10**30`` would reach the ranks and overflow there."""

GLOBAL_BATCH_WHY = "256 times the largest published training batch"
"""Why :data:`MAX_GLOBAL_BATCH`, in a message."""

MAX_MICROBATCHES = 2**16
"""Micro-batches per iteration (65,536): the runtime and the schedule replay handle every micro-batch one by one,
so a count of 2**40 never ends; this is 128 times the 512 of the largest schedule benchmarked here
(benchmarks/instant_planning)."""

MICROBATCHES_WHY = "128 times the most benchmarked here, each run one by one"
"""Why :data:`MAX_MICROBATCHES`, in a message."""

MAX_LAYERS = 2**20
"""Layers of a model a plan may name (1,048,576): 64 times the deepest model hybridplan builds (an HF config's
num_hidden_layers is at most 16,384, models/hf_config.py)."""

MAX_BYTES = 2**50
"""A memory size (1 PiB): over 7,000 times the largest device memory of the GPU catalogue (the H200's 141 GB,
plan/gpus.py); a larger one is a typo (``1e300TB``), and ``inf`` cannot be counted in bytes."""

_INT_DIGITS = 19
"""Integers of more digits than the int64 range (9.2e18) are kept as :class:`HugeInt` by :func:`load_json`."""


class HugeInt:
    """An integer of ``digits`` digits found in JSON, too large for any field: kept as its size so that the check of
    the field it sits in can name the field and its bound (Python refuses to convert more than 4,300 digits)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits:,} digits"


class JSONDataError(ValueError):
    """A JSON document that cannot be read: malformed, or nested too deep."""


def _parse_int(text: str) -> int | HugeInt:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= _INT_DIGITS else HugeInt(digits)


def load_json(text: str) -> Any:
    """``json.loads`` with the nesting depth and integer sizes bounded (module docstring).

    Raises:
        JSONDataError: malformed JSON (the parser's message with line and column) or nesting too deep.

    Example:
        >>> load_json('{"a": ' + '9' * 30 + '}')
        {'a': an integer of 30 digits}
    """
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise JSONDataError("it is nested deeper than the JSON reader allows (about 1,000 levels; a plan nests 4,"
                            " a config.json 3)") from None
    except json.JSONDecodeError as e:
        raise JSONDataError(f"{e.msg} at line {e.lineno} column {e.colno}") from None


def count_problem(value: Any, high: int, *, why: str | None = None) -> str | None:
    """What is wrong with ``value`` as a positive integer count of at most ``high`` (``why``: the bound's reason),
    as the end of a sentence naming the field ("is 0, not a positive integer"); None if nothing is.

    Example:
        >>> count_problem(0, 10), count_problem(11, 10, why="the ten fingers"), count_problem(3, 10)
        ('is 0, not a positive integer', 'is 11, more than 10 (the ten fingers)', None)
    """
    bound = f"more than {high:,}" + (f" ({why})" if why else "")
    if isinstance(value, HugeInt):
        return f"is {value!r}, {bound}"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is {shown(value)}, not a positive integer"
    if value < 1:
        return f"is {value}, not a positive integer"
    if value > high:
        return f"is {value:,}, {bound}"
    return None


def find_huge(data: Any, where: str = "") -> tuple[str, HugeInt] | None:
    """The first :class:`HugeInt` inside ``data`` (dicts and lists, as :func:`load_json` returns them) and where it is
    (``stages[0].degree``); None if there is none.

    Example:
        >>> find_huge(load_json('{"stages": [{"degree": ' + '9' * 40 + '}]}'))
        ('stages[0].degree', an integer of 40 digits)
    """
    if isinstance(data, HugeInt):
        return where or "the value", data
    items = (data.items() if isinstance(data, dict) else
             ((f"[{i}]", v) for i, v in enumerate(data)) if isinstance(data, list) else ())
    for key, value in items:
        inner = f"{where}{key}" if str(key).startswith("[") else f"{where}.{key}" if where else str(key)
        found = find_huge(value, inner)
        if found is not None:
            return found
    return None


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message about a value that may be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]} ...{text[-1] if text[-1] in ')]}' else ''}"
