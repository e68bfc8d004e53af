"""Which plans the throughput searches keep (search/time/feasibility.py): runnable by the model, predictable from the
profile, and within every device's memory."""

from __future__ import annotations

import itertools
import math

import pytest

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


def test_stage_windows_hold_exactly_the_ranges_that_fit():
    """The windows of a throughput search's cut ([Note: cutting within memory]) from the predictor: for every
    uniform plan on 2 to 4 devices (pipeline and tensor x2 stages, 1F1B and GPipe, 1 to 8 micro-batches, CPU and
    CUDA, whose totals hold the memory outside the allocator), at capacities at and between the plans' needs, a
    plan fits (``__call__``) if and only if its every stage starts inside its window, up to a byte (the windows
    are a lower bound: never stricter)."""
    from tests.search.time.util import all_cuts

    for cuda, schedule in itertools.product((False, True), ("1f1b", "gpipe")):
        predictor = _predictor("1f1b", "1f1b")
        predictor.device_type = "cuda" if cuda else "cpu"
        for (pp, tp), m in itertools.product(((2, 1), (3, 1), (2, 2), (1, 2)), (1, 2, 8)):
            plans = [Plan.uniform(boundaries=b, data_degree=1, tensor_degree=tp, micro_batch_size=32 // m,
                                  global_batch_size=32, schedule=schedule) for b in all_cuts(4, pp)]
            needs = sorted({d.needed_bytes for plan in plans for d in predictor.predict(plan).devices})
            for capacity in needs + [n - 2 for n in needs]:
                fit = Feasibility(Cluster.uniform(1, pp * tp, memory_bytes=capacity), predictor)
                for plan in plans:
                    windows = fit.stage_windows(plan)
                    assert windows is not None
                    inside = all(s.start >= windows[j][s.stop] for j, s in enumerate(plan.stages))
                    assert inside == fit(plan)


def test_the_search_within_the_windows_finds_the_fastest_plan_that_fits():
    """Four layers of 1, 1, 1 and 3 ms forward on two devices, memory from the predictor: at every capacity
    between the needs of the plans (pp 2 x every cut x every micro-batch count; pp 1 would be data x2, which this
    profile cannot predict), the search with the windows returns the fastest plan that fits as enumerating them
    finds it; without them, at some capacities none (the fastest cut, three layers on the first stage, does not
    fit where (0, 2, 4) does)."""
    from hybridplan.predict.time_model import predict_iteration_time
    from hybridplan.profiling.layer_info import LayerInfo
    from hybridplan.profiling.time_profile import TimeProfile
    from hybridplan.profiling.timing_table import TimingTable
    from hybridplan.search.time.throughput import search_throughput
    from tests.search.time.util import all_cuts

    fwd = (1e-3, 1e-3, 1e-3, 3e-3)
    profile = TimeProfile(model="toy", layers=tuple(LayerInfo(name=f"l{i}", activation_bytes_per_sample=1e3,
                                                              parameter_bytes=0.0) for i in range(4)),
                          timings=(TimingTable(device_type="A", tensor_degree=1, micro_batch_size=1, forward_s=fwd,
                                               backward_s=tuple(2 * f for f in fwd)),))
    predictor = _predictor("1f1b", "1f1b")
    plans = [Plan.uniform(boundaries=b, data_degree=1, tensor_degree=1, micro_batch_size=32 // m,
                          global_batch_size=32) for m in (1, 2, 4, 8, 16, 32) for b in all_cuts(4, 2)]
    missed = 0
    for capacity in sorted({max(d.needed_bytes for d in predictor.predict(plan).devices) for plan in plans}):
        cluster = Cluster.uniform(1, 2, device_type="A", memory_bytes=capacity)
        fit = Feasibility(cluster, predictor)
        want = min((predict_iteration_time(p, profile, cluster).total_s for p in plans if fit(p)), default=math.inf)
        found = search_throughput(profile, cluster, 32, memory_ok=fit, stage_windows=fit.stage_windows)
        assert min((c.iteration_s for c in found.candidates), default=math.inf) == pytest.approx(want, rel=1e-12)
        plain = search_throughput(profile, cluster, 32, memory_ok=Feasibility(cluster, predictor)).candidates
        missed += min((c.iteration_s for c in plain), default=math.inf) > want * (1 + 1e-9)
    assert missed >= 3
