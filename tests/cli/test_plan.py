"""``hybridplan plan --objective memory`` as a user calls it: a plan that does not fit the devices is never the
answer, the search says what it holds fixed, and targets far beyond the profile are warned about; and the options
the command refuses before it dispatches (the throughput and baseline paths: tests/cli/test_plan_throughput.py)."""

from __future__ import annotations

import json

import pytest

from hybridplan.cli import main
from hybridplan.predict.memory import MemoryPredictor
from hybridplan.units import format_bytes


@pytest.fixture
def base(mlp_files):
    return ["plan", "--db", str(mlp_files / "p.sqlite"), "--cluster", "1x4"]


def _best(base, capsys) -> dict:
    assert main(base + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_plan_over_the_capacity_is_an_error_naming_the_device(base, mlp_files, capsys):
    out = mlp_files / "over.json"
    assert main(base + ["--device-memory", "1KiB", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the lowest-memory plan does not fit: device" in err and "more than its 1.00 KiB" in err
    assert "Traceback" not in err and not out.exists()


def test_the_excess_is_the_predicted_peak_minus_the_capacity(base, mlp_files, capsys):
    best = _best(base, capsys)
    peak = best["predicted_peak_bytes"]
    capacity = peak - 1000
    assert main(base + ["--device-memory", str(capacity)]) == 2
    assert f"needs {format_bytes(peak)}, {format_bytes(1000)} more than its {format_bytes(capacity)}" in capsys.readouterr().err


def test_a_plan_at_exactly_the_capacity_fits(base, mlp_files, capsys):
    best = _best(base, capsys)
    out = mlp_files / "exact.json"
    assert main(base + ["--device-memory", str(best["predicted_peak_bytes"]), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["stages"] == best["stages"]
    predicted = MemoryPredictor.from_db(mlp_files / "p.sqlite").predict(
        __import__("hybridplan.plan", fromlist=["Plan"]).Plan.from_dict(written))
    assert predicted.peak_memory_bytes <= best["predicted_peak_bytes"]


def test_the_search_says_what_it_holds_fixed(base, capsys):
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "held fixed: schedule 1f1b, global batch 32 in 2 micro-batches of 16" in err
    assert "--num-microbatches" in err and "--objective pareto" in err


@pytest.mark.parametrize("args, message", [
    (["--device-memory", "0"], "is not a capacity"),
    (["--global-batch-size", "0"], "argument --global-batch-size: must be a positive integer, got '0'"),
    (["--num-microbatches", "0"], "argument --num-microbatches: must be a positive integer, got '0'"),
    (["--num-microbatches", "-2"], "must be a positive integer"),
])
def test_zeros_are_refused(base, capsys, args, message):
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_target_far_beyond_the_profile_is_warned_about_once(base, capsys):
    assert main(base + ["--global-batch-size", str(2**22)]) == 0  # far beyond the profile, within the bound of 2**24
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "extrapolated" in warnings[0] and "the largest profiled (16" in warnings[0]
    assert main(base + ["--global-batch-size", "64"]) == 0  # within 4x of the profiled 16: no warning
    assert "warning:" not in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["plan", "--mode", "2bw", "--db", "{d}/p.sqlite", "--cluster", "1x4"], "plans for throughput"),
    (["plan", "--objective", "throughput", "--mode", "bayesian", "--db", "{d}/p.sqlite", "--cluster", "1x4"], "solves the memory"),
    (["plan", "--cluster", "1x4"], "without --db, plan profiles the model"),
])
def test_bad_input_exits_2(files, capsys, args, message):
    assert main([a.format(d=files) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_extended_space_is_never_worse_and_holds_the_data_x_tensor_stage(base, mlp_files, capsys):
    """``--space extended`` searches CAPTURE's plans and the data x tensor ones: its best is at most CAPTURE's best
    and at most the one-stage 2 x 2 plan (which only it can choose), each predicted from the same database."""
    from hybridplan.plan import Plan

    capture = _best(base, capsys)
    extended = _best(base + ["--space", "extended"], capsys)
    assert extended["predicted_peak_bytes"] <= capture["predicted_peak_bytes"]
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    written = Plan.from_dict(extended)
    assert predictor.predict(written).peak_memory_bytes == extended["predicted_peak_bytes"]
    two_by_two = Plan.from_dict({**capture, "stages": [{"layers": [0, 5], "parallelism": "data+tensor", "degree": 4,
                                                        "tensor_degree": 2, "devices": [0, 1, 2, 3]}]})
    assert extended["predicted_peak_bytes"] <= predictor.predict(two_by_two).peak_memory_bytes


@pytest.mark.parametrize("args, message", [
    (["--pipeline-only", "--space", "extended"], "--pipeline-only and --space extended contradict each other"),
    (["--space", "extended", "--objective", "throughput", "--time-profile", "{d}/t.json"],
     "--fewest-devices, --pipeline-only and --space apply to --objective memory"),
    (["--space", "everything"], "argument --space: invalid choice"),
    (["--zero", "--pipeline-only"], "--zero searches sharded data stages, which --pipeline-only excludes"),
    (["--allow-cross-node", "--pipeline-only"], "--allow-cross-node adds data stages over whole nodes"),
    (["--zero", "--objective", "throughput", "--mode", "2bw", "--time-profile", "{d}/t.json"],
     "--zero and --recompute-db choose per-stage options of AMP's plans, not PipeDream-2BW's"),
])
def test_the_space_option_is_checked(base, mlp_files, capsys, args, message):
    assert main(base + [a.format(d=mlp_files) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.fixture(scope="module")
def recompute_db(mlp_recompute_db):
    """The MLP profiled as ``p.sqlite`` was (tests/conftest.py), with activation checkpointing: the session's
    ``mlp_recompute_db``."""
    return mlp_recompute_db


def test_recompute_db_lets_each_stage_recompute_and_predict_agrees(base, mlp_files, recompute_db, capsys, tmp_path):
    """With a recompute profile the search may recompute any stage. Pipeline-only on 1x4 at a batch of 4096 the
    MLP's peak sits on a one-layer stage whose recompute holds less (the two profiles say so): the search with
    --recompute-db finds a strictly lower peak, on a plan that recomputes some stage, no higher than the plain
    best or that plan with every stage recomputed; and the written plan's peak is what ``predict --recompute-db``
    says for it."""
    from hybridplan.plan import Plan

    big = base + ["--pipeline-only", "--global-batch-size", "4096"]
    plain = _best(big, capsys)
    both = _best(big + ["--recompute-db", str(recompute_db)], capsys)
    assert both["predicted_peak_bytes"] < plain["predicted_peak_bytes"]
    assert any(s.get("recompute") == "full" for s in both["stages"])
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite", recompute_db=recompute_db)
    all_recomputed = Plan.from_dict({**plain, "stages": [{**s, "recompute": "full"} for s in plain["stages"]]})
    assert both["predicted_peak_bytes"] <= predictor.predict(all_recomputed).peak_memory_bytes
    written = tmp_path / "best.json"
    written.write_text(json.dumps(both))
    assert main(["predict", "--db", str(mlp_files / "p.sqlite"), "--recompute-db", str(recompute_db),
                 "--plan", str(written), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_memory_bytes"] == both["predicted_peak_bytes"]


def test_recompute_db_must_be_a_recompute_profile(base, mlp_files, capsys):
    assert main(base + ["--recompute-db", str(mlp_files / "p.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "was profiled without recompute" in err and "Traceback" not in err


def test_allow_cross_node_finds_the_stage_over_both_nodes(mlp_files, capsys):
    """On 2x2, one node per stage needs two stages; across nodes the extended space also has one stage of data x2 +
    tensor x2 over both nodes (its tensor groups one per node). The answer is at most the one-node best and at most
    that stage, each as the predictor says; the written plan is valid on the mesh."""
    from hybridplan.plan import Cluster, Plan

    base = ["plan", "--db", str(mlp_files / "p.sqlite"), "--cluster", "2x2", "--space", "extended"]
    one_node = _best(base, capsys)
    across = _best(base + ["--allow-cross-node"], capsys)
    assert across["predicted_peak_bytes"] <= one_node["predicted_peak_bytes"]
    predictor = MemoryPredictor.from_db(mlp_files / "p.sqlite")
    written = Plan.from_dict(across)
    written.validate(num_layers=5, cluster=Cluster.uniform(2, 2))
    assert predictor.predict(written).peak_memory_bytes == across["predicted_peak_bytes"]
    spanning = Plan.from_dict({**one_node, "stages": [{"layers": [0, 5], "parallelism": "data+tensor", "degree": 4,
                                                       "tensor_degree": 2, "devices": [0, 1, 2, 3]}]})
    spanning.validate(num_layers=5, cluster=Cluster.uniform(2, 2))
    assert across["predicted_peak_bytes"] <= predictor.predict(spanning).peak_memory_bytes


def test_fewest_devices_searches_the_extended_space(mlp_files, recompute_db, capsys):
    """--fewest-devices with --space extended, --zero, --recompute-db and --allow-cross-node answers the smallest
    sub-mesh of 2x2 (by devices, then fewer nodes) whose best plan in that space fits; the expectation comes from
    the plain memory search run on each sub-mesh with the same options. The capacity is the extended best peak of
    the smallest shape on which it is lower than CAPTURE's, so there the options are what makes the model fit
    (and without them the answer is a larger mesh, or none)."""
    db = str(mlp_files / "p.sqlite")
    options = ["--space", "extended", "--zero", "--recompute-db", str(recompute_db), "--allow-cross-node"]
    shapes = ["1x1", "1x2", "2x1", "2x2"]  # by devices, then fewer nodes
    batch = ["--global-batch-size", "4096"]  # activations dominate: recompute and sharding matter

    def peak(shape: str, extra: list[str]) -> int:
        return _best(["plan", "--db", db, "--cluster", shape] + batch + extra, capsys)["predicted_peak_bytes"]

    extended = {s: peak(s, options) for s in shapes}
    capture = {s: peak(s, []) for s in shapes}
    assert all(extended[s] <= capture[s] for s in shapes)
    target = next(s for s in shapes if extended[s] < capture[s])
    capacity = extended[target]
    expected = next(s for s in shapes if extended[s] <= capacity)
    fewest = ["plan", "--db", db, "--cluster", "2x2", "--device-memory", str(capacity), "--fewest-devices"] + batch
    answer = _best(fewest + options, capsys)
    assert answer["cluster"] == expected and answer["predicted_peak_bytes"] == extended[expected]
    plain = next((s for s in shapes if capture[s] <= capacity), None)
    assert plain != expected
    if plain is None:
        assert main(fewest) == 2 and "fits on no sub-mesh" in capsys.readouterr().err
    else:
        assert _best(fewest, capsys)["cluster"] == plain
