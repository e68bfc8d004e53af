"""``plan`` without ``--db``: the model profiled on simulated devices (cached), the whole extended space searched;
``cache list|clear``; and the span classes that make that search fast predict what span-by-span composition does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridplan.cli import main
from hybridplan.plan import Plan

pytest.importorskip("transformers")

_QUESTION = ["plan", "--model", "hf:llama-tiny", "--cluster", "1x4", "--global-batch-size", "8", "--num-microbatches", "2"]


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The question asked once, cold: its cache folder and the plan written."""
    root = tmp_path_factory.mktemp("instant")
    assert main([*_QUESTION, "--cache-dir", str(root / "cache"), "--out", str(root / "best.json")]) == 0
    return root / "cache", root / "best.json"


def test_plan_without_a_profile_answers_from_simulated_devices(answered: tuple[Path, Path]) -> None:
    cache, best = answered
    plan = Plan.load(best)
    assert plan.stages[0].start == 0 and plan.stages[-1].stop == 4 and plan.num_devices <= 4
    assert len(list((cache / "profiles").glob("*.sqlite"))) == 2  # plain and recomputed
    assert len(list((cache / "stages").glob("*.json"))) > 0


def test_the_same_question_is_read_from_the_cache(answered: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cache, best = answered
    capsys.readouterr()
    assert main([*_QUESTION, "--cache-dir", str(cache), "--out", str(tmp_path / "again.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("read from the cache") == 2 and "simulating" not in err
    assert Plan.load(tmp_path / "again.json").to_dict() == Plan.load(best).to_dict()
    sharded = any(stage.zero >= 2 for stage in Plan.load(best).stages)
    assert ("--verify simulates them" in err) == sharded  # composed ZeRO-2/3 stages are said to be composed


def test_the_same_question_again_builds_no_model(answered: tuple[Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """[Note: the question index]: a question asked before is answered from the index, the stored stage matrices and
    the profiles, without building the model (4-5 s for a 7B HuggingFace model)."""
    import hybridplan.models.zoo as zoo

    def no_model(name: str) -> None:
        raise AssertionError(f"{name} was built")

    cache, best = answered
    assert list((cache / "tables").glob("*.npz"))  # the first search kept its stage matrices
    monkeypatch.setattr(zoo, "resolve_model", no_model)
    capsys.readouterr()
    assert main([*_QUESTION, "--cache-dir", str(cache), "--out", str(tmp_path / "again.json")]) == 0
    assert "read from the cache" in capsys.readouterr().err
    assert Plan.load(tmp_path / "again.json").to_dict() == Plan.load(best).to_dict()


def test_a_damaged_index_or_table_is_not_trusted(answered: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    cache = tmp_path / "copy"
    shutil.copytree(answered[0], cache)
    indexes = [p for p in (cache / "profiles").glob("*.json") if not p.name.startswith(".")]
    tables = list((cache / "tables").glob("*.npz"))
    assert indexes and tables
    indexes[0].write_text('["../../../etc/passwd"]')
    tables[0].write_bytes(b"PK\x03\x04 not a zip")
    assert main([*_QUESTION, "--cache-dir", str(cache), "--out", str(tmp_path / "again.json")]) == 0
    assert Plan.load(tmp_path / "again.json").to_dict() == Plan.load(answered[1]).to_dict()
    assert indexes[0].read_text() != '["../../../etc/passwd"]'  # rewritten
    import numpy as np

    with np.load(tables[0]) as kept:  # rewritten whole
        assert len(kept.files) > 0


def test_verify_simulates_the_chosen_plan_beside_its_prediction(answered: tuple[Path, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cache, best = answered
    capsys.readouterr()
    assert main([*_QUESTION, "--cache-dir", str(cache), "--verify"]) == 0
    out, err = capsys.readouterr()
    assert "verifying" in err and "predicted" in out and "simulated" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()
            and "%" in line]
    plan = Plan.load(best)
    assert sorted(int(r[0]) for r in rows) == list(range(plan.num_devices))  # one row per device
    errors = [float(next(t for t in r if t.endswith("%")).rstrip("%")) for r in rows]
    assert all(abs(e) < 5 for e in errors)  # the composed prediction near the simulation


@pytest.mark.parametrize("extra", [["--json"], ["--objective", "throughput", "--time-profile", "x.json"]])
def test_verify_is_refused_where_it_has_nothing_to_verify(extra: list[str], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_QUESTION, "--cache-dir", str(tmp_path), "--verify", *extra]) == 2
    assert "--verify" in capsys.readouterr().err


def test_a_mesh_too_small_names_the_smallest_that_fits(answered: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cache, best = answered
    peaks = {}
    for shape in ("1x4", "2x4"):
        out = tmp_path / f"{shape}.json"
        assert main(["plan", "--model", "hf:llama-tiny", "--cluster", shape, "--global-batch-size", "8",
                     "--num-microbatches", "2", "--cache-dir", str(cache), "--out", str(out)]) == 0
        peaks[shape] = Plan.load(out).extra["predicted_peak_bytes"]
    assert peaks["2x4"] < peaks["1x4"]
    between = (peaks["1x4"] + peaks["2x4"]) // 2
    capsys.readouterr()
    question = [*_QUESTION, "--cache-dir", str(cache), "--device", "cpu"]
    assert main([*question, "--device-memory", str(between), "--out", str(tmp_path / "no.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "does not fit" in err[-2] and "the smallest mesh that fits is 2x4" in err[-2] and err[-1].startswith("  fix:")
    assert not (tmp_path / "no.json").exists()
    assert main([*question, "--device-memory", "1KiB"]) == 2
    assert "nor does a mesh of more such nodes (2x4, 4x4, 8x4 tried)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def mlp_answers(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    """The MLP's question (a few seconds cold, where the llama's takes a dozen), in micro-batches of one sample,
    asked with an unwritable cache folder, then with a writable one: each answer's plan and what it printed on
    stderr."""
    import contextlib
    import io

    from tests.cli.conftest import MLP

    root = tmp_path_factory.mktemp("mlp-question")
    blocker = root / "file"
    blocker.write_text("")
    answers = []
    for name, cache in (("p.json", blocker / "cache"), ("q.json", root / "cache")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["plan", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "2", "--num-microbatches",
                         "2", "--cache-dir", str(cache), "--out", str(root / name)]) == 0
        answers.append((root / name, err.getvalue()))
    return answers


def test_a_model_without_layer_names_says_nothing_is_shared(mlp_answers: list[tuple[Path, str]]) -> None:
    assert all("does not name what its layers are" in err for _, err in mlp_answers)


def test_micro_batches_of_one_sample_are_profiled_at_one_and_two(mlp_answers: list[tuple[Path, str]]) -> None:
    """[Note: the simulated profile] (workflows/simulated_profile.py): the target micro-batch and its half are
    measured, or, where the half is no micro-batch (one sample), the target and twice it; a profile at half and a
    quarter of the batch (before 29 Nov) could not be taken for micro-batches of one or two samples."""
    from hybridplan.profiling.database import ProfileDB

    plan = Plan.load(mlp_answers[1][0])
    assert (plan.global_batch_size, plan.num_microbatches) == (2, 2)
    profiles = sorted((mlp_answers[1][0].parent / "cache" / "profiles").glob("*.sqlite"))
    assert len(profiles) == 2
    for db in profiles:
        with ProfileDB(db) as profile:
            assert profile.meta["batch_sizes"] == [2, 4]


def test_another_cluster_reuses_the_simulated_stages(answered: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    cache, _ = answered
    stages = set((cache / "stages").glob("*.json"))
    capsys.readouterr()
    assert main(["plan", "--model", "hf:llama-tiny", "--cluster", "2x2", "--global-batch-size", "8",
                 "--num-microbatches", "2", "--cache-dir", str(cache)]) == 0
    err = capsys.readouterr().err
    assert "simulating the profile" in err  # a new profile (another mesh) ...
    new = set((cache / "stages").glob("*.json")) - stages
    assert len(new) < len(stages)  # ... mostly from stages simulated for the first question


def test_cache_list_and_clear(tmp_path: Path, answered: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    cache = tmp_path / "copy"
    shutil.copytree(answered[0], cache)
    capsys.readouterr()
    assert main(["cache", "list", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    profiles = len(list((cache / "profiles").glob("*.sqlite")))
    assert profiles >= 2 and str(cache) in out and f" {profiles} simulated profiles" in out
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 0
    assert not list(cache.rglob("*.json")) and not list(cache.rglob("*.sqlite")) and not list(cache.rglob("*.npz"))


@pytest.mark.parametrize("args, wanted", [
    (["plan", "--model", "hf:llama-tiny", "--cluster", "1x4", "--global-batch-size", "8"], "--num-microbatches"),
    (["plan", "--cluster", "1x4", "--global-batch-size", "8", "--num-microbatches", "2"], "--model"),
    ([*_QUESTION, "--objective", "throughput"], "layer times"),
    ([*_QUESTION, "--model", "hf:no-such-model"], "no-such-model"),
])
def test_bad_questions_are_one_line_and_exit_2(args: list[str], wanted: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert wanted in err and "Traceback" not in err
    assert not list(tmp_path.rglob("*.sqlite"))


def test_an_unwritable_cache_still_answers_and_says_so(mlp_answers: list[tuple[Path, str]]) -> None:
    (unwritable, said), (writable, quiet) = mlp_answers
    assert "cannot be written" in said and "cannot be written" not in quiet
    assert Plan.load(unwritable).to_dict() == Plan.load(writable).to_dict()


def test_span_classes_predict_what_span_by_span_composition_predicts(answered: tuple[Path, Path]) -> None:
    """[Note: identical spans predict alike]: every ZeRO table of the simulated profile, with the classes and without."""
    from hybridplan.predict.memory import MemoryPredictor

    cache, _ = answered
    plain = [p for p in (cache / "profiles").glob("*.sqlite")]
    for db in plain:
        fast = MemoryPredictor.from_db(db)
        slow = MemoryPredictor.from_db(db)
        assert fast.layer_classes == ["embed", "decoder(window=None)", "decoder(window=None)", "head"]
        slow.layer_classes = None
        for kind, degree, tensor in (("data", 2, 0), ("data", 4, 0), ("data+tensor", 4, 2)):
            for zero in (1, 2, 3):
                for after in (0, 1, 3):
                    a = fast.stage_memory_matrix(kind, degree, after, 4, tensor_degree=tensor, zero=zero)
                    b = slow.stage_memory_matrix(kind, degree, after, 4, tensor_degree=tensor, zero=zero)
                    assert np.array_equal(a, b), (db.name, kind, degree, zero, after)


def test_plan_for_megatron_keeps_to_its_plans_and_simulates_its_gradient_buffers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--engine megatron``: the profiles are simulated with Megatron-LM's fp32 gradient buffers (their stages
    keyed by it), the plan is one Megatron-LM runs and whose memory is modelled (1F1B, no ZeRO, no tensor part in
    the last stage: runtime/engines.py accepts it), and --verify's simulated devices, run with the buffers, agree
    with the prediction."""
    from hybridplan.profiling.database import ProfileDB
    from hybridplan.runtime.engines import engine_run_options

    cache, out = tmp_path / "cache", tmp_path / "megatron.json"
    assert main([*_QUESTION, "--precision", "bf16", "--engine", "megatron", "--cache-dir", str(cache),
                 "--out", str(out), "--verify"]) == 0
    printed = capsys.readouterr()
    plan = Plan.load(out)
    assert plan.schedule == "1f1b" and not any(s.zero for s in plan.stages)
    assert plan.stages[-1].tensor_degree <= 1
    assert engine_run_options("megatron", plan=plan, precision="bf16") == {"grad_accumulation": "fp32-buffer",
                                                                           "adamw": "fused"}
    profiles = list((cache / "profiles").glob("*.sqlite"))
    assert len(profiles) == 2
    for db in profiles:
        with ProfileDB(db) as profile:
            assert profile.run_options["grad_accumulation"] == "fp32-buffer" and profile.run_options["adamw"] == "fused"
    errors = [word for line in printed.out.splitlines() for word in line.split() if word.endswith("%")]
    assert len(errors) == plan.num_devices and all(e in ("+0.00%", "-0.00%") for e in errors), printed.out
    assert "engine megatron" in printed.err


@pytest.mark.parametrize("extra, wanted", [
    (["--engine", "deepspeed"], "not modelled"),
    (["--engine", "torchtitan"], "estimate-memory --plan PLAN --engine torchtitan"),
    (["--engine", "megatron", "--precision", "fp16"], "fp16"),
    (["--engine", "megatron", "--schedule", "gpipe"], "1F1B"),
    (["--engine", "megatron", "--fewest-devices", "--device-memory", "1GiB"], "--fewest-devices"),
    (["--engine", "megatron", "--zero"], "--zero"),
])
def test_an_engine_that_cannot_be_planned_for_is_refused_before_any_work(
        extra: list[str], wanted: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_QUESTION, *extra, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert wanted in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not list(tmp_path.rglob("*.sqlite"))
