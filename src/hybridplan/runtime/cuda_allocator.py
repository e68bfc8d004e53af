"""A model of PyTorch's CUDA caching allocator, for simulated CUDA devices: what ``max_memory_allocated``
and ``max_memory_reserved`` would report for a given sequence of allocations and frees.

Simulated devices run on fake CPU tensors (runtime/sim.py), so no real allocator sees them. The
storage tracker (runtime/memory.py) sees every allocation and free in program order, though, and on
one stream the caching allocator is a deterministic function of that order. This module replays it
([Note: the caching allocator model]); runtime/gpu_memory.py adds what the allocator holds that no
tensor does (the cuBLAS workspaces) and what the device holds outside it.

[Note: the caching allocator model] Read from c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch,
the ``DeviceCachingAllocator`` and its constants; the rules have been stable since torch 1.x):

- a request of ``n`` bytes is rounded to ``round_size(n)``: a multiple of ``kMinBlockSize`` = 512
  (at least 512); requests of at most ``kSmallSize`` = 1 MiB are served from the small pool, the rest
  from the large pool;
- a request first takes the BEST-FITTING cached free block of its pool: ``pool.blocks.lower_bound``
  on (stream, size), blocks ordered by size then address, so the smallest big-enough block, the
  lowest address among equals;
- with none, it reserves a new segment (``cudaMalloc``) of ``get_allocation_size``: 2 MiB
  (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``) for a request under 10 MiB
  (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
- the block is split when the rest is worth keeping (``should_split``): in the small pool when at
  least 512 bytes remain, in the large pool when MORE than 1 MiB remains; otherwise the whole block is
  handed out, and ``allocated_bytes`` (what ``max_memory_allocated`` reports) grows by its whole size;
- a freed block merges with free neighbours of its segment (``try_merge_blocks``) and stays cached:
  segments are returned to the driver only when a ``cudaMalloc`` would fail (``release_cached_blocks``
  frees every wholly free segment, then the allocation is retried) or on ``empty_cache``, which the
  runtime never calls;
- a per-process limit (``set_per_process_memory_fraction``) makes ``cudaMalloc`` "fail" once the
  reserved bytes would exceed it (``allowed_memory_maximum``).

Modelled as deterministic: all of the above for ONE stream, the default settings
(``PYTORCH_CUDA_ALLOC_CONF`` unset: no ``max_split_size_mb``, no ``roundup_power2_divisions``, no
expandable segments, no garbage-collection threshold). Not modelled, and why:

- the addresses ``cudaMalloc`` returns: segments are assumed to come at increasing addresses (they
  only break ties between equal-sized free blocks);
- blocks used on other streams (``record_stream``: NCCL's collectives and point-to-point transfers run
  on their own streams) are freed only when those streams' events complete, a matter of timing; a
  plan with NCCL traffic is therefore modelled as if every free were immediate (a lower bound);
- allocations made inside CUDA kernels' libraries through the allocator (cuDNN's convolution
  workspaces, sized by the algorithm cuDNN picks at run time): not seen on the CPU.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "CachingAllocatorModel",
    "AllocatorOutOfMemory",
    "MIN_BLOCK_BYTES",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "round_size",
    "segment_size",
]

MIN_BLOCK_BYTES = 512
"""``kMinBlockSize``: all sizes are rounded to multiples of 512 bytes."""
SMALL_SIZE = 1 << 20
"""``kSmallSize``: the largest "small" allocation, 1 MiB."""
SMALL_BUFFER = 2 << 20
"""``kSmallBuffer``: "small" allocations are packed in 2 MiB segments."""
LARGE_BUFFER = 20 << 20
"""``kLargeBuffer``: allocations between 1 and 10 MiB get a 20 MiB segment."""
MIN_LARGE_ALLOC = 10 << 20
"""``kMinLargeAlloc``: from 10 MiB on, a segment is the request rounded up to ``ROUND_LARGE``."""
ROUND_LARGE = 2 << 20
"""``kRoundLarge``: large segments are multiples of 2 MiB."""


def round_size(nbytes: int) -> int:
    """The block size of a request (``round_size``): 0 for 0 bytes (no block), else a multiple of 512.

    Example:
        >>> [round_size(n) for n in (0, 1, 512, 513)]
        [0, 512, 512, 1024]
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(block: int) -> int:
    """Bytes reserved (``cudaMalloc``) for a new segment serving a block of ``block`` bytes
    (``get_allocation_size``).

    Example:
        >>> [segment_size(n) >> 20 for n in (512, 1 << 20, (1 << 20) + 512, 10 << 20, (10 << 20) + 512)]
        [2, 2, 20, 10, 12]
    """
    if block <= SMALL_SIZE:
        return SMALL_BUFFER
    if block < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-block // ROUND_LARGE) * ROUND_LARGE


class AllocatorOutOfMemory(RuntimeError):
    """The modelled allocator could not reserve a segment within its limit (after freeing its cache)."""

    def __init__(self, request: int, reserved: int, limit: int) -> None:
        super().__init__(f"cannot reserve a segment for {request} bytes: {reserved} bytes reserved, limit {limit}")
        self.request = request
        self.reserved = reserved
        self.limit = limit


@dataclass(eq=False)
class _Block:
    ident: int
    address: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)


class CachingAllocatorModel:
    """The caching allocator of one device, on one stream (see [Note: the caching allocator model]).

    Args:
        limit_bytes: the most bytes it may reserve (None: unlimited), as a per-process memory fraction sets.

    Example (the freed block merges back into its 2 MiB segment, which the next requests split):
        >>> a = CachingAllocatorModel()
        >>> a.malloc("x", 1000), a.allocated, a.reserved
        (1024, 1024, 2097152)
        >>> a.free("x"); a.malloc("y", 500), a.malloc("z", 500), a.reserved, a.peak_allocated
        (512, 512, 2097152, 1024)
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        """Free blocks per pool (small: True) as sorted (size, address, id) keys."""
        self._blocks: dict[int, _Block] = {}
        """Every block (free or not) by ``ident``."""
        self._live: dict[Hashable, _Block] = {}
        self._next_address = 0
        self._ids = itertools.count()

    # ------------------------------------------------------------------ pools
    @staticmethod
    def _key(block: _Block) -> tuple[int, int, int]:
        return (block.size, block.address, block.ident)

    def _make(self, address: int, size: int, small: bool) -> _Block:
        block = _Block(next(self._ids), address, size, small)
        self._blocks[block.ident] = block
        return block

    def _insert(self, block: _Block) -> None:
        bisect.insort(self._pools[block.small], self._key(block))

    def _remove(self, block: _Block) -> None:
        pool = self._pools[block.small]
        i = bisect.bisect_left(pool, self._key(block))
        del pool[i]

    def _forget(self, block: _Block) -> None:
        del self._blocks[block.ident]

    # ------------------------------------------------------------------ public
    def malloc(self, key: Hashable, nbytes: int) -> int:
        """Allocate ``nbytes`` for ``key`` (a storage); return the bytes ``allocated`` grew by (the block).

        Raises:
            AllocatorOutOfMemory: if a new segment would take ``reserved`` over the limit even after
                every wholly free cached segment is released.
        """
        size = round_size(nbytes)
        if size == 0:
            return 0
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            block = self._blocks[pool[i][2]]
            self._remove(block)
        else:
            block = self._new_segment(size, small)
        rest = block.size - size
        if (rest >= MIN_BLOCK_BYTES) if small else (rest > SMALL_SIZE):
            tail = self._make(block.address + size, rest, small)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def free(self, key: Hashable) -> None:
        """Free ``key``'s block (no-op for a key without one, e.g. a zero-byte storage)."""
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove(neighbour)
                if neighbour is block.prev:
                    block.address, block.prev = neighbour.address, neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
                self._forget(neighbour)
        self._insert(block)

    def reset_peak(self) -> None:
        """Start new peak windows at the current levels (``reset_peak_memory_stats``)."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def rekey(self, pairs: Iterable[tuple[Hashable, Hashable]]) -> None:
        """Give each ``(old, new)`` pair's block to ``new`` (runtime/memory.py ``StorageTracker.adopt``); a block
        whose key is in no pair keeps it."""
        moved = {old: new for old, new in pairs}
        self._live = {moved.get(key, key): block for key, block in self._live.items()}

    def block_of(self, key: Hashable) -> int:
        """Bytes of ``key``'s block (0 if it has none)."""
        block = self._live.get(key)
        return 0 if block is None else block.size

    # ------------------------------------------------------------------ segments
    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = segment_size(size)
        if self.limit_bytes is not None and self.reserved + nbytes > self.limit_bytes:
            self._release_cached()
            if self.reserved + nbytes > self.limit_bytes:
                raise AllocatorOutOfMemory(size, self.reserved, self.limit_bytes)
        block = self._make(self._next_address, nbytes, small)
        self._next_address += nbytes
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached(self) -> None:
        """``release_cached_blocks``: return every wholly free segment to the driver."""
        for small, pool in self._pools.items():
            keep = []
            for entry in pool:
                block = self._blocks[entry[2]]
                if block.prev is None and block.next is None:
                    self.reserved -= block.size
                    self._forget(block)
                else:
                    keep.append(entry)
            self._pools[small] = keep
