"""``hybridplan run`` as a user calls it (``hybridplan models``: tests/cli/test_models.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridplan.cli import main
from tests.paths import GPT_PLAN as EXAMPLE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(EXAMPLE))
    return f


@pytest.mark.distributed
def test_run_example_entry_point(example, tmp_path):
    """Through the installed console script, as a user runs it."""
    out = tmp_path / "result.json"
    cmd = [str(Path(sys.executable).parent / "hybridplan"), "run", "--model", "gpt-tiny", "--cluster", "1x4",
           "--plan", str(example), "--iterations", "3", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["reason"] is None
    assert len(result["losses"]) == 3 and result["iteration_seconds"] > 0
    assert [(d["device"], d["stage"]) for d in result["devices"]] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert all(isinstance(d["peak_memory_bytes"], int) and d["peak_memory_bytes"] > 0 for d in result["devices"])
    assert "peak memory" in proc.stdout


@pytest.mark.distributed
def test_run_user_sequential_model(tmp_path, capsys):
    plan = {"schedule": "gpipe", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "data", "degree": 2, "devices": [0, 1]},
        {"layers": [2, 5], "parallelism": "tensor", "degree": 2, "devices": [2, 3]}]}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan))
    code = main(["run", "--model", "tests.cli.user_models:mlp", "--cluster", "1x4", "--plan", str(f),
                 "--iterations", "2", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "ok" and len(result["losses"]) == 2


@pytest.mark.distributed
def test_run_oom_exit_code(example, capsys):
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(example), "--device-memory", "1MiB"]) == 1
    assert "status: oom" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt-huge"], "unknown model 'gpt-huge'"),
        (["--cluster", "1x3"], "device 3 does not exist on cluster 1x3"),
        (["--cluster", "3 nodes"], "neither the shorthand NxK"),
        (["--device-memory", "lots"], "is not a size"),
        (["--iterations", "0"], "argument --iterations: must be a positive integer, got '0'"),
        (["--timeout", "0"], "argument --timeout: must be a positive number, got '0'"),
        (["--lr", "-1"], "argument --lr: must be a positive number"),
        (["--device-memory", "0"], "--device-memory '0' is not a capacity"),
        (["--model", "wresnet-tiny"], "model has 7 layers"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(example, capsys, args, message):
    base = {"--model": "gpt-tiny", "--cluster": "1x4", "--plan": str(example)}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["run"] + [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("hybridplan run: error:")


def test_malformed_plan_file(tmp_path, capsys):
    f = tmp_path / "p.json"
    f.write_text('{"schedule": "1f1b", "stages": []')
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(f)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_write_config_for_torchrun(example, tmp_path):
    cfg = tmp_path / "run.json"
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(example), "--write-config", str(cfg)]) == 0
    from hybridplan.runtime.config import config_from_json

    loaded = config_from_json(cfg.read_text())
    assert loaded.plan.to_dict() == EXAMPLE and loaded.cluster.shape == "1x4" and not loaded.share_gpu
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(example), "--share-gpu",
                 "--device", "cuda", "--write-config", str(cfg)]) == 0  # for torchrun on a GPU machine: none needed here
    shared = config_from_json(cfg.read_text())
    assert shared.share_gpu and shared.device_type == "cuda"


@pytest.mark.distributed
def test_torchrun_worker(example, tmp_path):
    """The multi-machine path: torchrun starts the ranks, rank 0 writes the result."""
    cfg, out = tmp_path / "run.json", tmp_path / "result.json"
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(example), "--iterations", "2",
                 "--write-config", str(cfg)]) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "-m", "hybridplan.runtime.torchrun", "--config", str(cfg), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and len(result["losses"]) == 2
    assert len(result["devices"]) == 4


def test_a_finished_result_is_kept_when_its_output_path_fails(example, tmp_path, monkeypatch, capsys):
    """The output folder disappears during the run: the result is written elsewhere, and the message says where."""
    import tempfile

    import hybridplan.cli.run as run_cli

    monkeypatch.setattr(run_cli, "check_output", lambda path, option: None)  # as if the folder went away later
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "gone" / "result.json"
    code = main(["run", "--model", "gpt-tiny", "--cluster", "1x4", "--plan", str(example), "--iterations", "2",
                 "--backend", "sim", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    kept = [p for p in tmp_path.iterdir() if p.name.endswith("result.json")]
    assert len(kept) == 1 and str(kept[0]) in err and str(out) in err
    result = json.loads(kept[0].read_text())
    assert result["status"] == "ok" and len(result["devices"]) == 4


def test_a_simulated_cuda_run_shows_tensor_reserved_outside_and_total(example, tmp_path, capsys):
    """On CUDA the table and the JSON give the tensor peak (max_memory_allocated), the allocator's reserved peak,
    the memory outside it and the total nvidia-smi would show; the console names the devices "cuda"."""
    plan = tmp_path / "one.json"
    plan.write_text(json.dumps({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2,
                                "stages": [{"layers": [0, 10], "parallelism": "none", "degree": 1, "devices": [0]}]}))
    out = tmp_path / "r.json"
    assert main(["run", "--model", "gpt-tiny", "--cluster", "1x1", "--plan", str(plan), "--backend", "sim",
                 "--device", "cuda", "--iterations", "2", "--out", str(out)]) == 0
    text = capsys.readouterr()
    assert "running gpt-tiny on 1x1 cuda," in text.err
    header = text.out.splitlines()[1].split()
    assert header[-6:] == ["tensor", "peak", "static", "reserved", "outside", "total"]
    d = json.loads(out.read_text())["devices"][0]
    assert d["total_peak_bytes"] == d["reserved_peak_bytes"] + d["overhead_bytes"]
    assert d["reserved_peak_bytes"] >= d["peak_memory_bytes"] > 0


@pytest.mark.distributed
def test_a_run_on_two_nodes_measures_what_a_local_run_measures(tmp_path, monkeypatch, capsys):
    """--hosts with two "nodes" of this machine (torchrun --nnodes 2, rendezvous on 127.0.0.1), stage 1 on node 1:
    the same losses and per-device memory as local processes (runtime/multinode.py)."""
    from tests.runtime.util import free_port

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    plan = {"schedule": "gpipe", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 2], "parallelism": "none", "degree": 1, "devices": [0]},
        {"layers": [2, 5], "parallelism": "none", "degree": 1, "devices": [1]}]}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan))
    args = ["run", "--model", "tests.cli.user_models:mlp", "--cluster", "2x1", "--plan", str(f), "--iterations", "2", "--json"]
    assert main(args) == 0
    local = json.loads(capsys.readouterr().out)
    assert main([*args, "--hosts", "127.0.0.1,127.0.0.1", "--launcher", "local", "--master-port", str(free_port())]) == 0
    captured = capsys.readouterr()
    multi = json.loads(captured.out)
    assert "started 2 processes on 2 hosts" in captured.err
    assert multi["status"] == local["status"] == "ok"
    assert multi["losses"] == local["losses"] and len(local["losses"]) == 2
    keep = ("device", "stage", "node", "peak_memory_bytes", "static_memory_bytes", "data_bytes", "peak_breakdown",
            "iteration_peaks", "timeline")
    assert [{k: d[k] for k in keep} for d in multi["devices"]] == [{k: d[k] for k in keep} for d in local["devices"]]
