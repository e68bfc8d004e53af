"""Storage resizes made outside any op, counted, so the memory tracker re-measures only after one happened.

[Note: resizes outside ops] FSDP2 frees a layer's gathered parameters with ``untyped_storage().resize_(0)`` and
allocates them again with ``resize_(n)``, outside any dispatched op, through two functions of
``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` (``alloc_storage``, ``free_storage``; the only
``resize_`` calls of FSDP2 in torch 2.13, also imported by name into ``_fsdp_param_group.py``). The tracker
(runtime/memory.py) therefore re-measured every storage written through an ``out=`` argument before every op: on a
ZeRO-3 stage of gpt-tiny's ten layers that was 18% of a simulation (py-spy), every layer's gathered parameters
looked at before every op. :func:`watch_resizes` wraps those two functions where they are called so that each call
bumps a counter (:func:`resizes`); the tracker re-measures only when it moved since it last did, which finds every
size it found before, at the same ops: between two ops without such a call no storage changed its size.
Where the functions are not found (another torch), nothing is wrapped, :func:`watching` stays False and the tracker
re-measures before every op as before. Once watching, a storage resized by other code (the runtime resizes none
itself; a user's layer could) is re-measured only at the tracker's next window (``reset_peak``, ``start_window``) or
after FSDP2's next resize. tests/runtime/test_resize_watch.py checks that the two ways count the same
bytes, and that FSDP2's sources resize nowhere else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["watch_resizes", "watching", "resizes", "RESIZING_FUNCTIONS"]

RESIZING_FUNCTIONS = ("alloc_storage", "free_storage")
"""FSDP2's functions that resize a storage outside any op."""

_count = [0]
_watching = [False]


def resizes() -> int:
    """How many calls of the watched functions were made in this process (it only grows)."""
    return _count[0]


def watching() -> bool:
    """Whether every resize outside an op goes through a watched function (:func:`watch_resizes` succeeded)."""
    return _watching[0]


def _counted(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(fn)
    def wrapper(tensor: Any) -> None:
        fn(tensor)
        _count[0] += 1

    wrapper.__hybridplan_counted__ = True  # type: ignore[attr-defined]
    return wrapper


def watch_resizes() -> bool:
    """Wrap FSDP2's resizing functions in the modules that call them (once per process); True where done."""
    if _watching[0]:
        return True
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        return False
    if not all(callable(getattr(_fsdp_param, name, None)) for name in RESIZING_FUNCTIONS):
        return False
    for module in (_fsdp_param, _fsdp_param_group):
        for name in RESIZING_FUNCTIONS:
            fn = getattr(module, name, None)
            if callable(fn) and not getattr(fn, "__hybridplan_counted__", False):
                setattr(module, name, _counted(fn))
    _watching[0] = True
    return True
