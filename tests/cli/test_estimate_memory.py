"""``hybridplan estimate-memory`` as a user calls it, on the MLP user model (``files``: tests/cli/conftest.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.cli import main
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.sim import simulate
from tests.cli.conftest import MIXED, MLP
from tests.cli.user_models import mlp


def test_a_plan(files, capsys):
    assert main(["estimate-memory", "--model", MLP, "--cluster", "1x4", "--plan", str(files / "plan.json"), "--json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    reference = simulate(RunConfig(model=MLP, plan=Plan.from_dict(MIXED), cluster=Cluster.parse("1x4"), iterations=2,
                                   backend="sim"))
    assert [d["peak_memory_bytes"] for d in data["estimates"][0]["devices"]] == \
        [d.peak_memory_bytes for d in reference.devices]
    assert "simulated stage" in out.err and "fake tensors" in data["note"]


def test_the_best_plans(tmp_path, capsys):
    best = tmp_path / "best.json"
    assert main(["estimate-memory", "--model", MLP, "--cluster", "1x4", "--global-batch-size", "16",
                 "--num-microbatches", "2", "--top", "2", "--out", str(best)]) == 0
    out = capsys.readouterr().out
    assert "#1 of 5" in out and "#2 of 5" in out and "#3" not in out
    data = json.loads(best.read_text())
    assert data["estimated_peak_bytes"] > 0 and Plan.from_dict(data).num_devices == 4


def test_bad_input_exits_2(files, tmp_path, capsys):
    plan = str(files / "plan.json")
    cases = [
        (["--cluster", "1x4"], "needs --global-batch-size and --num-microbatches"),
        (["--cluster", "1x4", "--plan", plan, "--global-batch-size", "8"], "differs from the plan's 32"),
        (["--cluster", "1x4", "--plan", plan, "--top", "2"], "not allowed with argument --plan"),
        (["--cluster", "1x4", "--plan", plan, "--out", str(tmp_path / "no" / "x.json")], "cannot be written"),
        (["--cluster", "1x3", "--plan", plan], "device 3 does not exist"),
    ]
    for args, message in cases:
        assert main(["estimate-memory", "--model", MLP] + args) == 2, args
        assert message in capsys.readouterr().err, args


# ---------------------------------------------------------------------------------------------- --engine
ACTIVATION_BOUND = {"schedule": "1f1b", "global_batch_size": 2048, "num_microbatches": 4, "stages": [
    {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
    {"layers": [2, 3], "parallelism": "none", "degree": 1, "devices": [2]},
    {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [3]}]}
"""A plan of the MLP whose every device peaks in a backward, after every parameter of its stage has a gradient:
512-row micro-batches, whose activations outweigh the MLP's 1,930 parameters."""


def _estimate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["estimate-memory", "--model", MLP, "--cluster", "1x4", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _peaks(stdout: str) -> list[int]:
    return [d["peak_memory_bytes"] for d in json.loads(stdout)["estimates"][0]["devices"]]


def test_engine_hybridplan_is_the_default(files, capsys):
    plan = str(files / "plan.json")
    for more in (["--json"], []):
        outputs = [_estimate(capsys, "--plan", plan, "--precision", "bf16", *more, *engine)[1]
                   for engine in ([], ["--engine", "hybridplan"])]
        if more:
            outputs = [json.dumps({**json.loads(o), "seconds": None}) for o in outputs]
        else:  # the last line starts with the seconds taken
            outputs = [o.rstrip().rsplit("\n", 1)[0] for o in outputs]
        assert outputs[0] == outputs[1] and "engine" not in outputs[0]


@pytest.mark.parametrize("precision, gain", [("bf16", 2), ("fp32", 0)])
def test_megatron_engine_simulates_fp32_gradient_buffers(tmp_path, capsys, precision, gain):
    """--engine megatron simulates the plan with the runtime's fp32 gradient buffers (runtime/grad_buffers.py), as
    Megatron-LM holds them. A 4-byte buffer per parameter is held all the time (the memory between iterations grows by
    exactly 4 bytes per parameter), but autograd's own gradient, in the parameter's dtype, goes: after the first
    backward a device holds 4 bytes where it held 2 in bf16 (Megatron's 18 bytes per parameter against ZeRO's 16,
    docs/engines.md) and 4 where it held 4 in fp32. Every device of ACTIVATION_BOUND peaks after its stage's first
    backward, so its peak grows by exactly ``gain`` bytes per parameter of its stage, counted here on the MLP's own
    layers. Tolerance 0: on CPU devices the simulator counts exact tensor bytes (no allocator rounds them).
    """
    (tmp_path / "plan.json").write_text(json.dumps(ACTIVATION_BOUND))
    args = ["--plan", str(tmp_path / "plan.json"), "--precision", precision, "--json"]
    hybridplan = _peaks(_estimate(capsys, *args)[1])
    code, out, _ = _estimate(capsys, *args, "--engine", "megatron")
    assert code == 0 and json.loads(out)["engine"] == "megatron"
    layers = list(mlp())
    plan = Plan.from_dict(ACTIVATION_BOUND)
    held = [sum(p.numel() for layer in layers[s.start:s.stop] for p in layer.parameters())
            for s in plan.stages for _ in s.devices]
    assert held == [544, 544, 1056, 330]
    assert _peaks(out) == [peak + gain * n for peak, n in zip(hybridplan, held)]
    # and the memory between iterations: the 4 bytes per parameter, on the simulations the estimate comes from
    static = [[d.static_memory_bytes for d in simulate(RunConfig(
        model=MLP, plan=plan, cluster=Cluster.parse("1x4"), iterations=2, backend="sim", precision=precision,
        grad_accumulation=g)).devices] for g in ("autograd", "fp32-buffer")]
    assert [b - a for a, b in zip(*static)] == [4 * n for n in held]


def test_megatron_engine_table_names_it_and_skips_what_it_does_not_model(capsys):
    code, out, err = _estimate(capsys, "--global-batch-size", "16", "--num-microbatches", "2", "--top", "5",
                               "--precision", "bf16", "--engine", "megatron")
    assert code == 0
    assert out.count("engine: megatron: hybridplan's runtime run with grad_accumulation='fp32-buffer'") == 1
    # of the 5 uniform plans (test_the_best_plans), the 2 whose last stage is tensor-parallel are skipped
    skipped = [line for line in err.splitlines() if line.startswith("note: skipped the uniform plan")]
    assert len(skipped) == 2 and all("last stage" in line and "tensor-parallel" in line for line in skipped)
    assert "#1 of 3" in out and "#4" not in out


def test_engines_not_modelled_exit_2_with_the_reason(files, capsys):
    plan = str(files / "plan.json")
    cases = [
        (["--plan", plan, "--engine", "deepspeed"], "the deepspeed engine's memory is not modelled yet", "engines"),
        (["--plan", plan, "--engine", "torchtitan"], "is not FSDP-sharded: torchtitan wraps every stage in FSDP2",
         "engines"),
        (["--plan", plan, "--engine", "megatron", "--precision", "fp16"], "Megatron-LM's fp16 training", "engines"),
        (["--global-batch-size", "16", "--num-microbatches", "2", "--engine", "deepspeed"],
         f"no uniform plan of {MLP} is modelled for --engine deepspeed: the deepspeed engine's memory", "engines"),
        (["--global-batch-size", "16", "--num-microbatches", "2", "--engine", "megatron", "--schedule", "gpipe"],
         "is modelled for --engine megatron: the plan's schedule is gpipe: Megatron-LM runs 1F1B", "export"),
    ]
    for args, message, doc in cases:
        code, out, err = _estimate(capsys, *args)
        assert code == 2 and message in err and f"docs/{doc}.md" in err.splitlines()[-2], args
        assert "\n  fix: " in err and "Traceback" not in err and out == "", args
    code, _, err = _estimate(capsys, "--plan", plan, "--engine", "nemo")
    assert code == 2 and "invalid choice: 'nemo'" in err


def test_the_cache_keeps_each_engines_stages(files, tmp_path, capsys):
    """One --cache file asked for hybridplan, then megatron, then hybridplan: each answer is the one without a cache."""
    plan, cache = str(files / "plan.json"), str(tmp_path / "stages.json")
    fresh = {e: _peaks(_estimate(capsys, "--plan", plan, "--precision", "bf16", "--json", "--engine", e)[1])
             for e in ("hybridplan", "megatron")}
    assert fresh["hybridplan"] != fresh["megatron"]
    for engine in ("hybridplan", "megatron", "hybridplan", "megatron"):
        code, out, err = _estimate(capsys, "--plan", plan, "--precision", "bf16", "--json", "--engine", engine,
                                   "--cache", cache)
        assert code == 0 and _peaks(out) == fresh[engine], engine
    keys = set(json.loads((tmp_path / "stages.json").read_text())) - {"model"}
    assert len(keys) == 6 and sum("grad_accumulation=\"fp32-buffer\"" in k for k in keys) == 3
