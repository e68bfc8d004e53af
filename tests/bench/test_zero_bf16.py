"""benchmarks/zero_bf16: the stages it measures are valid plans that cover the model, and its table counts what
it is given (the measurements themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import sys

import pytest

from benchmarks.zero_bf16.run import main, plan_of, table


@pytest.mark.parametrize(("kind", "span", "kinds"), [
    ("data+tensor", (1, 3), ["none", "data+tensor", "none"]),
    ("data", (0, 4), ["data", "none"]),
])
def test_a_span_becomes_a_sharded_stage_between_pipeline_only_stages(kind, span, kinds):
    plan = plan_of("gpt-tiny", 10, kind, 3, span, "gpipe")
    assert [s.kind for s in plan.stages] == kinds
    assert [(s.start, s.stop) for s in plan.stages][0][0] == 0 and plan.stages[-1].stop == 10
    sharded = next(s for s in plan.stages if s.zero)
    assert (sharded.start, sharded.stop, sharded.zero) == (*span, 3)
    assert sharded.degree == (4 if kind == "data+tensor" else 2)
    # every device once, in order
    assert [d for s in plan.stages for d in s.devices] == list(range(plan.num_devices))
    assert (plan.global_batch_size, plan.num_microbatches) == (64, 4)


def test_the_table_counts_exact_close_and_refused_stages():
    done = [{"model": "m", "kind": "data", "zero": 2, "errors": [0.0, 0.01]},
            {"model": "m", "kind": "data", "zero": 2, "errors": [-0.03, 0.0]},
            {"model": "m", "kind": "data+tensor", "zero": 3, "errors": None}]
    text = table(done)
    assert "| m | data | 2 | 2 | 4 | 2 | 3 | -3.00% .. +1.00% |" in text
    assert "| m | data+tensor | 3 | 1 | refused |" in text
    assert "all predicted devices: 4, exact 2, within 2% 3 (75.0%), within 5% 4, low 1, largest |error| 3.00%" in text


@pytest.mark.parametrize("argv", [["--spans", "3-2"], ["--zero", "1"], ["--kinds", "tensor"], ["--models", "vgg"],
                                  ["--spans", "a-b"]])
def test_bad_arguments_are_refused_before_any_run(monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", ["run"] + argv)
    with pytest.raises(SystemExit) as e:
        main()
    assert isinstance(e.value.code, str)  # a message, not a traceback or a bare exit status
