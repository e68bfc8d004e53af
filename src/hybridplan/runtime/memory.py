"""Per-device peak memory: an exact tensor-storage tracker on CPU, the CUDA allocator's counters on GPU.

[Note: what "memory" means on CPU] PyTorch keeps no allocator statistics for CPU tensors, and the
process RSS is neither tensor memory nor deterministic (../shared/notes/pytorch-cpu-facts.md). The
:class:`StorageTracker` counts the bytes of every live tensor storage this process allocates: each
storage once however many views share it, freed when its last reference dies (a weakref callback on
the storage). Tensor subclasses are flattened, so a DTensor counts its local shard, not the wrapper.
It sees every allocation made through the dispatcher (forward, autograd backward, optimizer, p2p
receive buffers, collectives' outputs), which is what ``torch.cuda.max_memory_allocated`` counts on
a GPU minus the allocator's block rounding. Frees of garbage in reference cycles would depend on
when the cyclic collector runs, so the runtime disables it during a measured iteration.

Two rules keep the count deterministic across runs:

- a buffer handed to an asynchronous send stops counting when the runtime drops it (``forget``), not
  when the transport finishes with it (that moment depends on thread timing);
- the peak covers the window between ``reset_peak`` calls; the runtime resets it at the start of
  each iteration.

- a storage written through an op's ``out=`` argument is re-measured before every later op that follows a resize:
  its owner may resize it outside any op, as FSDP2 (ZeRO-2/3 stages, runtime/sharding.py) frees a layer's
  gathered parameters with ``untyped_storage().resize_(0)`` and re-allocates them with ``resize_(n)`` before the
  next all-gather writes into them (torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``free_storage``);
  those resizes are counted ([Note: resizes outside ops] in runtime/resize_watch.py).

An allocation that takes the count over ``capacity_bytes`` raises :class:`DeviceOutOfMemory`, as a
GPU's allocator would.

In GPU terms (``StorageTracker(device=CudaDeviceModel(...))``, used by simulated CUDA devices,
runtime/sim.py) every storage counts the block the CUDA caching allocator would hand out for it,
replayed allocation by allocation with its reserved segments (runtime/cuda_allocator.py), the cuBLAS
workspaces are allocated at each thread's first matmul, and tensors a CUDA run keeps on the host
(optimizer step counters) are not counted: see runtime/gpu_memory.py. (``rounding=`` counts each storage
as a given function of its size, without the allocator's history.)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hybridplan.runtime.gpu_memory import AllocatorOutOfMemory, CudaDeviceModel
from hybridplan.runtime.resize_watch import resizes, watching

__all__ = ["DeviceOutOfMemory", "StorageTracker", "CATEGORIES", "storage_tensors"]

CATEGORIES = ("parameters", "gradients", "optimizer", "data", "activations", "backward", "step", "other", "weight_stash",
              "workspace")
"""Where bytes are attributed: by the phase they were allocated in, except gradients (re-tagged when
they are accumulated into ``param.grad``) and parameters/optimizer state (registered). "weight_stash" is
PipeDream-2BW's second weight version (runtime/weight_stash.py); other schedules have none. "workspace":
the cuBLAS workspaces of a simulated CUDA device (runtime/gpu_memory.py [Note: cuBLAS workspaces])."""


def _NO_STORAGE() -> None:
    """The weak reference of a replayed storage (runtime/repeats.py): there is no tensor behind it."""
    return None


class DeviceOutOfMemory(RuntimeError):
    """A device's tensor memory would exceed its capacity."""

    def __init__(self, needed: int, capacity: int, phase: str) -> None:
        super().__init__(
            f"out of memory: {needed} bytes of tensors live during {phase}, capacity {capacity} bytes"
        )
        self.needed = needed
        self.capacity = capacity
        self.phase = phase


def storage_tensors(t: Any) -> Iterator[torch.Tensor]:
    """The plain tensors that own storage behind ``t`` (a DTensor, parameter or not, yields its local shard)."""
    if not isinstance(t, torch.Tensor):
        return
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from storage_tensors(getattr(t, name, None))
        return
    yield t


class StorageTracker(TorchDispatchMode):
    """Exact live tensor bytes of this process, with peak, per-category split and a capacity check.

    Use as a context manager around everything that allocates (``with tracker:``); register tensors
    created before it with :meth:`track_all`.

    Example:
        >>> tr = StorageTracker()
        >>> with tr:
        ...     x = torch.empty(256)          # 1 KiB of float32
        ...     y = x.view(16, 16)            # a view: no new storage
        >>> tr.current, tr.peak
        (1024, 1024)
    """

    def __init__(
        self,
        capacity_bytes: int | None = None,
        *,
        rounding: Callable[[int], int] | None = None,
        device: CudaDeviceModel | None = None,
    ) -> None:
        super().__init__()
        self.capacity_bytes = capacity_bytes if device is None else device.capacity_bytes
        self.rounding = rounding
        """Maps a storage's bytes to the bytes its allocation takes; None: exact bytes (or ``device``'s)."""
        self.device = device
        """A simulated CUDA device whose allocator gives every storage its block (GPU terms); None: none."""
        self.current = 0
        self.peak = 0
        self.window_peak = 0
        self.phase = "other"
        self._live: dict[Any, tuple[int, str, Any, int]] = {}
        """Per storage key: (bytes counted, category, weakref, the storage's own bytes)."""
        self._by_category = dict.fromkeys(CATEGORIES, 0)
        self.peak_by_category = dict(self._by_category)
        self._paused = 0
        self._resizable: dict[Any, Any] = {}
        """Storages written through an ``out=`` argument, by key: a weakref each, re-measured at every op that
        follows a resize ([Note: resizes outside ops])."""
        self._resizes_seen = -1
        """The count of watched resizes at the last re-measure (runtime/resize_watch.py)."""
        self._events: list[tuple[Any, ...]] | None = None
        """What happened to the live storages since :meth:`begin_trace`, or None when not tracing."""
        self._anchor: dict[Any, int] = {}
        """Storages live when the trace began, by key: their position in allocation order."""
        self._born: dict[Any, int] = {}
        """Storages allocated since the trace began, by key: which allocation of the trace made them."""
        self._births = 0

    # ------------------------------------------------------------------ accounting
    def _release(self, key: Any, _ref: Any = None) -> None:
        self._resizable.pop(key, None)
        entry = self._live.pop(key, None)
        if entry is not None:
            if self._events is not None:
                self._events.append(("f", self._ref(key)))
                self._anchor.pop(key, None)
                self._born.pop(key, None)
            self.current -= entry[0]
            self._by_category[entry[1]] -= entry[0]
            if self.device is not None:
                self.device.allocator.free(key)

    def _allocate(self, key: Any, nbytes: int) -> int:
        """Bytes counted for a new storage of ``nbytes``: exact, rounded, or the simulated device's block."""
        if self.device is not None:
            try:
                return self.device.allocator.malloc(key, nbytes)
            except AllocatorOutOfMemory as e:
                raise self._out_of_memory(e) from None
        return nbytes if self.rounding is None else self.rounding(nbytes)

    def _out_of_memory(self, e: AllocatorOutOfMemory) -> DeviceOutOfMemory:
        if self.device is None or self.device.capacity_bytes is None:  # only a limited device runs out
            raise RuntimeError("the allocator ran out of memory on a device without a capacity")
        needed = e.reserved + e.request + self.device.outside_bytes
        return DeviceOutOfMemory(needed, self.device.capacity_bytes, self.phase)

    def _count(self, delta: int, category: str) -> None:
        self.current += delta
        self._by_category[category] += delta
        if self.current > self.window_peak:
            self.window_peak = self.current
        if self.current > self.peak:
            self.peak = self.current
            self.peak_by_category = dict(self._by_category)

    def track(self, t: Any, category: str | None = None) -> None:
        """Count ``t``'s storage (once) under ``category`` (default: the current phase)."""
        for plain in storage_tensors(t):
            if plain.device.type == "meta":
                continue
            storage = plain.untyped_storage()
            key = storage._cdata
            size = storage.nbytes()
            entry = self._live.get(key)
            if entry is not None:
                if entry[3] == size:
                    continue
                self._release(key)  # resized in place: count the new size
            cat = category or self.phase
            nbytes = self._allocate(key, size)
            self._live[key] = (nbytes, cat, weakref.ref(storage, functools.partial(self._release, key)), size)
            self._count(nbytes, cat)
            if self._events is not None:
                self._events.append(("a", size, cat))
                self._born[key] = self._births
                self._births += 1
            if self.device is None and self.capacity_bytes is not None and self.current > self.capacity_bytes:
                raise DeviceOutOfMemory(self.current, self.capacity_bytes, self.phase)

    def _remeasure_resizable(self) -> None:
        """Count the storages resized outside any op (see the module docstring) at their size now."""
        for key, ref in list(self._resizable.items()):
            storage = ref()
            entry = self._live.get(key)
            if storage is None or entry is None:
                continue
            size = storage.nbytes()
            if size != entry[3]:
                if self.device is not None:
                    self.device.allocator.free(key)
                nbytes = self._allocate(key, size)
                self._live[key] = (nbytes, entry[1], entry[2], size)
                self._count(nbytes - entry[0], entry[1])
                if self._events is not None:
                    self._events.append(("z", self._ref(key), size))

    def track_all(self, objects: Iterable[Any], category: str) -> None:
        """Register pre-existing tensors: modules (parameters, gradients, buffers), optimizers (state), tensors."""
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    self.track(p, category)
                    if p.grad is not None:
                        self.track(p.grad, "gradients")
                for b in obj.buffers():
                    self.track(b, category)
            elif isinstance(obj, torch.optim.Optimizer):
                for state in obj.state.values():
                    for v in state.values():
                        if isinstance(v, torch.Tensor) and v.dim() > 0:
                            self.track(v, "optimizer")
            else:
                for v in tree_flatten(obj)[0]:
                    self.track(v, category)

    def retag(self, t: Any, category: str) -> None:
        """Move ``t``'s bytes to ``category`` (e.g. a freshly accumulated gradient to "gradients")."""
        for plain in storage_tensors(t):
            key = plain.untyped_storage()._cdata
            entry = self._live.get(key)
            if entry is not None and entry[1] != category:
                self._by_category[entry[1]] -= entry[0]
                self._by_category[category] += entry[0]
                self._live[key] = (entry[0], category, entry[2], entry[3])
                if self._events is not None:
                    self._events.append(("r", self._ref(key), category))

    def forget(self, t: Any) -> None:
        """Stop counting ``t``'s storage now (it is only kept alive for an in-flight send)."""
        for plain in storage_tensors(t):
            self._release(plain.untyped_storage()._cdata)

    def host_resident(self, t: Any) -> None:
        """``t`` would live in host memory in a GPU run: in GPU terms, stop counting it (else no-op)."""
        if self.rounding is not None or self.device is not None:
            self.forget(t)

    def overhead_bytes(self) -> int | None:
        """Device memory outside the allocator: the simulated CUDA device's (runtime/gpu_memory.py); None on a CPU."""
        return None if self.device is None else self.device.outside_bytes

    @property
    def reserved_peak(self) -> int | None:
        """Peak bytes the simulated CUDA device's allocator reserved in this window; None on a CPU."""
        return None if self.device is None else self.device.allocator.peak_reserved

    def workspaces(self) -> dict[str, int] | None:
        """The cuBLAS workspaces the simulated CUDA device holds now, ``{"<library>/<thread>": block bytes}``
        (runtime/gpu_memory.py [Note: cuBLAS workspaces]); None on a CPU. Profiling takes them out of a span's
        ``static``: they are held once per device, not per layer (profiling/statistics.py [Note: workspaces
        are per device])."""
        if self.device is None:
            return None
        return {f"{key[1]}/{key[2]}": entry[0] for key, entry in self._live.items()
                if isinstance(key, tuple) and key[:1] == ("workspace",)}

    # ------------------------------------------------------------------ repeated blocks
    # runtime/repeats.py [Note: skipping repeated blocks]: a block of actions is traced as events on the live
    # storages (named by their place in allocation order at the block's start, or by which of the block's
    # allocations made them), and a block that would repeat it is replayed from those events, without tensors.

    def structure(self) -> tuple[Any, ...]:
        """The live storages as the program sees them: in allocation order, each one's own bytes, category,
        and whether it is resized outside ops; not the bytes the allocator gives them (its history)."""
        return tuple((e[3], e[1], k in self._resizable, isinstance(k, tuple)) for k, e in self._live.items())

    def _ref(self, key: Any) -> tuple[str, int]:
        born = self._born.get(key)
        return ("n", born) if born is not None else ("o", self._anchor[key])

    def begin_trace(self) -> None:
        """Start recording events, named relative to the storages live now."""
        self._events, self._anchor, self._born, self._births = [], {k: i for i, k in enumerate(self._live)}, {}, 0

    def take_events(self) -> tuple[tuple[Any, ...], ...]:
        """The events since the trace began or since the last call (one action's)."""
        if self._events is None:
            raise RuntimeError("take_events called outside a trace")
        out = tuple(self._events)
        self._events.clear()
        return out

    def end_trace(self) -> None:
        """Stop recording."""
        self._events, self._anchor, self._born = None, {}, {}

    def replay(self, actions: Sequence[Sequence[tuple[Any, ...]]]) -> list[tuple[int, int, int]]:
        """Apply a traced block's events, one sequence per action, to the storages live now (which must have the
        traced block's :meth:`structure`); returns each action's (level before, window peak, level after).
        Storages the block allocates get keys of their own (no tensor stands behind them); :meth:`adopt`
        gives the live set back to the program's tensors afterwards."""
        order = list(self._live)
        born: list[Any] = []
        out = []
        for events in actions:
            before = self.current
            for event in events:
                kind = event[0]
                key = None if kind in ("s", "a") else order[event[1][1]] if event[1][0] == "o" else born[event[1][1]]
                if kind == "s":
                    before = self.window_peak = self.current
                elif kind == "a":
                    key = object()
                    born.append(key)
                    nbytes = self._allocate(key, event[1])
                    self._live[key] = (nbytes, event[2], None, event[1])
                    self._count(nbytes, event[2])
                    if self.device is None and self.capacity_bytes is not None and self.current > self.capacity_bytes:
                        raise DeviceOutOfMemory(self.current, self.capacity_bytes, self.phase)
                elif kind == "f":
                    self._release(key)
                elif kind == "r":
                    entry = self._live[key]
                    self._by_category[entry[1]] -= entry[0]
                    self._by_category[event[2]] += entry[0]
                    self._live[key] = (entry[0], event[2], entry[2], entry[3])
                elif kind == "z":
                    entry = self._live[key]
                    if self.device is not None:
                        self.device.allocator.free(key)
                    nbytes = self._allocate(key, event[2])
                    self._live[key] = (nbytes, entry[1], entry[2], event[2])
                    self._count(nbytes - entry[0], entry[1])
                elif kind == "w":
                    self._resizable[key] = _NO_STORAGE
                else:
                    raise RuntimeError(f"a traced event of kind {kind!r} cannot be replayed")
            out.append((before, self.window_peak, self.current))
        return out

    def snapshot(self) -> list[tuple[Any, Any]]:
        """The live storages now, in allocation order, with their weak references (for :meth:`adopt`)."""
        return [(k, e[2]) for k, e in self._live.items()]

    def adopt(self, snapshot: list[tuple[Any, Any]]) -> None:
        """After :meth:`replay`: the storage at each place in allocation order is the program's storage at that
        place in ``snapshot`` (taken when the structure was the same), with the bytes the replay gave it."""
        now = list(self._live.items())
        if len(now) != len(snapshot):
            raise RuntimeError(f"replayed {len(now)} live storages for the program's {len(snapshot)}")
        self._live = {key: (e[0], e[1], ref, e[3]) for (key, ref), (_, e) in zip(snapshot, now)}
        self._resizable = {key: ref for (key, ref), (old, _) in zip(snapshot, now) if old in self._resizable}
        if self.device is not None:
            self.device.allocator.rekey([(old, key) for (key, _), (old, _) in zip(snapshot, now)])

    def counts(self, t: Any) -> bool:
        """Whether ``t``'s storage is currently counted."""
        return all(p.untyped_storage()._cdata in self._live for p in storage_tensors(t))

    def reset_peak(self) -> None:
        """Start a new peak window at the current level."""
        self._remeasure_resizable()
        self.peak = self.current
        self.window_peak = self.current
        self.peak_by_category = dict(self._by_category)
        if self.device is not None:
            self.device.allocator.reset_peak()

    def start_window(self) -> int:
        """Start a sub-window (for per-action peaks); returns the current level."""
        self._remeasure_resizable()
        self.window_peak = self.current
        if self._events is not None:
            self._events.append(("s",))
        return self.current

    @property
    def by_category(self) -> dict[str, int]:
        """Live bytes per category now."""
        return dict(self._by_category)

    # ------------------------------------------------------------------ phases
    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Attribute allocations inside the block to ``phase`` (one of :data:`CATEGORIES`)."""
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Do not count allocations made inside the block (e.g. generating the synthetic data set)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._resizable and (self._resizes_seen != resizes() or not watching()):
            self._resizes_seen = resizes()
            self._remeasure_resizable()
        out = func(*args, **kwargs)
        if not self._paused:
            written = kwargs.get("out")
            for t in (tree_flatten(written)[0] if written is not None else ()):
                if isinstance(t, torch.Tensor):
                    self.track(t)  # at its size now: its owner may have resized it since it was last seen
                    for plain in storage_tensors(t):
                        storage = plain.untyped_storage()
                        if storage._cdata in self._live:
                            if self._events is not None and storage._cdata not in self._resizable:
                                self._events.append(("w", self._ref(storage._cdata)))
                            self._resizable[storage._cdata] = weakref.ref(storage)
            if isinstance(out, torch.Tensor):  # most ops: one tensor, nothing to flatten
                self.track(out)
            else:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        self.track(t)
            if self.device is not None:
                self._workspaces(func, args)
        return out

    def _workspaces(self, func: Any, args: Any) -> None:
        """Allocate the cuBLAS workspaces a CUDA run of ``func`` would (runtime/gpu_memory.py [Note: cuBLAS
        workspaces]); the backward phase runs on autograd's own thread, whose handle has its own."""
        if self.device is None:  # called only for a simulated CUDA device
            raise RuntimeError("cuBLAS workspaces asked for without a simulated CUDA device")
        op = getattr(getattr(func, "overloadpacket", None), "__name__", "")
        bias = bool(args) and isinstance(args[0], torch.Tensor) and args[0].dim() == 1
        backward = self.phase == "backward"
        try:
            blocks = self.device.workspaces_for(op, bias=bias, backward=backward)
        except AllocatorOutOfMemory as e:
            raise self._out_of_memory(e) from None
        for key, nbytes in blocks:  # held for the process's life, as PyTorch's handle-to-workspace map holds them
            self._live[key] = (nbytes, "workspace", None, nbytes)
            self._count(nbytes, "workspace")
            if self._events is not None:
                self._events.append(("workspace", key))  # never replayed: a trace holding one does not repeat
