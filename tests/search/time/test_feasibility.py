"""Which plans the throughput searches keep (search/time/feasibility.py): runnable by the model, predictable from the
profile, and within every device's memory."""

from __future__ import annotations

import math

from hybridplan.plan.cluster import Cluster
from hybridplan.models.zoo import get_model
from hybridplan.plan import Plan, StagePlan
from hybridplan.search.time.feasibility import Feasibility
from tests.predict.test_memory_2bw import _predictor


def _plan(*stages: tuple[int, int, str, tuple[int, ...]], schedule: str = "1f1b", **extra) -> Plan:  # type: ignore[no-untyped-def]
    return Plan(schedule, 32, 4, tuple(StagePlan(a, b, k, len(d), d) for a, b, k, d in stages), extra)


PIPELINE = _plan((0, 1, "none", (0,)), (1, 2, "none", (1,)), (2, 3, "none", (2,)), (3, 4, "none", (3,)))


def test_capacity_per_device():
    predictor = _predictor("1f1b", "1f1b")
    peak = predictor.predict(PIPELINE).peak_memory_bytes
    roomy = Feasibility(Cluster.parse("1x4", device_memory=peak), predictor)
    assert roomy(PIPELINE) and roomy.peak_memory(PIPELINE) == peak and roomy.rejected == 0
    tight = Feasibility(Cluster.parse("1x4", device_memory=peak - 1), predictor)
    assert not tight(PIPELINE) and tight.too_large == 1 and "would need" in tight.reasons["too_large"]
    # the weight stash of 2BW makes the same plan larger
    two = _plan(*((s.start, s.stop, s.parallelism, s.devices) for s in PIPELINE.stages), schedule="2bw")
    assert not roomy(two) and roomy.too_large == 1


def test_invalid_and_unpredictable_plans():
    fit = Feasibility(Cluster.parse("1x4"), _predictor("1f1b", "1f1b"))
    assert not fit(_plan((0, 2, "data", (0, 1)), (2, 4, "tensor", (2, 3))))  # no data statistics
    assert fit.unpredictable == 1 and "no data2 statistics" in fit.reasons["unpredictable"]
    assert math.isinf(fit.peak_memory(_plan((0, 2, "data", (0, 1)), (2, 4, "tensor", (2, 3)))))
    assert not fit(_plan((0, 4, "none", (0,))))  # devices 1-3 unused
    assert fit.invalid == 1 and "are not used by any stage" in fit.reasons["invalid"]
    recompute = _plan(*((s.start, s.stop, s.parallelism, s.devices) for s in PIPELINE.stages), recompute=True)
    assert not fit(recompute) and fit.unpredictable == 2
    assert fit.summary() == "rejected: 1 invalid for the model, 2 unpredictable from the profile"


def test_model_rules_without_a_predictor():
    # the MLP's last Linear has 10 outputs: not splittable 4 ways
    fit = Feasibility(Cluster.parse("1x4"), model=get_model("tests.cli.user_models:mlp"))
    assert fit(_plan((0, 4, "tensor", (0, 1)), (4, 5, "tensor", (2, 3))))
    assert not fit(_plan((0, 5, "tensor", (0, 1, 2, 3)))) and fit.invalid == 1
    assert "cannot be tensor-parallel at degree 4" in fit.reasons["invalid"]
    assert fit.peak_memory(PIPELINE) == 0.0


def test_a_cuda_capacity_holds_the_memory_outside_the_allocator_too():
    """On CUDA --device-memory is the whole device: the predicted total (tensors + outside the allocator) must fit."""
    predictor = _predictor("1f1b", "1f1b")
    predictor.device_type = "cuda"
    totals = [d.total_bytes for d in predictor.predict(PIPELINE).devices]
    assert all(t is not None for t in totals)
    peak = predictor.predict(PIPELINE).peak_memory_bytes
    assert not Feasibility(Cluster.parse("1x4", device_memory=peak), predictor)(PIPELINE)
    assert Feasibility(Cluster.parse("1x4", device_memory=max(totals)), predictor)(PIPELINE)


def test_stage_peaks_are_the_prediction_per_stage_and_inf_over_capacity():
    """The peaks a throughput search chooses stage options from: per stage its device's predicted peak (one device
    per stage here), ``inf`` for the stage whose device exceeds its capacity, ``None`` for a plan that is invalid or
    unpredictable; no rejection is counted."""
    predictor = _predictor("1f1b", "1f1b")
    peaks = [d.peak_memory_bytes for d in predictor.predict(PIPELINE).devices]
    roomy = Feasibility(Cluster.parse("1x4", device_memory=max(peaks)), predictor)
    assert roomy.stage_peaks(PIPELINE) == [float(p) for p in peaks]
    tight = Feasibility(Cluster.parse("1x4", device_memory=max(peaks) - 1), predictor)
    assert tight.stage_peaks(PIPELINE) == [float(p) if p < max(peaks) else math.inf for p in peaks]
    assert tight.stage_peaks(_plan((0, 2, "data", (0, 1)), (2, 4, "tensor", (2, 3)))) is None  # no data statistics
    assert tight.stage_peaks(_plan((0, 4, "none", (0,)))) is None  # devices 1-3 unused
    assert tight.rejected == 0
    assert Feasibility(Cluster.parse("1x4")).stage_peaks(PIPELINE) == [0.0] * 4


def test_a_cuda_capacity_holds_the_reserved_peak():
    """With reserved peaks measured by the profile, what must fit is reserved + outside: the profile's excess of
    4 MiB on every span (10 MiB reserved for a tensor peak of 5 MiB + 1 B, rounded up to 6) lifts every device's
    total by 4 MiB or more above the rounded tensor peak + outside (predict/reserved.py)."""
    from hybridplan.predict.reserved import ReservedExcess, reserved_peak_from

    predictor = _predictor("1f1b", "1f1b")
    predictor.device_type = "cuda"
    M = 2**20
    predictor.reserved = ReservedExcess([("none", 1, b, b // 4, a, a + 1, 5 * M + 1, 10 * M)
                                       for b in (8, 16, 32) for a in range(4)])
    devices = predictor.predict(PIPELINE).devices
    for d in devices:
        assert d.reserved_peak_bytes == reserved_peak_from(d.peak_memory_bytes, 0) + 4 * M
        assert d.total_bytes == d.needed_bytes == d.reserved_peak_bytes + d.overhead_bytes
    tensors_only = max(d.peak_memory_bytes + d.overhead_bytes for d in devices)
    assert not Feasibility(Cluster.parse("1x4", device_memory=max(d.total_bytes for d in devices) - 1), predictor)(PIPELINE)
    assert not Feasibility(Cluster.parse("1x4", device_memory=tensors_only), predictor)(PIPELINE)
    assert Feasibility(Cluster.parse("1x4", device_memory=max(d.total_bytes for d in devices)), predictor)(PIPELINE)
