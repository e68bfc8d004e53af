"""``hybridplan export`` as a user calls it: files written, the nearest plan offered and saved, bad input refused
(exit 2). The files themselves are checked by the engines in tests/workflows/export."""

from __future__ import annotations

import json

from hybridplan.cli import main
from hybridplan.plan import Plan

MIXED_GPT = {"schedule": "gpipe", "global_batch_size": 32, "num_microbatches": 8, "stages": [
    {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
    {"layers": [3, 7], "parallelism": "data", "degree": 2, "devices": [2, 3]},
    {"layers": [7, 10], "parallelism": "data", "degree": 2, "devices": [4, 5], "recompute": "full"}]}


def test_megatron_arguments_to_a_file(tmp_path, capsys):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({**MIXED_GPT, "schedule": "1f1b", "stages": [
        {**s, "parallelism": "data", "recompute": "none"} for s in MIXED_GPT["stages"]]}))
    assert main(["export", "--plan", str(plan), "--to", "megatron", "--out", str(tmp_path / "args.txt")]) == 0
    lines = (tmp_path / "args.txt").read_text().splitlines()
    assert "--pipeline-model-parallel-size 3" in lines and "--decoder-first-pipeline-num-layers 2" in lines
    assert "--micro-batch-size 2" in lines and "--global-batch-size 32" in lines


def test_a_plan_the_engine_cannot_run_names_the_nearest(tmp_path, capsys):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(MIXED_GPT))
    assert main(["export", "--plan", str(plan), "--to", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "deepspeed cannot run this plan" in err and "gpipe -> 1f1b" in err and "--nearest" in err
    assert "stage 2: layers [7, 10) data x2 recompute full" in err  # the nearest plan, printed
    near = tmp_path / "near.json"
    out = tmp_path / "ds.json"
    assert main(["export", "--plan", str(plan), "--to", "deepspeed", "--nearest", "--nearest-plan", str(near),
                 "--out", str(out)]) == 0
    saved = Plan.load(near)
    assert [(s.data_degree, s.tensor_degree, s.recompute) for s in saved.stages] == [(2, 1, "full")] * 3
    config = json.loads(out.read_text())
    assert config["hybridplan"]["pipeline_module"]["parts"] == [0, 3, 7, 10]
    assert config["pipeline"]["activation_checkpoint_interval"] == 1


def test_bad_input_exits_2(tmp_path, capsys):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(MIXED_GPT))
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "tp8.json").write_text(json.dumps({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 1,
        "stages": [{"layers": [0, 10], "parallelism": "tensor", "degree": 8, "devices": list(range(8))}]}))
    cases = [
        (["--plan", str(plan), "--to", "jax"], "invalid choice: 'jax'"),
        (["--plan", str(tmp_path / "bad.json"), "--to", "megatron"], "is not valid JSON"),
        (["--plan", str(plan), "--to", "megatron", "--model", "wresnet-tiny"], "wresnet-tiny has 7"),
        (["--plan", str(plan), "--to", "megatron", "--nearest", "--out", str(tmp_path / "no" / "a.txt")], "cannot be written"),
        (["--plan", str(plan), "--to", "megatron", "--nearest-plan", str(tmp_path / "n.json")], "add --nearest"),
        # gpt-tiny's 4 heads do not split 8 ways (checked against the model when it is named)
        (["--plan", str(tmp_path / "tp8.json"), "--to", "megatron", "--model", "gpt-tiny"], "at degree 8"),
    ]
    for args, message in cases:
        assert main(["export"] + args) == 2, args
        assert message in capsys.readouterr().err, args


def test_the_nearest_grid_splits_the_named_model(tmp_path, capsys):
    """gpt-tiny's width 64 does not split 3 ways: the nearest grid of 3 devices per stage is passed over."""
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"schedule": "1f1b", "global_batch_size": 16, "num_microbatches": 4, "stages": [
        {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 10], "parallelism": "tensor", "degree": 4, "devices": [2, 3, 4, 5]}]}))
    near = tmp_path / "near.json"
    assert main(["export", "--plan", str(plan), "--to", "megatron", "--nearest", "--nearest-plan", str(near)]) == 0
    assert {s.tensor_degree for s in Plan.load(near).stages} == {3}  # no model named: the closest grid
    assert main(["export", "--plan", str(plan), "--to", "megatron", "--model", "gpt-tiny", "--nearest",
                 "--nearest-plan", str(near)]) == 0
    assert {s.tensor_degree for s in Plan.load(near).stages} == {2}
    assert "--tensor-model-parallel-size 2" in capsys.readouterr().out
