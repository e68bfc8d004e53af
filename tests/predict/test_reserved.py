"""The reserved peak predicted from a CUDA profile's measured excess (predict/reserved.py, [Note: predicting the
reserved peak]): expected values derived by hand from the allocator's rule that every segment is a whole number
of 2 MiB (c10/cuda/CUDACachingAllocator.cpp: kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kRoundLarge 2 MiB)."""

from __future__ import annotations

import pytest

from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.reserved import ReservedExcess, reserved_peak_from
from tests.predict.test_memory import linear, predictor, stats_at

M = 2**20


def test_the_reserved_peak_is_a_whole_number_of_2_mib_at_least_the_tensor_peak():
    assert reserved_peak_from(0, 0) == 0
    assert reserved_peak_from(1, 0) == 2 * M  # one byte needs a 2 MiB small segment
    assert reserved_peak_from(2 * M, 0) == 2 * M and reserved_peak_from(2 * M + 1, 0) == 4 * M
    assert reserved_peak_from(65 * M, 20 * M) == 86 * M  # 85 MiB -> 43 segments' worth of 2 MiB
    assert reserved_peak_from(65 * M, -3 * M) == 66 * M  # a negative excess is no excess


def test_the_excess_is_what_was_reserved_beyond_the_tensor_peak_rounded_up():
    """One span at two micro-batch sizes: tensor 65 MiB + 1 B -> least 66 MiB, reserved 70: excess 4 MiB; tensor
    exactly 68 MiB, reserved 76: excess 8 MiB. Any other size takes the nearest profiled size's (the larger on a tie)."""
    g = ReservedExcess([("none", 1, 8, 2, 0, 2, 65 * M + 1, 70 * M), ("none", 1, 16, 4, 0, 2, 68 * M, 76 * M)])
    assert [g.excess(0, 2, "none", 1, b) for b in (1, 2, 3, 4, 8)] == [4 * M, 4 * M, 8 * M, 8 * M, 8 * M]
    # reserved below the rounded tensor peak cannot happen on a device; the excess is never below 0
    assert ReservedExcess([("none", 1, 8, 2, 0, 2, 3 * M, 2 * M)]).excess(0, 2, "none", 1, 2) == 0
    # several devices measuring the same span at the same size: the largest excess
    assert ReservedExcess([("none", 1, 8, 2, 0, 2, M, 2 * M), ("none", 1, 8, 2, 0, 2, M, 6 * M)]).excess(0, 2, "none", 1, 2) == 4 * M


def test_an_unprofiled_span_takes_the_nearest_profiled_one_of_its_scenario():
    rows = [("none", 1, 8, 2, 0, 1, M, 2 * M),     # excess 0
            ("none", 1, 8, 2, 0, 3, M, 6 * M),     # 4 MiB
            ("none", 1, 8, 2, 2, 4, M, 10 * M),    # 8 MiB
            ("tensor", 2, 8, 2, 0, 4, M, 22 * M),  # 20 MiB
            ("tensor", 4, 8, 2, 0, 4, M, 12 * M)]  # 10 MiB
    g = ReservedExcess(rows)
    assert g.excess(0, 3, "none", 1, 2) == 4 * M    # profiled itself
    assert g.excess(0, 2, "none", 1, 2) == 4 * M    # [0, 3) and [0, 1) one layer away: the larger excess
    assert g.excess(1, 4, "none", 1, 2) == 8 * M    # [2, 4): one layer away; [0, 3): two
    assert g.excess(3, 4, "none", 1, 2) == 8 * M
    assert g.excess(0, 4, "data", 1, 2) == 4 * M    # degree 1 is the pipeline scenario whatever its kind; [0, 3) nearest
    assert g.excess(0, 4, "tensor", 8, 2) == 10 * M  # above the profiled degrees: the largest profiled
    assert g.excess(0, 4, "data", 2, 2) is None and not ReservedExcess([]) and g


def test_the_predictor_adds_the_reserved_peak_and_totals_it_with_the_memory_outside():
    """A 1-stage CUDA plan: the predicted tensor peak plus 4 MiB of measured excess, rounded up to 2 MiB, is the
    reserved peak; the total is it plus the memory outside (context 618.8 MiB + libraries 84 MiB, no communicator)."""
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    plan = Plan("1f1b", 32, 4, (StagePlan(0, 4, "none", 1, (0,)),))
    excess = ReservedExcess([("none", 1, 8, 2, 0, 4, M, 6 * M), ("none", 1, 16, 4, 0, 4, M, 6 * M)])  # 4 MiB at both
    device = predictor(stats, device_type="cuda", reserved=excess).predict(plan).devices[0]
    tensor = device.peak_memory_bytes
    assert 0 < tensor < 2 * M  # the linear stand-in holds a few KB: one 2 MiB segment + 4 MiB of excess
    assert device.reserved_peak_bytes == 6 * M
    assert device.total_bytes == device.needed_bytes == 6 * M + round(618.8 * M) + 84 * M
    plain = predictor(stats, device_type="cuda").predict(plan).devices[0]  # no measured excess: not predicted
    assert plain.reserved_peak_bytes is None and plain.total_bytes == tensor + round(618.8 * M) + 84 * M
    on_cpu = predictor(stats, reserved=excess).predict(plan).devices[0]  # a CPU has no caching allocator
    assert on_cpu.reserved_peak_bytes is None and on_cpu.total_bytes is None
    retargeted = predictor(stats, device_type="cuda", reserved=excess).retargeted(global_batch_size=16)
    assert retargeted.reserved is excess


@pytest.mark.parametrize("micro, expected", [(2, 2 * M), (8, 6 * M)])
def test_a_data_tensor_stage_takes_the_tensor_excess_at_its_replicas_micro_batch(micro, expected):
    """[Note: a data x tensor stage is a tensor stage at a smaller batch]: 2 replicas of a 2-way tensor group at
    micro-batches of ``micro`` take the tensor-2 excess at ``micro / 2``: at 1 the excess profiled at 2 (0 MiB), at 4
    the one profiled at 4 (4 MiB); the tensor peak is a few KB, one 2 MiB segment."""
    stats = {("tensor", 2): [stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    excess = ReservedExcess([("tensor", 2, 8, 2, 0, 4, M, 2 * M), ("tensor", 2, 16, 4, 0, 4, M, 6 * M)])
    plan = Plan("1f1b", micro * 4, 4, (StagePlan(0, 4, "data+tensor", 4, (0, 1, 2, 3), tensor_degree=2),))
    devices = predictor(stats, device_type="cuda", reserved=excess, global_batch_size=micro * 4).predict(plan).devices
    assert {d.reserved_peak_bytes for d in devices} == {expected}
