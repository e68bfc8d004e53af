"""Bad input, as a new user types it: every case exits with code 2, one clear message and no traceback, and the
cases marked so are answered before torch is imported. The table of docs/errors.md is this test's output.

Each case runs the real command line in a process of its own, forked from one that imported the CLI's modules and
not torch (so ``sys.modules`` tells whether the command imported torch; the few cases answered after torch is
loaded fork from one that imported it), in a folder holding the files the commands name
(``mlp_files`` of tests/cli/conftest.py and a few broken ones).
Rewrite the doc after changing a message: ``HYBRIDPLAN_WRITE_DOCS=1 pytest tests/cli/test_errors_doc.py``.
"""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import hybridplan.cli
from hybridplan.models.hf_config import HF_CONFIGS
from tests.cli.conftest import MIXED, MLP

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


@dataclass(frozen=True)
class Case:
    """One bad input: the arguments after ``hybridplan``, a fragment its message must contain, and whether it is
    answered before torch is imported."""

    args: str
    expect: str
    before_torch: bool = True


RUN = "run --model gpt-tiny --cluster 1x4 --plan gpt_plan.json"
PLAN = "plan --db profile.sqlite --cluster 1x4"
PROFILE = "profile --model gpt-tiny --cluster 1x4 --global-batch-size 16 --num-microbatches 2 --db new.sqlite"
PROFILE2 = PROFILE.replace("1x4", "2x2")
CASES: tuple[tuple[str, tuple[Case, ...]], ...] = (
    ("Arguments", (
        Case("run --model gpt-tiny --plan gpt_plan.json", "the following arguments are required: --cluster"),
        Case("plan --objective speed --db profile.sqlite --cluster 1x4", "invalid choice: 'speed'"),
        Case(f"{RUN} --iterations 0", "argument --iterations: must be a positive integer, got '0'"),
        Case(f"{RUN} --timeout 0", "argument --timeout: must be a positive number, got '0'"),
        Case(f"{RUN} --lr -1", "argument --lr: must be a positive number"),
        Case(f"{RUN} --precision fp16 --loss-scale 0", "argument --loss-scale: must be a positive number"),
        Case(f"{PLAN} --global-batch-size 0", "argument --global-batch-size: must be a positive integer, got '0'"),
        Case(f"{PLAN} --num-microbatches 0", "argument --num-microbatches: must be a positive integer, got '0'"),
        Case(f"{PLAN} --global-batch-size {10**21}", "argument --global-batch-size: must be at most 16,777,216"),
        Case(f"{PLAN} --num-microbatches {2**40}", "argument --num-microbatches: must be at most 65,536"),
        Case(f"{PLAN} --top 0", "argument --top: must be a positive integer"),
        Case(f"{PLAN} --baseline equal --stage-degree 0", "argument --stage-degree: must be a positive integer"),
        Case("profile --model gpt-tiny --cluster 1x4 --global-batch-size 0 --num-microbatches 2 --db new.sqlite",
             "argument --global-batch-size: must be a positive integer"),
        Case(f"{PROFILE.replace('16', '15')}", "does not split into 2"),
        Case(f"{PROFILE} --profile-batch-sizes 0,8", "--profile-batch-sizes must be comma-separated positive integers"),
        Case(f"{PROFILE} --scenarios pipeline,tensor3x", "unknown scenario 'tensor3x'"),
        Case(f"{PROFILE} --merge-layers 0", "argument --merge-layers: must be a positive integer"),
        Case(f"{PROFILE} --time --backend sim", "fake tensors that take no time"),
        Case(f"{PROFILE} --time-out t2.json", "need --time"),
    )),
    ("Models", (
        Case("run --model gpt-huge --cluster 1x4 --plan gpt_plan.json", "unknown model 'gpt-huge'"),
        Case("run --model mypkg: --cluster 1x4 --plan gpt_plan.json", "is not of the form module:function"),
        Case("run --model nosuchpkg.models:build --cluster 1x4 --plan gpt_plan.json", "cannot import module 'nosuchpkg.models'",
             before_torch=False),
        Case("run --model wresnet-tiny --cluster 1x4 --plan gpt_plan.json", "model has 7 layers", before_torch=False),
        Case("run --model hf:llama-9000 --cluster 1x4 --plan gpt_plan.json",
             "is neither a shipped HuggingFace config nor an existing path"),
        Case("run --model hf:hf_dir --cluster 1x4 --plan gpt_plan.json", "directory 'hf_dir' has no config.json"),
        Case("run --model hf:hf_broken.json --cluster 1x4 --plan gpt_plan.json", "is not readable JSON"),
        Case("run --model hf:hf_bert.json --cluster 1x4 --plan gpt_plan.json",
             "architecture 'bert' (model_type) is not supported"),
        Case("run --model hf:llama-tiny --cluster 1x4 --plan gpt_plan.json", "model has 4 layers", before_torch=False),
        Case("run --model hf:hf_heads.json --cluster 1x4 --plan gpt_plan.json",
             "hidden_size 32 is not divisible by num_attention_heads 5"),
        Case("run --model hf:hf_layers.json --cluster 1x4 --plan gpt_plan.json",
             "num_hidden_layers is 1,000,000,000, more than 16,384 (128 times the deepest published decoder LM"),
        Case("run --model hf:hf_positions.json --cluster 1x4 --plan gpt_plan.json",
             "max_position_embeddings is 0, not a positive integer"),
        Case("run --model hf:hf_experts.json --cluster 1x4 --plan gpt_plan.json",
             "num_experts_per_tok is 5, more than 4 (the 4 experts of num_local_experts)"),
        Case("plan --model hf:llama-tiny,seq=64 --cluster 1x4 --global-batch-size 8 --num-microbatches 2",
             "a sequence of 64 tokens is longer than the model's 16 positions"),
        Case("run --model hf:hf_deep.json --cluster 1x4 --plan gpt_plan.json", "it is nested deeper than the JSON reader"),
        Case("run --model hf:hf_digits.json --cluster 1x4 --plan gpt_plan.json",
             "hidden_size is an integer of 5,000 digits, more than 2,097,152"),
    )),
    ("Clusters and capacities", (
        Case("run --model gpt-tiny --cluster 4nodes --plan gpt_plan.json", "neither the shorthand NxK"),
        Case("run --model gpt-tiny --cluster 0x4 --plan gpt_plan.json", "at least 1 node of at least 1 device"),
        Case("run --model gpt-tiny --cluster 1000000x1000000 --plan gpt_plan.json", "more than the 1,048,576"),
        Case("run --model gpt-tiny --cluster missing.toml --plan gpt_plan.json", "does not exist"),
        Case("run --model gpt-tiny --cluster bad.toml --plan gpt_plan.json", "is not valid TOML"),
        Case("run --model gpt-tiny --cluster badlink.toml --plan gpt_plan.json", "node_overrides[0]: intra_node 'fast'"),
        Case("run --model gpt-tiny --cluster badlatency.toml --plan gpt_plan.json", "network.intra_node_latency 'soon'"),
        Case(f"{RUN} --device-memory lots", "is not a size"),
        Case(f"{RUN} --device-memory 0", "is not a capacity"),
        Case(f"{RUN} --device-memory=-1GiB", "is not a size"),
        Case(f"{RUN} --backend sim --device cuda --device-memory 200MiB", "cannot even hold a CUDA context"),
        Case(f"{RUN} --gpu h100", "unknown GPU 'h100'; name one of h100-sxm"),
        Case(f"{RUN} --device-memory 1e300TB", "'1e300TB' is more than 1,125,899,906,842,624 bytes (1 PiB)"),
        Case(f"{RUN} --gpu t4 --device cpu", "--gpu t4 names a GPU, but --device cpu asks for CPU devices"),
        Case(f"{PLAN} --device-memory 1KiB", "the lowest-memory plan does not fit"),
        Case("plan --db profile.sqlite --cluster 8x4", "use fewer devices"),
        Case("plan --db profile.sqlite --cluster 1000x1000", "use fewer devices"),
        Case("plan --db profile.sqlite --cluster 3x1000 --allow-cross-node", "even across nodes"),
        Case("validate --db profile.sqlite --plan plan.json --device-memory 40GiB", "no --cluster was given"),
    )),
    ("Plan files", (
        Case("run --model gpt-tiny --cluster 1x4 --plan missing.json", "plan file 'missing.json' does not exist"),
        Case("run --model gpt-tiny --cluster 1x4 --plan notjson.json", "is not valid JSON"),
        Case("run --model gpt-tiny --cluster 1x4 --plan nostages.json", "plan lacks key(s) ['stages']"),
        Case("run --model gpt-tiny --cluster 1x4 --plan gap.json", "must start where stage 0 stops"),
        Case("run --model gpt-tiny --cluster 1x4 --plan short.json", "the model has 10 layers", before_torch=False),
        Case("run --model gpt-tiny --cluster 1x3 --plan gpt_plan.json", "device 3 does not exist on cluster 1x3"),
        Case("run --model gpt-tiny --cluster 1x4 --plan twice.json", "is used by stage 0 and stage 1"),
        Case("run --model gpt-tiny --cluster 1x4 --plan degree.json", "degree 2 but 1 device(s)"),
        Case("run --model gpt-tiny --cluster 1x4 --plan pipe.json", "unknown parallelism 'pipe'"),
        Case("run --model gpt-tiny --cluster 1x4 --plan schedule.json", "unknown schedule 'zb'"),
        Case("run --model gpt-tiny --cluster 1x4 --plan split.json", "does not split into 3 equal micro-batches"),
        Case("run --model gpt-tiny --cluster 2x2 --plan spans.json", "spans nodes [0, 1]"),
        Case("run --model gpt-tiny --cluster 1x4 --plan zero_tensor.json", "ZeRO-1 shards over the data-parallel group"),
        Case("run --model gpt-tiny --cluster 1x4 --plan zero.json", "with PipeDream-2BW", before_torch=False),
        Case("run --model gpt-tiny --cluster 1x4 --plan zeroo.json", "stage 0: unknown key(s) 'zeroo'"),
        Case("run --model gpt-tiny --cluster 1x4 --plan tensor0.json", "'tensor_degree' is 0, not a positive integer"),
        Case("run --model gpt-tiny --cluster 1x4 --plan same.json", "device 0 appears twice in stage 0"),
        Case("run --model gpt-tiny --cluster 1x4 --plan huge.json", "'global_batch_size' is an integer of 31 digits, more than 16,777,216"),
        Case("export --plan huge.json --to megatron", "'global_batch_size' is an integer of 31 digits, more than 16,777,216"),
        Case("run --model gpt-tiny --cluster 1x4 --plan many.json", "'num_microbatches' is 1,099,511,627,776, more than"),
        Case("run --model gpt-tiny --cluster 1x4 --plan deep.json", "is not valid JSON: it is nested deeper than"),
    )),
    ("Profile databases and time profiles", (
        Case("plan --db missing.sqlite --cluster 1x4", "profile database 'missing.sqlite' does not exist"),
        Case("plan --db notadb.sqlite --cluster 1x4", "is not a hybridplan profile database"),
        Case("plan --db other.sqlite --cluster 1x4", "it has no 'meta' table"),
        Case("predict --db profile.sqlite --plan gpt_plan.json", "the model has 5 layers"),
        Case("predict --db profile.sqlite --plan zero2.json", "no ZeRO-3 scenario (ZeRO-2 is predicted from it)"),
        Case("validate --db code.sqlite --plan plan.json", "names the model 'this:x', which is not a zoo model"),
        Case("plan --baseline equal --db profile.sqlite --cluster 1x4",
             f"add --model {MLP}"),
        Case("plan --baseline equal --db profile.sqlite --cluster 1x4 --model gpt-tiny", "is another model",
             before_torch=False),
        Case("estimate --plan plan.json --cluster 1x4 --time-profile missing.json", "does not exist"),
        Case("estimate --plan plan.json --cluster 1x4 --db profile.sqlite", "holds none"),
        Case(f"{PROFILE.replace('new.sqlite', 'notadb.sqlite')}", "is not a hybridplan profile database"),
    )),
    ("Outputs (checked before any work)", (
        Case(f"{RUN} --out .", "--out '.' is a directory"),
        Case(f"{RUN} --out missing/result.json", "--out 'missing/result.json' cannot be written"),
        Case(f"{RUN} --out /proc/result.json", "cannot be written"),
        Case(f"{PLAN} --out missing/best.json", "cannot be written"),
        Case("validate --db profile.sqlite --plan plan.json --out missing/v.json", "cannot be written"),
        Case(f"{PROFILE.replace('new.sqlite', 'missing/p.sqlite')}", "--db 'missing/p.sqlite' cannot be written"),
        Case("report v.json --png missing/v.png", "--png 'missing/v.png' cannot be written"),
        Case(f"{RUN} --out fifo", "--out 'fifo' is a named pipe (FIFO), not a regular file"),
        Case("export --plan gpt_plan.json --to megatron --out nulldev", "--out 'nulldev' is a character device"),
        Case(f"{PROFILE.replace('new.sqlite', 'fifo')}", "--db 'fifo' is a named pipe (FIFO)"),
    )),
    ("Exports (hybridplan export)", (
        Case("export --plan gpt_plan.json --to jax", "invalid choice: 'jax'"),
        Case("export --plan notjson.json --to megatron", "is not valid JSON"),
        Case("export --plan gpt_plan.json --to megatron", "megatron cannot run this plan as it is"),
        Case("export --plan gpt_plan.json --to deepspeed --model wresnet-tiny", "wresnet-tiny has 7", before_torch=False),
        Case(f"export --plan plan.json --to torchtitan --model {MLP}", "runs decoder-only transformers",
             before_torch=False),
        Case("export --plan gpt_plan.json --to torchtitan --nearest --out missing/r.py", "cannot be written"),
        Case("export --plan gpt_plan.json --to megatron --nearest-plan n.json", "add --nearest"),
    )),
    ("One-shot estimates (hybridplan estimate-memory)", (
        Case("estimate-memory --model gpt-tiny --cluster 1x4", "needs --global-batch-size and --num-microbatches"),
        Case("estimate-memory --model gpt-tiny --cluster 1x4 --plan gpt_plan.json --num-microbatches 3",
             "differs from the plan's 8"),
        Case("estimate-memory --model gpt-tiny --cluster 1x4 --plan gpt_plan.json --out missing/b.json", "cannot be written"),
        Case("estimate-memory --model wresnet-tiny --cluster 1x4 --plan gpt_plan.json", "model has 7 layers",
             before_torch=False),
        Case("estimate-memory --model gpt-tiny --cluster 1x4 --plan gpt_plan.json --engine nemo", "invalid choice: 'nemo'"),
        Case("estimate-memory --model gpt-tiny --cluster 1x4 --plan gpt_plan.json --engine deepspeed",
             "the deepspeed engine's memory is not modelled yet"),
        Case("estimate-memory --model gpt-tiny --cluster 1x4 --plan gpt_plan.json --engine megatron --precision fp16",
             "Megatron-LM's fp16 training"),
    )),
    ("Pictures (hybridplan show)", (
        Case("show times.json --png a.png", "'times.json' is not a plan: plan lacks key(s)"),
        Case("show plan.json --validation v.json --png a.png",
             "--validation v.json does not match the plan: it has 1 device(s) [0], the plan 4"),
        Case("show plan.json --png missing/a.png", "--png 'missing/a.png' cannot be written"),
    )),
    ("Combinations", (
        Case("plan --cluster 1x4", "needs --model, --global-batch-size and --num-microbatches"),
        Case(f"{PLAN} --mode 2bw", "plans for throughput"),
        Case(f"{PLAN} --objective throughput --mode bayesian", "solves the memory objective"),
        Case(f"{PLAN} --objective throughput --fewest-devices --model {MLP}", "apply to --objective memory"),
        Case(f"{PLAN} --objective throughput --zero --mode 2bw --model {MLP}", "not PipeDream-2BW's"),
        Case("plan --time-profile times.json --cluster 1x4 --global-batch-size 32 --objective throughput"
             " --recompute-db profile.sqlite", "and there are none"),
        Case(f"{PLAN} --pipeline-only --space extended", "contradict each other"),
        Case(f"{PLAN} --recompute-db profile.sqlite", "was profiled without recompute"),
        Case(f"{PLAN} --allow-cross-node --pipeline-only", "adds data stages over whole nodes"),
        Case("report v.json --plan plan.json --db profile.sqlite", "give either an input file or --plan"),
        Case(f"{RUN} --backend sim --share-gpu", "simulated devices share nothing", before_torch=False),
        Case(f"{RUN} --share-gpu", "there is no GPU to share", before_torch=False),
        Case(f"{PROFILE} --time --share-gpu", "not representative"),
    )),
    ("Several machines (profile --hosts, run --hosts)", (
        Case(f"{PROFILE2} --hosts ,", "host list ',' has an empty item"),
        Case(f"{PROFILE2} --hosts gpu[01-02", "unbalanced brackets in 'gpu[01-02'"),
        Case(f"{PROFILE2} --hosts gpu[2-1]", "'2-1' in [2-1] is not a number or a rising range"),
        Case(f"{PROFILE2} --hosts gpu[1-3]", "--hosts names 3 host(s) (gpu1,gpu2,gpu3) but cluster 2x2 has 2 node(s)"),
        Case(f"{PROFILE2} --hosts slurm", "not inside a SLURM allocation"),
        Case(f"{PROFILE2} --hosts n1,n2 --launcher rsh", "--launcher 'rsh' has no {host}"),
        Case(f"{PROFILE2} --hosts=-oProxyCommand,n2", "host '-oProxyCommand' starts with '-'"),
        Case(f"{PROFILE2} --hosts n1,n2 --master-addr=-oProxyCommand", "--master-addr '-oProxyCommand' starts with '-'"),
        Case(f"{PROFILE2} --hosts n1,n2 --launcher=", "--launcher '' is empty"),
        Case(f"{PROFILE2} --hosts n1,n2 --launcher=ssh{{host}}--cmd={{command}}", "has {command} inside the word"),
        Case(f"{PROFILE2} --hosts n1,n2 --backend sim", "simulated devices (--backend sim) run in this process"),
        Case(f"{PROFILE2} --hosts n1,n2 --time", "--time measures layers on this one"),
        Case(f"{PROFILE2} --master-port 29500", "--master-port needs --hosts"),
        Case(f"{PROFILE2} --hosts n1,n2 --master-port 70000", "must be a TCP port (1 to 65535), got '70000'"),
        Case("run --model gpt-tiny --cluster 2x2 --plan gpt_plan.json --hosts n1,n2 --write-config run.json",
             "--write-config writes a configuration to start with torchrun by hand; --hosts starts it"),
        Case("run --model gpt-tiny --cluster 2x2 --plan gpt_plan.json --hosts n1", "--hosts names 1 host(s) (n1) but"),
    )),
)


def _setup(folder: Path, mlp_files: Path) -> None:
    """The files the cases name, good and broken."""
    shutil.copy(mlp_files / "p.sqlite", folder / "profile.sqlite")
    shutil.copy(mlp_files / "t.json", folder / "times.json")
    (folder / "plan.json").write_text(json.dumps(MIXED))
    gpt = {"schedule": "1f1b", "global_batch_size": 32, "num_microbatches": 8, "stages": [
        {"layers": [0, 3], "parallelism": "tensor", "degree": 2, "devices": [0, 1]},
        {"layers": [3, 7], "parallelism": "none", "degree": 1, "devices": [2]},
        {"layers": [7, 10], "parallelism": "data", "degree": 1, "devices": [3]}]}
    (folder / "gpt_plan.json").write_text(json.dumps(gpt))

    def variant(name: str, **changes: object) -> None:
        stages = [dict(s) for s in gpt["stages"]]
        for key, value in changes.items():
            if key.startswith("stage"):
                index, field = key[5], key[7:]
                stages[int(index)][field] = value
        plan = {**gpt, **{k: v for k, v in changes.items() if not k.startswith("stage")}, "stages": stages}
        (folder / name).write_text(json.dumps(plan))

    variant("gap.json", stage1_layers=[4, 7])
    variant("short.json", stage2_layers=[7, 9])
    variant("twice.json", stage1_devices=[1])
    variant("degree.json", stage0_devices=[0])
    variant("pipe.json", stage1_parallelism="pipe")
    variant("schedule.json", schedule="zb")
    variant("split.json", num_microbatches=3)
    variant("spans.json", stage0_devices=[1, 2], stage1_devices=[0])
    variant("zero_tensor.json", stage0_zero=1)
    variant("zeroo.json", stage0_zeroo=3)
    variant("tensor0.json", stage0_parallelism="data+tensor", stage0_tensor_degree=0)
    variant("same.json", stage0_devices=[0, 0])
    variant("huge.json", global_batch_size=10**30)
    variant("many.json", num_microbatches=2**40)
    (folder / "deep.json").write_text("[" * 200_000)
    data = {**gpt, "schedule": "2bw", "stages": [{"layers": [0, 10], "parallelism": "data+tensor", "degree": 4,
                                                  "tensor_degree": 2, "devices": [0, 1, 2, 3], "zero": 2}]}
    (folder / "zero.json").write_text(json.dumps(data))
    zero2 = {**MIXED, "stages": [{"layers": [0, 3], "parallelism": "data", "degree": 2, "devices": [0, 1], "zero": 2},
                                  {"layers": [3, 5], "parallelism": "none", "degree": 1, "devices": [2]}]}
    (folder / "zero2.json").write_text(json.dumps(zero2))
    (folder / "nostages.json").write_text(json.dumps({k: v for k, v in gpt.items() if k != "stages"}))
    (folder / "notjson.json").write_text('{"schedule": "1f1b", "stages": [')
    (folder / "bad.toml").write_text("nodes = [1\n")
    (folder / "hf_dir").mkdir()
    (folder / "hf_broken.json").write_text('{"model_type": "llama", ')
    (folder / "hf_bert.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    llama, mixtral = HF_CONFIGS["llama-tiny"], HF_CONFIGS["mixtral-tiny"]
    for name, config in (("heads", {**llama, "num_attention_heads": 5}), ("layers", {**llama, "num_hidden_layers": 10**9}),
                         ("positions", {**llama, "max_position_embeddings": 0}),
                         ("experts", {**mixtral, "num_experts_per_tok": 5})):
        (folder / f"hf_{name}.json").write_text(json.dumps(config))
    (folder / "hf_deep.json").write_text("[" * 200_000)
    (folder / "hf_digits.json").write_text(json.dumps(llama)[:-1] + ', "hidden_size": ' + "7" * 5000 + "}")
    (folder / "badlink.toml").write_text('nodes = 2\ndevices_per_node = 2\n[[node_overrides]]\nnodes = [1]\nintra_node = "fast"\n')
    (folder / "badlatency.toml").write_text('nodes = 1\ndevices_per_node = 4\n[network]\nintra_node_latency = "soon"\n')
    (folder / "notadb.sqlite").write_text("this is a text file, not a database\n")
    os.mkfifo(folder / "fifo")
    (folder / "nulldev").symlink_to("/dev/null")  # a device, through a link: a broken check would replace the link only
    with sqlite3.connect(folder / "other.sqlite") as db:
        db.execute("CREATE TABLE t (x INTEGER)")
    shutil.copy(mlp_files / "p.sqlite", folder / "code.sqlite")
    with sqlite3.connect(folder / "code.sqlite") as db:  # a database that names code to import and call
        for key in ("model", "identity"):
            (value,) = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            value = json.loads(value)
            value = "this:x" if key == "model" else {**value, "model": "this:x"}
            db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(value), key))
    (folder / "v.json").write_text(json.dumps({"plan": MIXED, "status": "ok", "reason": None, "devices": [
        {"device": 0, "stage": 0, "predicted": 100, "measured": 100, "relative_error": 0.0}]}))


# A server that imports the CLI once, and the modules its arguments name (without torch unless named: asserted),
# and forks a child per case; the child runs the command line in the case's folder with its stderr in a file, then
# prints whether torch and ``this`` (the module ``code.sqlite`` names) are in its ``sys.modules``. A fork starts
# from the server's modules, which hold neither (the cases answered before torch are served by one that did not
# import it), so the markers say what the command itself imported, as a fresh interpreter would, without paying an
# interpreter start and the CLI's imports 100 times over. One JSON request (folder, arguments) per line in, one
# answer out.
_SERVER = """\
import importlib, json, os, sys, tempfile, traceback
from hybridplan.cli import main
for name in sys.argv[1:]:
    importlib.import_module(name)
assert 'torch' in sys.argv[1:] or 'torch' not in sys.modules, 'the server imported torch'
assert 'this' not in sys.modules, 'the server imported the module code.sqlite names'
for line in sys.stdin:
    folder, args = json.loads(line)
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            os.chdir(folder)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(err.fileno(), 2)
            try:
                code = main(args)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                print('@torch' if 'torch' in sys.modules else '@no-torch', file=sys.stderr)
                print('@zen' if 'this' in sys.modules else '@no-zen', file=sys.stderr)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        err.seek(0)
        print(json.dumps([code, err.read().decode()]), flush=True)
"""


@dataclass(frozen=True)
class Outcome:
    code: int
    message: str
    torch: bool
    zen: bool


def _serve(cases: list[Case], folder: Path, preload: list[str]) -> list[Outcome]:
    """Run ``cases`` in ``folder``, one after the other, through one server process that imported ``preload``."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},  # as outside an allocation
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2])] + sys.path)}
    requests = "".join(json.dumps([str(folder), case.args.split()]) + "\n" for case in cases)
    proc = subprocess.run([sys.executable, "-c", _SERVER, *preload], cwd=folder, input=requests, capture_output=True,
                          text=True, timeout=60 * len(cases), env=env)
    assert proc.returncode == 0, proc.stderr
    return [_outcome(*json.loads(line)) for line in proc.stdout.splitlines()]


def _outcome(code: int, stderr: str) -> Outcome:
    lines = stderr.rstrip("\n").splitlines()
    markers, text = lines[-2:], lines[:-2]
    # The error, without what the command printed before it (e.g. what a search holds fixed).
    first = next((i for i, line in enumerate(text) if line.startswith("hybridplan ") and ": error:" in line), 0)
    return Outcome(code, "\n".join(text[first:]).strip(), markers[0] == "@torch", markers[1] == "@zen")


@pytest.fixture(scope="module")
def outcomes(mlp_files, tmp_path_factory) -> dict[str, Outcome]:
    folder = tmp_path_factory.mktemp("bad-input")
    _setup(folder, mlp_files)
    cases = [c for _, group in CASES for c in group]
    # Two servers at once, one per core. Every command's module and numpy are imported once, in the server (a
    # case's own imports were most of its time): the CLI's modules import no torch (the server asserts it), and
    # the few cases answered after torch is loaded are served by one that imported it too.
    commands = [f"hybridplan.cli.{m.name}" for m in pkgutil.iter_modules(hybridplan.cli.__path__)
                if m.name != "__main__"]
    servers = [([c for c in cases if c.before_torch], ["numpy", *commands]),
               ([c for c in cases if not c.before_torch], ["numpy", *commands, "torch"])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(lambda server: _serve(server[0], folder, server[1]), servers))
    return {c.args: o for (group, _), got in zip(servers, answers) for c, o in zip(group, got, strict=True)}


@pytest.mark.parametrize("case", [c for _, group in CASES for c in group], ids=lambda c: c.args[:60])
def test_bad_input(case: Case, outcomes: dict[str, Outcome]) -> None:
    got = outcomes[case.args]
    assert got.code == 2, got.message
    assert case.expect in got.message, got.message
    assert "Traceback" not in got.message and got.message.startswith("hybridplan ")
    assert len(got.message.splitlines()) <= 3, got.message
    assert not got.zen  # no data file made us import the code it names
    if case.before_torch:
        assert not got.torch, f"{case.args}: torch was imported before the error"


def render(outcomes: dict[str, Outcome]) -> str:
    """docs/errors.md."""
    lines = [
        "# Bad input: what hybridplan answers",
        "",
        "Every row below was run as written by `tests/cli/test_errors_doc.py`, which fails when this file and the",
        "program disagree (`HYBRIDPLAN_WRITE_DOCS=1 pytest tests/cli/test_errors_doc.py` rewrites it). The folder",
        f"held `profile.sqlite` (a profile of the user model `{MLP}`, 5 layers, on 1x4), `plan.json` (a plan",
        "of it), `gpt_plan.json` (a plan of gpt-tiny, 10 layers, on 1x4) and broken variants of them (a gap",
        "between stages, a device used twice, a database naming the code `this:x`, ...).",
        "",
        "Every case exits with code 2, says what is wrong and how to fix it, prints no traceback and starts no",
        "work; \"before torch\" says the answer came before torch was imported (milliseconds rather than seconds:",
        "only checks that need the model itself wait for it).",
        "",
    ]
    for title, group in CASES:
        lines += [f"## {title}", "", "| input | exit | before torch | message |", "|---|--:|:-:|---|"]
        for case in group:
            got = outcomes[case.args]
            message = got.message.replace("|", "\\|").replace("\n", "<br>")
            lines.append(f"| `hybridplan {case.args}` | {got.code} | {'yes' if not got.torch else 'no'} | {message} |")
        lines.append("")
    return "\n".join(lines)


def test_the_doc_is_this_tests_output(outcomes: dict[str, Outcome]) -> None:
    text = render(outcomes)
    if os.environ.get("HYBRIDPLAN_WRITE_DOCS"):
        DOC.write_text(text)
    assert DOC.exists() and DOC.read_text() == text, "docs/errors.md is stale: rerun with HYBRIDPLAN_WRITE_DOCS=1"
