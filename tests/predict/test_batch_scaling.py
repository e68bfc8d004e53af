"""predict/batch_scaling.py's loss floor ([Note: the loss's backward floor] in profiling/loss_memory.py) and a data
replica's rows from the pipeline scenario ([Note: a data replica's rows were profiled]), by hand."""

from __future__ import annotations

import numpy as np

from hybridplan.predict.batch_scaling import loss_floor, with_replica_rows
from hybridplan.profiling.quantities import INDEX, QUANTITIES

LOSS = {"samples": [1, 2], "bytes": [16_384, 32_768]}  # gpt-tiny's cross-entropy: 2 x 8,192 bytes of logits a row
FBT, BT = INDEX["first_backward_transient"], INDEX["backward_transient"]


def vector(backward: float) -> np.ndarray:
    v = np.arange(len(QUANTITIES) + 1, dtype=float)  # every other statistic distinct, to see it kept
    v[FBT] = v[BT] = backward
    return v


def test_a_backward_below_the_loss_is_raised_to_it_and_nothing_else_moves():
    v = vector(99_328.0)  # the head's phase at 8 rows: 32,768 + 8,320 x 8
    out = loss_floor(v, LOSS, 8)
    assert out[FBT] == out[BT] == 8 * 16_384
    keep = [i for i in range(len(v)) if i not in (FBT, BT)]
    np.testing.assert_array_equal(out[keep], v[keep])
    assert v[BT] == 99_328.0  # the input is not modified


def test_a_backward_above_the_loss_and_an_unknown_one_are_kept():
    table = np.stack([vector(49_408.0), vector(np.nan)])  # the head's phase at 2 rows: above 2 x 16,384
    out = loss_floor(table, LOSS, 2)
    assert out[0, BT] == 49_408.0 and np.isnan(out[1, BT]) and np.isnan(out[1, FBT])


def test_the_loss_is_a_line_through_its_two_measured_sizes():
    """A loss with a fixed part (100 bytes) besides its per-row part: 100 + 50 x rows."""
    out = loss_floor(vector(0.0), {"samples": [2, 4], "bytes": [200, 300]}, 10)
    assert out[BT] == 600


def test_a_profile_without_the_measurement_is_left_as_scaled():
    v = vector(99_328.0)
    np.testing.assert_array_equal(loss_floor(v, None, 8), v)


def test_a_replicas_per_row_bytes_come_from_the_pipeline_scenario_and_the_rest_stays():
    """[Note: a data replica's rows were profiled]: activation, forward and later backward from the pipeline
    scenario at the replica's rows; the first backward at least the later one; a NaN there keeps the scaled value."""
    scaled = np.arange(len(QUANTITIES) + 1, dtype=float) * 10
    pipeline = np.full_like(scaled, 7.0)
    pipeline[INDEX["forward_transient"]] = np.nan  # a span the pipeline scenario cannot say
    pipeline[BT] = 1_000.0
    out = with_replica_rows(scaled, pipeline)
    assert out[INDEX["activation"]] == 7.0 and out[BT] == 1_000.0
    assert out[INDEX["forward_transient"]] == scaled[INDEX["forward_transient"]]
    assert out[FBT] == 1_000.0  # was 50: below the later backward it starts as
    for name in ("static", "data", "gradient", "step_transient"):
        assert out[INDEX[name]] == scaled[INDEX[name]]
