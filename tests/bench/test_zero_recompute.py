"""benchmarks/zero_recompute: the stages it measures are valid recomputed ZeRO data x tensor stages that leave the
model's last layer to a pipeline-only stage, and bad arguments are refused before any run (the measurements
themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import sys

import pytest

from benchmarks.zero_recompute.run import SPANS, main, recomputed_plan


@pytest.mark.parametrize("span", [(0, 3), (1, 5)])
@pytest.mark.parametrize("zero", [2, 3])
def test_a_span_becomes_a_recomputed_sharded_data_tensor_stage(span, zero):
    plan = recomputed_plan("gpt-tiny", 10, zero, span, "1f1b")
    sharded = [s for s in plan.stages if s.zero]
    assert len(sharded) == 1
    stage = sharded[0]
    assert (stage.start, stage.stop, stage.zero, stage.kind, stage.tensor_degree) == (*span, zero, "data+tensor", 2)
    assert stage.recompute == "full"
    assert all(s.recompute != "full" for s in plan.stages if not s.zero)  # only the sharded stage recomputes
    assert plan.stages[-1].stop == 10 and plan.stages[-1].kind == "none"


def test_no_span_holds_the_last_layer():
    last = {"gpt-tiny": 10, "wresnet-tiny": 7, "moe-tiny": 6}
    for model, spans in SPANS.items():
        assert all(b < last.get(model, 5) for _, b in spans), model


@pytest.mark.parametrize("argv", [["--zero", "1"], ["--zero", "x"], ["--precisions", "fp8"], ["--models", "vgg"]])
def test_bad_arguments_are_refused_before_any_run(monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", ["run"] + argv)
    with pytest.raises(SystemExit) as e:
        main()
    assert isinstance(e.value.code, str)  # a message, not a traceback or a bare exit status


def test_a_wider_data_degree_keeps_every_device_once():
    plan = recomputed_plan("gpt-tiny", 10, 3, (1, 5), "gpipe", data=4)
    stage = next(s for s in plan.stages if s.zero)
    assert (stage.degree, stage.tensor_degree, stage.data_degree) == (8, 2, 4)
    assert [d for s in plan.stages for d in s.devices] == list(range(plan.num_devices)) and plan.num_devices == 10
