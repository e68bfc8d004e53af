"""Malformed and absurd input, generated (issue 32): plans, HF config.json files and command-line numbers.

Each example runs the real command line in this process (``hybridplan.cli.main``) on a command that stops at its
checks, and must be answered at once with exit code 2, one error line and one fix line, no traceback, caught by a
check of ours (not by the guard that turns Python's own RecursionError or OverflowError into a usage error), and
nothing written to ``--out``. Each generator makes only inputs that must be refused (a field set to a value outside
what it allows), so that every example can fail the test.

60 examples per test, the same every run; ``HYBRIDPLAN_FUZZ_EXAMPLES=400`` draws that many new ones (a longer search).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridplan.cli import main
from hybridplan.models.hf_config import HF_CONFIGS
from tests.paths import GPT_PLAN

FUZZ = settings(max_examples=int(os.environ.get("HYBRIDPLAN_FUZZ_EXAMPLES", 60)), deadline=timedelta(seconds=3),
                derandomize=not os.environ.get("HYBRIDPLAN_FUZZ_EXAMPLES"), database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

DEEP = "[" * 200_000
"""Nested deeper than any JSON reader recurses."""


def _huge_digits(draw: st.DrawFn) -> str:
    """An integer literal of more digits than Python converts (4,300), as raw JSON."""
    return "9" * draw(st.integers(4301, 6000))


_RAW = object()  # marks a value written as raw JSON text (deep nesting, huge digits)

BAD_COUNTS = st.one_of(st.integers(max_value=0), st.integers(min_value=2**30 + 1, max_value=10**40),
                       st.booleans(), st.none(), st.floats(allow_nan=True), st.text(max_size=20),
                       st.lists(st.integers(), max_size=3))
"""Values no count of a plan or config allows (below 1, beyond every bound: the largest is a config's 2**30 positions,
or not an integer)."""


@st.composite
def _bad_value(draw: st.DrawFn, plain: st.SearchStrategy[Any]) -> Any:
    """A bad value: from ``plain``, or raw JSON text nested too deep or of too many digits."""
    kind = draw(st.sampled_from(["plain", "plain", "plain", "deep", "digits"]))
    if kind == "deep":
        return (_RAW, DEEP + "]" * 200_000)
    if kind == "digits":
        return (_RAW, _huge_digits(draw))
    return draw(plain)


def _dump(data: Any) -> str:
    """JSON text of ``data`` with every ``(_RAW, text)`` value written as its raw text."""
    raws: list[str] = []

    def walk(value: Any) -> Any:
        if isinstance(value, tuple) and value and value[0] is _RAW:
            raws.append(value[1])
            return f"@RAW{len(raws) - 1}@"
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    text = json.dumps(walk(data))
    for i, raw in enumerate(raws):
        text = text.replace(f'"@RAW{i}@"', raw)
    return text


@st.composite
def bad_plans(draw: st.DrawFn) -> str:
    """The GPT plan of tests/paths.py with one field made impossible."""
    plan = json.loads(json.dumps(GPT_PLAN))
    stage = plan["stages"][draw(st.integers(0, len(plan["stages"]) - 1))]
    where = draw(st.sampled_from(["global_batch_size", "num_microbatches", "degree", "tensor_degree", "layers",
                                  "devices", "unknown", "zero", "whole"]))
    if where in ("global_batch_size", "num_microbatches"):
        plan[where] = draw(_bad_value(BAD_COUNTS if where == "global_batch_size"
                                      else st.one_of(BAD_COUNTS, st.integers(2**16 + 1, 2**24))))
    elif where in ("degree", "tensor_degree"):
        stage[where] = draw(_bad_value(BAD_COUNTS))
    elif where == "layers":
        stage["layers"] = draw(_bad_value(st.one_of(
            st.lists(st.integers(0, 10), max_size=1), st.lists(st.integers(0, 10), min_size=3, max_size=4),
            st.tuples(st.integers(0, 10), st.integers(min_value=2**20 + 1)).map(list),
            st.tuples(st.integers(max_value=-1), st.integers(0, 10)).map(list), st.text(max_size=5))))
    elif where == "devices":
        stage["devices"] = draw(_bad_value(st.one_of(
            st.lists(st.integers(min_value=2**20), min_size=1, max_size=3), st.lists(st.integers(max_value=-1),
                                                                                   min_size=1, max_size=3),
            st.text(max_size=5), st.integers())))
    elif where == "unknown":
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: not k.startswith("x-") and k not in (
            "layers", "parallelism", "degree", "devices", "tensor_degree", "zero", "recompute")))
        stage[key] = draw(st.one_of(st.integers(), st.text(max_size=5)))
    elif where == "zero":
        stage["zero"] = draw(_bad_value(st.one_of(st.integers(min_value=4), st.integers(max_value=-1), st.booleans(),
                                                  st.text(max_size=3))))
    else:
        return draw(st.sampled_from([DEEP, "[]", "{}", "null", '{"schedule": ' + "9" * 5000 + "}"]))
    return _dump(plan)


@st.composite
def bad_configs(draw: st.DrawFn) -> str:
    """A shipped tiny config.json with one size made impossible (or an inconsistent pair)."""
    name = draw(st.sampled_from(["llama-tiny", "mixtral-tiny", "gpt2-tiny"]))
    config = dict(HF_CONFIGS[name])
    sizes = (["vocab_size", "n_embd", "n_layer", "n_head", "n_positions"] if name == "gpt2-tiny" else
             ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings"])
    if name == "mixtral-tiny":
        sizes += ["num_local_experts", "num_experts_per_tok"]
    what = draw(st.sampled_from(["size", "size", "heads", "experts", "deep"]))
    if what == "heads":  # a head count that does not divide the hidden size of 32
        config["n_head" if name == "gpt2-tiny" else "num_attention_heads"] = draw(
            st.integers(1, 31).filter(lambda h: 32 % h))
    elif what == "experts" and name == "mixtral-tiny":  # more experts per token than experts
        config["num_experts_per_tok"] = draw(st.integers(config["num_local_experts"] + 1, 10**6))
    elif what == "deep":
        return DEEP
    else:
        config[draw(st.sampled_from(sizes))] = draw(_bad_value(BAD_COUNTS))
    return _dump(config)


BAD_BYTES = st.one_of(
    st.integers(400, 10**6).map(lambda e: f"1e{e}TB"), st.sampled_from(["inf", "nan", "-1GB", "1e400B", "0", "lots",
                                                                       "9" * 5000 + "GB", "2PiB", "80 GB/s"]),
    st.floats(min_value=2**50 + 1e12, allow_infinity=True, allow_nan=False).map(lambda v: f"{v}B"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Where each example writes its input (the same folder for every example of a test: ``--out`` never appears)."""
    return tmp_path


def _refused(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run ``argv`` and check the answer of the module docstring."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # pragma: no cover - main returns its code; kept so that a change shows as a failure
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    lines = captured.err.rstrip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("hybridplan") and ": error:" in line), None)
    assert code == 2 and first is not None, (argv[:8], captured.err[-2000:])
    error = lines[first:]
    assert len(error) == 2 and error[1].startswith("  fix: "), error
    assert len(captured.err) < 2000, captured.err[:300]  # no value printed whole
    assert "Traceback" not in captured.err + captured.out
    assert "too large or too deeply nested to handle" not in error[0], error  # a check of ours caught it
    assert "unexpected error" not in error[0], error
    assert not out.exists(), "something was written to --out"


@FUZZ
@given(text=bad_plans(), command=st.sampled_from(["export", "estimate-memory"]))
def test_bad_plans_are_refused_at_once(text: str, command: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, out = folder / "plan.json", folder / "out.txt"
    plan.write_text(text)
    argv = (["export", "--plan", str(plan), "--to", "megatron", "--out", str(out)] if command == "export" else
            ["estimate-memory", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(plan), "--out", str(out)])
    _refused(argv, out, capsys)


@FUZZ
@given(text=bad_configs())
def test_bad_hf_configs_are_refused_at_once(text: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, out = folder / "config.json", folder / "best.json"
    config.write_text(text)
    _refused(["estimate-memory", "--model", f"hf:{config}", "--cluster", "1x4", "--global-batch-size", "8",
              "--num-microbatches", "2", "--out", str(out)], out, capsys)


@FUZZ
@given(which=st.sampled_from(["--global-batch-size", "--num-microbatches", "--device-memory"]),
       count=st.one_of(st.integers(min_value=2**24 + 1, max_value=10**30), st.integers(max_value=0),
                       st.integers(4301, 6000).map(lambda n: "9" * n), st.sampled_from(["1e21", "1.5", "inf", "x"])),
       size=BAD_BYTES)
def test_absurd_numbers_are_refused_at_once(which: str, count: int | str, size: str, folder: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = folder / "best.json"
    values = {"--global-batch-size": "32", "--num-microbatches": "2", "--device-memory": "80GB"}
    values[which] = size if which == "--device-memory" else str(count)
    argv = ["estimate-memory", "--model", "gpt-tiny", "--cluster", "1x4", "--out", str(out)]
    for option, value in values.items():
        argv.append(f"{option}={value}")
    _refused(argv, out, capsys)
