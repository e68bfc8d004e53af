"""``hybridplan gpus`` and ``--gpu NAME``: the catalogue listed, a named GPU implying CUDA devices of its memory and
CUDA terms, the notes for what the command assumed, and docs/gpus.md kept equal to the catalogue.

Rewrite the doc's generated tables after changing the catalogue: ``HYBRIDPLAN_WRITE_DOCS=1 pytest tests/cli/test_gpus.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hybridplan.cli import main
from hybridplan.cli.common import add_cluster, add_training, cluster_from
from hybridplan.cli.gpus import markdown_sources_table, markdown_table, markdown_terms_table
from hybridplan.errors import UsageError
from tests.cli.conftest import MLP

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpus.md"
GIB = 2**30
_BLOCK = re.compile(r"(<!-- begin (?P<name>[a-z ]+): [^>]*-->\n)(.*?)(<!-- end (?P=name) -->)", re.S)


def _args(*argv: str) -> argparse.Namespace:
    """What ``run``/``profile`` parse: the cluster options and the training ones (``--device``, ``--gpu``)."""
    p = argparse.ArgumentParser()
    add_cluster(p)
    add_training(p)
    return p.parse_args(["--cluster", "1x2", *argv])


def test_gpus_lists_the_catalogue(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    for key in ("h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "v100-16gb", "v100-32gb", "l4", "t4", "a10g"):
        assert re.search(rf"^{key} ", out, re.M), key
    h100 = next(line for line in out.splitlines() if line.startswith("h100-sxm "))
    assert "80 GiB" in h100 and "989.5" in h100 and "NVLink 4, 450 GB/s" in h100  # 1,979 TF with sparsity, halved


def test_gpus_json_gives_the_cuda_terms(capsys):
    assert main(["gpus", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["h100-sxm"]["cublas_workspace_bytes"] == 32 * 2**20
    assert rows["a100-80gb"]["cublas_workspace_bytes"] == 8_519_680
    assert rows["t4"]["simulated_cuda_context_bytes"] == round(618.8 * 2**20) and rows["t4"]["cuda_context_bytes"] is None


def test_gpus_imports_no_torch():
    code = "import sys\nfrom hybridplan.cli import main\ncode = main(['gpus'])\nprint('torch' in sys.modules)\nsys.exit(code)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("False")


def test_the_doc_shows_the_catalogue():
    tables = {"catalogue": markdown_table(), "cuda terms": markdown_terms_table(), "sources": markdown_sources_table()}
    text = DOC.read_text()
    assert {m.group("name") for m in _BLOCK.finditer(text)} == set(tables)
    fresh = _BLOCK.sub(lambda m: m.group(1) + tables[m.group("name")] + m.group(4), text)
    if os.environ.get("HYBRIDPLAN_WRITE_DOCS"):
        DOC.write_text(fresh)
    assert fresh == text, "docs/gpus.md is stale: rerun with HYBRIDPLAN_WRITE_DOCS=1"


def test_a_gpu_implies_cuda_devices_of_its_memory(capsys):
    args = _args("--gpu", "H100-SXM")
    cluster = cluster_from(args)
    assert args.device == "cuda" and args.gpu == "h100-sxm"
    assert {(d.type, d.gpu, d.memory_bytes) for d in cluster.devices} == {("cuda", "h100-sxm", 80 * GIB)}
    assert capsys.readouterr().err == ""


def test_an_explicit_device_memory_wins_over_the_gpus_and_says_so(capsys):
    cluster = cluster_from(_args("--gpu", "h100-sxm", "--device-memory", "40GB"))
    assert cluster.memory_of(0) == 40 * 10**9
    err = capsys.readouterr().err
    assert "--device-memory 40GB" in err and "h100-sxm's 80GB HBM3 (80.00 GiB)" in err and "with --device-memory" in err
    cluster_from(_args("--gpu", "h100-sxm", "--device-memory", "80GiB"))
    assert capsys.readouterr().err == ""  # they agree: nothing to say


def test_device_memory_alone_says_it_planned_for_cpus(capsys):
    args = _args("--device-memory", "16GiB")
    cluster = cluster_from(args)
    assert args.device == "cpu" and cluster.devices[0].type == "cpu"
    err = capsys.readouterr().err
    assert "planning for CPU devices" in err and "--gpu h100-sxm" in err and "hybridplan gpus" in err
    for device in ("cpu", "cuda"):  # the device was named: nothing assumed
        cluster_from(_args("--device-memory", "16GiB", "--device", device))
        assert capsys.readouterr().err == ""


def test_a_gpu_on_cpu_devices_is_refused():
    with pytest.raises(UsageError, match="--gpu t4 names a GPU, but --device cpu"):
        cluster_from(_args("--gpu", "t4", "--device", "cpu"))


def test_a_cluster_file_naming_gpus_makes_the_devices_cuda(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text('nodes = 1\ndevices_per_node = 2\n[device]\ngpu = "l4"\n')
    args = _args()
    args.cluster = str(f)
    assert cluster_from(args).memory_of(1) == 24 * GIB and args.device == "cuda"
    args = _args("--device", "cpu", "--device-memory", "1GiB")
    args.cluster = str(f)
    with pytest.raises(UsageError, match=r"names GPUs \(l4\), but --device cpu"):
        cluster_from(args)


_ESTIMATE = ["estimate-memory", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2"]


@pytest.mark.parametrize("extra, message", [
    (["--gpu", "h100"], "argument --gpu: unknown GPU 'h100'; name one of h100-sxm, h100-pcie, h200, a100-40gb"),
    (["--gpu", "t4", "--device", "cpu"], "--gpu t4 names a GPU, but --device cpu asks for CPU devices"),
])
def test_bad_gpu_options_exit_2_before_any_work(extra, message, capsys):
    assert main([*_ESTIMATE, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _one_stage_plan(tmp_path: Path) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schedule": "1f1b", "global_batch_size": 8, "num_microbatches": 2, "stages": [
        {"layers": [0, 5], "parallelism": "none", "degree": 1, "devices": [0]}]}))
    return plan


def _estimate(plan: Path, gpu: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, int]:
    """estimate-memory's allocated peak and memory outside the allocator of the one device of ``plan``."""
    assert main(["estimate-memory", "--model", MLP, "--cluster", "1x1", "--plan", str(plan), "--gpu", gpu, "--json"]) == 0
    (device,) = json.loads(capsys.readouterr().out)["estimates"][0]["devices"]
    return device["peak_memory_bytes"], device["overhead_bytes"]


def test_a_gpu_with_a_profile_database_is_refused_naming_it(capsys):
    """With --db the profile holds its device type: --gpu chooses the simulated profile, as --device does."""
    assert main(["plan", "--db", "profile.sqlite", "--cluster", "1x2", "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "--device/--gpu, --precision and --cache-dir choose the simulated profile" in err and "--device-memory" in err


def test_estimate_memory_simulates_the_named_gpus_cublas_workspace(tmp_path, capsys):
    """The MLP's bias Linear forward and its backward's matmuls hold one cuBLAS workspace per thread and one cuBLASLt
    workspace: 2 x 32 MiB + 1 MiB on an H100, 2 x 8,519,680 + 1 MiB on an A100 (PyTorch's defaults), a difference of
    2 x (33,554,432 - 8,519,680) = 50,069,504 bytes in the allocated peak, and the same memory outside the allocator."""
    plan = _one_stage_plan(tmp_path)
    h100, a100 = _estimate(plan, "h100-sxm", capsys), _estimate(plan, "a100-80gb", capsys)
    assert h100[0] - a100[0] == 2 * (33_554_432 - 8_519_680) == 50_069_504
    assert h100[1] == a100[1]


def test_plan_without_a_profile_simulates_the_named_gpu(tmp_path, capsys):
    """The profile-free planner's simulated profile is taken on the GPU named: its prediction of the one-device plan
    is the one-shot estimate on that GPU, also after the same stages were simulated on another GPU into the same
    cache (the stage memo keys a stage by its GPU)."""
    plan = _one_stage_plan(tmp_path)
    for gpu in ("h100-sxm", "a100-80gb"):
        expected = _estimate(plan, gpu, capsys)[0]
        assert main(["plan", "--model", MLP, "--cluster", "1x1", "--gpu", gpu, "--global-batch-size", "8",
                     "--num-microbatches", "2", "--cache-dir", str(tmp_path / "cache"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["predicted_peak_bytes"] == expected, gpu


def test_profile_records_the_named_gpus_workspaces(tmp_path):
    db = tmp_path / "p.sqlite"
    assert main(["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "8", "--num-microbatches", "2",
                 "--backend", "sim", "--gpu", "a100-80gb", "--scenarios", "pipeline", "--db", str(db)]) == 0
    with sqlite3.connect(db) as con:
        sizes = dict(con.execute("SELECT DISTINCT name, bytes FROM workspaces").fetchall())
    assert sizes == {"cublas/forward": 8_519_680, "cublas/backward": 8_519_680, "cublaslt/forward": 1_048_576}


def test_a_stage_simulated_on_one_gpu_is_not_reused_for_another(tmp_path):
    """The memo of simulated stages (profiling/stage_memo.py) keys a stage by its GPU: the A100 campaign served by a
    memo that holds the H100's stages simulates them again, and so records the A100's workspaces."""
    pytest.importorskip("transformers")
    from hybridplan.plan import Cluster
    from hybridplan.profiling.campaign import Campaign, CampaignConfig
    from hybridplan.profiling.partitions import Scenario
    from hybridplan.profiling.stage_memo import StageMemo
    from hybridplan.profiling.store import ProfileStore

    memos = []
    for gpu in ("h100-sxm", "a100-80gb"):
        cfg = CampaignConfig(model="hf:llama-tiny", cluster=Cluster.uniform(1, 1, device_type="cuda", gpu=gpu),
                             global_batch_size=8, num_microbatches=2, scenarios=(Scenario("none", 1),),
                             run_options={"backend": "sim", "device_type": "cuda"})
        memos.append(StageMemo(tmp_path / "stages"))
        with ProfileStore(tmp_path / f"{gpu}.sqlite") as store:
            Campaign(cfg, store, memo=memos[-1]).run()
        with sqlite3.connect(tmp_path / f"{gpu}.sqlite") as con:
            assert {b for (b,) in con.execute("SELECT DISTINCT bytes FROM workspaces WHERE name LIKE 'cublas/%'")} == {
                {"h100-sxm": 33_554_432, "a100-80gb": 8_519_680}[gpu]}
    assert memos[1].misses > 0
