from __future__ import annotations

import math

import numpy as np
import pytest

from hybridplan.errors import PlanError, ProfileError
from hybridplan.plan import Plan, StagePlan
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.profiling.schedule_memory import stage_peak
from hybridplan.profiling.quantities import INDEX, QUANTITIES
from hybridplan.profiling.statistics import STATISTIC_QUANTITIES, SpanStatistics

Q = len(STATISTIC_QUANTITIES)
L = 4


def stats_at(micro: int, batch: int, fn) -> SpanStatistics:
    """Statistics whose every span is given by ``fn(start, stop, micro)`` (measured directly)."""
    s = SpanStatistics(num_layers=L, microbatch_size=micro, batch_size=batch)
    for a in range(L):
        for b in range(a + 1, L + 1):
            s.spans[(a, b)] = fn(a, b, micro)
    return s


def linear(a, b, micro, degree=1):
    """Per-layer static 1000/degree, activation 100*micro/degree, transients proportional."""
    v = np.zeros(Q)
    n = b - a
    v[INDEX["static"]] = 1000 * n / degree
    v[INDEX["gradient"]] = 250 * n / degree
    v[INDEX["activation"]] = 100 * micro * n / degree
    v[INDEX["forward_transient"]] = 40 * micro / degree
    v[INDEX["first_backward_transient"]] = 30 * micro / degree
    v[INDEX["backward_transient"]] = 30 * micro / degree
    v[INDEX["step_transient"]] = 10 * n
    v[INDEX["data"]] = 8 * micro * 4 if a == 0 else 0  # 4 micro-batches of `micro` samples, 8 bytes each
    v[-1] = 0
    return v


def predictor(stats, **kw):
    kw = {"num_layers": L, "schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 4, **kw}
    return MemoryPredictor(stats, **kw)


def test_linear_scaling_to_the_target_batch_is_exact_for_linear_quantities():
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    p = predictor(stats)  # target micro-batch 8: extrapolated from 2 and 4
    for a, b in ((0, 2), (1, 4), (2, 3)):
        q = p.span_quantities(a, b, "none", 1)
        np.testing.assert_allclose(q, linear(a, b, 8))
        assert p.stage_memory(a, b, "none", 1, 2) == pytest.approx(stage_peak(linear(a, b, 8)[:-1], "1f1b", 2, 4))


def test_first_backward_is_fitted_piecewise():
    """At micro-batch 2 the end of the first backward dominates (G - A + X), at 4 and beyond the start (TB)."""

    def fn(a, b, micro):
        v = linear(a, b, micro)
        v[INDEX["gradient"]] = 1000.0
        v[INDEX["activation"]] = 200.0 * micro
        x = 50.0 * micro
        v[INDEX["first_backward_transient"]] = max(v[INDEX["backward_transient"]], v[INDEX["gradient"]] - v[INDEX["activation"]] + x)
        return v

    stats = {("none", 1): [stats_at(2, 8, fn), stats_at(4, 16, fn)]}
    for target, micro in ((32, 8), (8, 2), (16, 4)):
        q = predictor(stats, global_batch_size=target).span_quantities(0, 2, "none", 1)
        assert q[INDEX["first_backward_transient"]] == pytest.approx(fn(0, 2, micro)[INDEX["first_backward_transient"]])


def test_a_first_backward_tying_the_later_one_is_kept_at_its_profiled_size():
    """At micro-batch 2 the end of the first backward dominates; at 4 the first backward equals the later one (TB),
    as a ZeRO-3 first backward equals its steady later backward. Predicted at 4, the first backward is the measured
    one: ``X`` has a part that does not grow with the batch, so a line through the origin from micro-batch 2 alone
    would give 1,640 at 4, not 1,000."""

    def fn(a, b, micro):
        v = linear(a, b, micro)
        v[INDEX["gradient"]] = 1000.0
        v[INDEX["activation"]] = 200.0 * micro
        v[INDEX["backward_transient"]] = 150.0 * micro + 400
        end = v[INDEX["gradient"]] - v[INDEX["activation"]] + 700.0 + 10 * micro
        v[INDEX["first_backward_transient"]] = max(v[INDEX["backward_transient"]], end)
        return v

    assert fn(0, 2, 4)[INDEX["first_backward_transient"]] == fn(0, 2, 4)[INDEX["backward_transient"]] == 1000
    stats = {("none", 1): [stats_at(2, 8, fn), stats_at(4, 16, fn)]}
    for target, micro in ((16, 4), (8, 2)):
        q = predictor(stats, global_batch_size=target).span_quantities(0, 2, "none", 1)
        assert q[INDEX["first_backward_transient"]] == pytest.approx(fn(0, 2, micro)[INDEX["first_backward_transient"]])


def test_degree_fits():
    stats = {
        ("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)],
        ("tensor", 2): [stats_at(2, 8, lambda a, b, m: linear(a, b, m, 2)), stats_at(4, 16, lambda a, b, m: linear(a, b, m, 2))],
        ("tensor", 4): [stats_at(2, 8, lambda a, b, m: linear(a, b, m, 4)), stats_at(4, 16, lambda a, b, m: linear(a, b, m, 4))],
    }
    p2, p4 = (predictor(stats).stage_memory(0, 4, "tensor", d, 0) for d in (2, 4))
    log8 = predictor(stats, degree_fit="log").stage_memory(0, 4, "tensor", 8, 0)
    assert log8 == pytest.approx(p2 + (p4 - p2) * math.log2(8 / 2))  # seed 000: logarithmic in the degree
    inv8 = predictor(stats, degree_fit="inverse").stage_memory(0, 4, "tensor", 8, 0)
    beta = (p2 - p4) / (1 / 2 - 1 / 4)
    assert inv8 == pytest.approx(p4 - beta / 4 + beta / 8)
    assert log8 < inv8 <= p4  # the log fit extrapolates the drop from 2 to 4 linearly in log d: lower
    assert not math.isfinite(predictor(stats).stage_memory(0, 4, "data", 2, 0))  # never profiled


def test_matrix_matches_scalar_calls():
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)],
             ("data", 2): [stats_at(2, 8, lambda a, b, m: linear(a, b, m, 2)), stats_at(4, 16, lambda a, b, m: linear(a, b, m, 2))]}
    p = predictor(stats)
    for kind, degree in (("none", 1), ("data", 2), ("tensor", 2)):
        for after in (0, 2, 9):
            m = p.stage_memory_matrix(kind, degree, after, L)
            for a in range(L):
                for b in range(a + 1, L + 1):
                    assert m[a, b] == pytest.approx(p.stage_memory(a, b, kind, degree, after)) or (
                        math.isinf(m[a, b]) and math.isinf(p.stage_memory(a, b, kind, degree, after))
                    )


def test_predict_plan_and_errors():
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    p = predictor(stats)
    plan = Plan("1f1b", 32, 4, (StagePlan(0, 1, "none", 1, (0,)), StagePlan(1, 4, "none", 1, (1,))))
    pred = p.predict(plan)
    assert [d.device for d in pred.devices] == [0, 1] and [d.in_flight for d in pred.devices] == [2, 1]
    assert pred.devices[0].peak_memory_bytes == round(stage_peak(linear(0, 1, 8)[:-1], "1f1b", 1, 4))
    # another schedule or batch than the predictor's own: predicted for the plan's
    gpipe = Plan("gpipe", 16, 4, plan.stages)
    assert p.predict(gpipe).devices[0].peak_memory_bytes == round(stage_peak(linear(0, 1, 4)[:-1], "gpipe", 1, 4))
    with pytest.raises(ProfileError, match="stage 1 .* cannot be predicted: the profile has no data2 statistics"):
        p.predict(Plan("1f1b", 32, 4, (StagePlan(0, 1, "none", 1, (0,)), StagePlan(1, 4, "data", 2, (1, 2)))))
    with pytest.raises(PlanError, match="model has 4 layers"):
        p.predict(Plan("1f1b", 32, 4, (StagePlan(0, 3, "none", 1, (0,)),)))
    with pytest.raises(ProfileError, match="unknown degree fit"):
        predictor(stats, degree_fit="cubic")


def test_quantity_names_cover_statistics():
    assert STATISTIC_QUANTITIES[: len(QUANTITIES)] == QUANTITIES and STATISTIC_QUANTITIES[-1] == "peak"


def test_stages_the_profile_did_not_measure_in_kind_are_refused():
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)], ("data", 2): [
        stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    plain = predictor(stats)
    zero = Plan("1f1b", 32, 4, (StagePlan(0, 2, "data", 2, (0, 1), zero=1), StagePlan(2, 4, "none", 1, (2,))))
    with pytest.raises(ProfileError, match="stage 0 .* the profile does not record the parameter shapes ZeRO shards"):
        plain.predict(zero)
    recompute = Plan("1f1b", 32, 4, (StagePlan(0, 1, "none", 1, (0,), recompute="full"), StagePlan(1, 4, "none", 1, (1,))))
    with pytest.raises(ProfileError, match="recomputes its activations; the profile was taken without recompute"):
        plain.predict(recompute)
    # a profile taken with recompute predicts every stage as its runs ran: recomputed
    assert predictor(stats, recompute=True).predict(recompute).devices[0].peak_memory_bytes > 0


def test_a_cuda_profile_predicts_the_memory_outside_the_allocator_and_the_total():
    """[Note: predicting a CUDA device]: the tensor peak as from a CPU profile; outside the allocator the H100's
    measured context (618.8 MiB) and libraries (66 + 16 + 2 MiB), plus 562 MiB per NCCL communicator."""
    stats = {("none", 1): [stats_at(2, 8, linear), stats_at(4, 16, linear)]}
    plan = Plan("1f1b", 32, 4, (StagePlan(0, 1, "none", 1, (0,)), StagePlan(1, 4, "none", 1, (1,))))
    cpu = predictor(stats).predict(plan).devices
    cuda = predictor(stats, device_type="cuda").predict(plan).devices
    mib = 2**20
    floor = round(618.8 * mib) + 84 * mib
    # two devices: the world (its barriers) and the pair of the stage boundary
    for c, g in zip(cpu, cuda):
        assert c.overhead_bytes is None and c.total_bytes is None and c.needed_bytes == c.peak_memory_bytes
        assert g.peak_memory_bytes == c.peak_memory_bytes and g.reserved_peak_bytes is None
        assert g.overhead_bytes == floor + 2 * 562 * mib and g.total_bytes == g.needed_bytes == g.peak_memory_bytes + g.overhead_bytes
    one = Plan("1f1b", 32, 4, (StagePlan(0, 4, "none", 1, (0,)),))  # one device: no communicator
    assert predictor(stats, device_type="cuda").predict(one).devices[0].overhead_bytes == floor
    assert predictor(stats, device_type="cuda").retargeted(global_batch_size=16).device_type == "cuda"


# gpt-tiny's last layer alone (final norm + LM head, then the loss), recomputed, as data x2 on simulated devices:
# its measured statistics at micro-batches 4 and 8 (2 and 4 rows per replica; benchmarks/extended_accuracy's
# recompute profile), over STATISTIC_QUANTITIES.
HEAD_ALONE = {
    4: [99_852, 1_024, 24_580, 33_280, 40_972, 49_408, 49_408, 65_792, 208_144],
    8: [99_852, 2_048, 49_156, 33_280, 81_932, 66_048, 66_048, 65_792, 250_384],
}
GPT_TINY_LOSS = {"samples": [1, 2], "bytes": [16_384, 32_768]}  # profiling/loss_memory.py, gpt-tiny


def head_predictor(schedule: str, loss_backward) -> MemoryPredictor:
    stats = []
    for micro, values in HEAD_ALONE.items():
        s = SpanStatistics(num_layers=1, microbatch_size=micro, batch_size=4 * micro)
        s.spans[(0, 1)] = np.array(values, dtype=float)
        stats.append(s)
    return MemoryPredictor({("data", 2): stats}, num_layers=1, schedule=schedule, global_batch_size=64,
                           num_microbatches=4, recompute=True, loss_backward=loss_backward)


@pytest.mark.parametrize("schedule, measured, scaled", [("1f1b", 366_608, 334_864), ("gpipe", 628_252, 596_508)])
def test_the_loss_floors_the_backward_of_a_stage_that_ends_the_model(schedule, measured, scaled):
    """[Note: the loss's backward floor]: at 8 rows per replica the loss's backward (131,072 = 8 x 16,384) sets the
    stage's backward, where both profiled sizes saw the head's phase (32,768 + 8,320 x rows: 49,408 and 66,048),
    whose line gives 99,328. ``measured``: the device's peak in ``hybridplan run --backend sim`` (gpt-tiny on 1x3,
    global batch 64 in 4 micro-batches: layers 0-9 pipeline-only, then layer 9 recomputed as data x2; the same
    bytes as benchmarks/extended_accuracy's gpt-tiny/1f1b/10 device 6); ``scaled``: the line's peak, 131,072 -
    99,328 = 31,744 bytes lower (that benchmark's prediction before the floor, -8.66% under 1F1B, -5.05% GPipe)."""
    p = head_predictor(schedule, GPT_TINY_LOSS)
    q = p.span_quantities(0, 1, "data", 2)
    assert q[INDEX["backward_transient"]] == q[INDEX["first_backward_transient"]] == 131_072
    assert p.stage_memory(0, 1, "data", 2, 0) == measured
    assert p.stage_memory_matrix("data", 2, 0, 1)[0, 1] == measured  # the search's table agrees
    assert head_predictor(schedule, None).stage_memory(0, 1, "data", 2, 0) == scaled  # a profile without it
    assert scaled == measured - (131_072 - 99_328)


def backward_of(rows: float) -> float:
    """A later backward transient that changes regime with the rows: a fixed part and a part per row, then a steeper
    part per row (the MoE layer's and the head's, in bytes of no model)."""
    return max(1000.0 + 10.0 * rows, 300.0 * rows)


def replica(degree: int):
    """A span's statistics on ``degree`` replicas at micro-batch ``micro``: what a pipeline-only device holds on
    ``micro / degree`` rows, with a step of its own (the gradient all-reduce) that must not be replaced."""

    def fn(a, b, micro):
        rows = micro / degree
        v = linear(a, b, rows)
        v[INDEX["data"]] = 8 * micro * 4 / degree if a == 0 else 0
        v[INDEX["first_backward_transient"]] = v[INDEX["backward_transient"]] = backward_of(rows)
        v[INDEX["step_transient"]] = 10 * (b - a) + (5 if degree > 1 else 0)
        return v

    return fn


@pytest.mark.parametrize("degree, global_batch, rows, line", [
    (2, 64, 8, 1_560.0),  # data x2 at micro-batches 4, 8 sees 2 and 4 rows: 1,020 and 1,200; the line at 8
    (4, 64, 4, 1_040.0),  # data x4 sees 1 and 2 rows: 1,010 and 1,020; the line at 4
])
def test_a_data_replica_takes_its_rows_from_the_pipeline_scenario(degree, global_batch, rows, line):
    """[Note: a data replica's rows were profiled]: the pipeline scenario profiled micro-batches 4 and 8, the rows of
    a data x2 and a data x4 replica at micro-batch 16; there the replica's later backward is the regime the data
    scenario's line misses (``line``, by hand), and its static bytes, data share and step stay its own."""
    stats = {("none", 1): [stats_at(4, 16, replica(1)), stats_at(8, 32, replica(1))],
             ("data", degree): [stats_at(4, 16, replica(degree)), stats_at(8, 32, replica(degree))]}
    p = predictor(stats, global_batch_size=global_batch)
    for a, b in ((0, 2), (1, 4)):
        q = p.span_quantities(a, b, "data", degree)
        expected = replica(degree)(a, b, 16)
        assert q[INDEX["backward_transient"]] == q[INDEX["first_backward_transient"]] == backward_of(rows) != line
        np.testing.assert_allclose(q[:-1], expected[:-1])  # every quantity, the data share and step included
        table = p.stage_memory_matrix("data", degree, 1, L)
        assert table[a, b] == p.stage_memory(a, b, "data", degree, 1)  # the search's table agrees


def test_rows_the_pipeline_scenario_did_not_profile_keep_the_line():
    """At micro-batch 12 a data x2 replica has 6 rows, which no scenario measured: the data scenario's line through
    2 and 4 rows (1,020 and 1,200) gives 1,020 + 90 x 4 = 1,380."""
    stats = {("none", 1): [stats_at(4, 16, replica(1)), stats_at(8, 32, replica(1))],
             ("data", 2): [stats_at(4, 16, replica(2)), stats_at(8, 32, replica(2))]}
    q = predictor(stats, global_batch_size=48).span_quantities(0, 2, "data", 2)
    assert q[INDEX["backward_transient"]] == 1_380.0
