"""A profile database as its readers see it: opened once, read only, each part read when first asked for.

:class:`~hybridplan.profiling.store.ProfileStore` is the file (tables, transactions) that campaigns write.
:class:`ProfileDB` is what a command reads from it: the campaign's settings, the memory statistics, the
weight-stash sizes and the layer times, from ONE read-only connection (opening a profile never changes it).

Example::

    with ProfileDB("profile.sqlite") as db:
        predictor = MemoryPredictor.from_profile(db, num_microbatches=8)
        times = db.time_profile()
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from hybridplan.errors import ProfileError
from hybridplan.profiling.statistics import SpanStatistics, load_statistics
from hybridplan.profiling.store import ProfileStore
from hybridplan.profiling.stored_time_profile import time_profile_from_store
from hybridplan.profiling.time_profile import TimeProfile

__all__ = ["ProfileDB"]


class ProfileDB:
    """A profile database, read only (module docstring).

    Raises:
        ProfileError: if the file is missing or is not a hybridplan profile database.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._store = ProfileStore(self.path, create=False)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> ProfileDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ settings
    @cached_property
    def meta(self) -> dict[str, Any]:
        """Every setting the campaigns recorded (``meta`` table)."""
        return self._store.meta()

    @property
    def identity(self) -> dict[str, Any]:
        """The memory campaign's identity (model, its fingerprint, cluster, batch, run options); {} if none."""
        return dict(self.meta.get("identity") or {})

    @property
    def model(self) -> str | None:
        """The model's name as recorded (a label: see models/profiled.py before building it)."""
        name = self.meta.get("model") or self.meta.get("time_identity", {}).get("model")
        return None if name is None else str(name)

    @property
    def merge_groups(self) -> list[int] | None:
        """Boundaries of merged layers (``profile --merge-layers``), or None."""
        groups = self.meta.get("merge_groups")
        return None if groups is None else [int(b) for b in groups]

    @property
    def run_options(self) -> dict[str, Any]:
        """The training options of the memory campaign's runs (precision, recompute, backend, ...)."""
        return dict(self.identity.get("run_options") or {})

    @property
    def has_memory(self) -> bool:
        """Whether the file holds a memory campaign (per-layer statistics)."""
        return "num_layers" in self.meta and "batch_sizes" in self.meta

    @property
    def has_layer_times(self) -> bool:
        """Whether the file holds layer times (``profile --time``)."""
        return self.meta.get("time_layers") is not None

    # ------------------------------------------------------------------ measurements
    @cached_property
    def statistics(self) -> dict[tuple[str, int], list[SpanStatistics]]:
        """Every scenario's statistics at every profiled batch size."""
        return load_statistics(self._store)

    @cached_property
    def weight_stash(self) -> dict[tuple[str, int], dict[int, int]]:
        """Per-layer PipeDream-2BW weight-stash bytes per scenario."""
        return self._store.weight_stash()

    @cached_property
    def reserved_peaks(self) -> list[tuple[str, int, int, int, int, int, int, int]]:
        """CUDA: per measured device, the tensor peak and the caching allocator's reserved peak of the same iterations
        (``(kind, degree, batch_size, microbatch_size, start, stop, tensor, reserved)``; empty for CPU and older profiles)."""
        return self._store.reserved_peaks()

    def time_profile(self, *, warn: Callable[[str], None] | None = None) -> TimeProfile:
        """The layer times as a :class:`TimeProfile` (``warn`` hears of incomplete tables left out).

        Raises:
            ProfileError: if the file holds no complete layer-time table.
        """
        return time_profile_from_store(self._store, warn=warn)

    def require_memory(self) -> None:
        """Raise :class:`ProfileError` unless the file holds a memory campaign."""
        if not self.has_memory:
            raise ProfileError(f"{str(self.path)!r} holds no finished profiling campaign",
                               fix="run 'hybridplan profile' first")
