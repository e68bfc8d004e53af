"""The model of the CUDA caching allocator (runtime/cuda_allocator.py), on sequences worked out by hand from the
rules of c10/cuda/CUDACachingAllocator.cpp: segment sizes, best fit, splitting, merging, and the limit."""

from __future__ import annotations

import pytest

from hybridplan.runtime.cuda_allocator import AllocatorOutOfMemory, CachingAllocatorModel, segment_size

MIB = 2**20


@pytest.mark.parametrize("block, segment", [(512, 2 * MIB), (MIB, 2 * MIB), (MIB + 512, 20 * MIB),
                                            (10 * MIB - 512, 20 * MIB), (10 * MIB, 10 * MIB),
                                            (10 * MIB + 512, 12 * MIB), (33 * MIB, 34 * MIB)])
def test_segment_sizes(block, segment):
    assert segment_size(block) == segment


def test_small_blocks_share_a_2_mib_segment_and_merge_back():
    a = CachingAllocatorModel()
    assert [a.malloc(k, 700_000) for k in "xy"] == [700_416, 700_416]  # ceil(700000 / 512) * 512
    assert a.reserved == 2 * MIB and a.allocated == 2 * 700_416
    a.malloc("z", 700_000)  # 2 MiB - 2 * 700416 = 696320 bytes left: too few, a second segment
    assert a.reserved == 4 * MIB
    a.free("x")
    a.free("y")  # merges with x's block and the segment's free tail: one whole 2 MiB block
    assert a.malloc("w", MIB) == MIB and a.reserved == 4 * MIB


def test_a_large_block_is_not_split_when_at_most_1_mib_would_remain():
    a = CachingAllocatorModel()
    a.malloc("x", 12 * MIB)  # a 12 MiB segment
    a.free("x")
    assert a.malloc("y", 11 * MIB + 512) == 12 * MIB  # 1 MiB - 512 would remain: handed out whole
    a.free("y")
    assert a.malloc("z", 10 * MIB) == 10 * MIB  # 2 MiB would remain (> 1 MiB): split
    assert a.allocated == 10 * MIB and a.reserved == 12 * MIB and a.peak_allocated == 12 * MIB


def test_best_fit_takes_the_smallest_big_enough_block():
    a = CachingAllocatorModel()
    for key, size in (("big", 40 * MIB), ("mid", 16 * MIB), ("sep", 12 * MIB)):
        a.malloc(key, size)
    a.free("big")
    a.free("mid")
    assert a.malloc("new", 14 * MIB) == 14 * MIB  # from the 16 MiB block (2 MiB left: split), not the 40 MiB one
    assert a.malloc("next", 30 * MIB) == 30 * MIB and a.reserved == 68 * MIB  # from the 40 MiB one


def test_the_limit_releases_free_segments_then_runs_out():
    a = CachingAllocatorModel(limit_bytes=30 * MIB)
    a.malloc("x", 20 * MIB)
    a.free("x")  # cached, still reserved
    a.malloc("y", 24 * MIB)  # 20 + 24 > 30: the free 20 MiB segment is released first
    assert a.reserved == 24 * MIB
    with pytest.raises(AllocatorOutOfMemory):
        a.malloc("z", 8 * MIB)  # a 20 MiB segment: 44 > 30 and nothing free to release


def test_reset_peak_starts_at_the_current_levels():
    a = CachingAllocatorModel()
    a.malloc("x", 12 * MIB)
    a.free("x")
    a.reset_peak()
    assert (a.peak_allocated, a.peak_reserved) == (0, 12 * MIB)


def test_docstring_examples():
    import doctest

    from hybridplan.runtime import cuda_allocator

    assert doctest.testmod(cuda_allocator).failed == 0
