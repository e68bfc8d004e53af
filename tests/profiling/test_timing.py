"""Layer-time profiling (profiling/timing.py): runs, medians, the database, resuming, export; one real run
through the CLI."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import ProfileError
from hybridplan.models.slice import ModelSlice
from hybridplan.models.zoo import get_model
from hybridplan.profiling.links import LinkCosts
from hybridplan.profiling.stored_time_profile import time_profile_from_store
from hybridplan.profiling.time_profile import TimeProfile
from hybridplan.profiling.store import ProfileStore
from hybridplan.profiling.timing import (
    LayerTiming,
    TimingConfig,
    default_tensor_degrees,
    median_layer_times,
    timing_chunks,
)

MLP = "tests.cli.user_models:mlp"  # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10)


STEP_S, OVERHEAD_S = 0.002, 0.01
"""The fake ranks' optimizer step (x (rank + 1)) and unexplained seconds (+ 0.001 rank) per iteration."""


def _device(rank: int, scale: float, layers: int, microbatches: int = 2, iterations: int = 2) -> SimpleNamespace:
    """A rank's layer_seconds: warm-up iteration 100 s per layer, then micro-batch j takes scale * (l + 1) * (1 + j);
    its iteration seconds are its layers + its step + its overhead."""
    records = [{"forward": [[100.0] * layers] * microbatches, "backward": [[100.0] * layers] * microbatches,
                "step": [[100.0]]}]
    seconds = [1000.0]
    for _ in range(iterations - 1):
        rows = [[scale * (l + 1) * (1 + j) for l in range(layers)] for j in range(microbatches)]
        step = STEP_S * (rank + 1)
        records.append({"forward": rows, "backward": [[2 * v for v in r] for r in rows], "step": [[step]]})
        seconds.append(3 * sum(map(sum, rows)) + step + OVERHEAD_S + 0.001 * rank)
    return SimpleNamespace(device=rank, layer_seconds=records, iteration_seconds=seconds)


class FakeRuntime:
    """Stands in for the launcher: records the configs, answers with synthetic layer times."""

    def __init__(self, fail_degree: int | None = None, shared_degree: int | None = None) -> None:
        self.configs: list = []
        self.fail_degree = fail_degree
        self.shared_degree = shared_degree
        """Runs of this degree answer as the launcher does when their ranks shared a GPU (runtime/shared_gpu.py)."""

    def __call__(self, cfg):  # type: ignore[no-untyped-def]
        self.configs.append(cfg)
        stage = cfg.plan.stages[0]
        if stage.degree == self.fail_degree:
            return SimpleNamespace(ok=False, status="oom", reason="device 0 (stage 0): out of memory", devices=[])
        scale = 1e-3 * stage.degree * cfg.plan.microbatch_size
        devices = [_device(r, scale * (1 + 0.1 * r), stage.stop) for r in range(stage.degree)]
        return SimpleNamespace(ok=True, status="ok", reason=None, devices=devices,
                               iteration_seconds_representative=stage.degree != self.shared_degree)


def _timing(store, runtime, **kw):  # type: ignore[no-untyped-def]
    cfg = TimingConfig(**{"model": MLP, "cluster": Cluster.parse("1x2"), "micro_batch_sizes": (4, 2), **kw})
    return LayerTiming(cfg, store, execute=runtime)


def test_runs_medians_database_and_export(tmp_path):
    runtime = FakeRuntime()
    with ProfileStore(tmp_path / "p.sqlite") as store:
        timing = _timing(store, runtime)
        assert timing.degrees == (1, 2) and timing.device_type == "cpu"
        summary = timing.run()
        assert summary.runs_executed == 4 and not summary.failed
        cfg = runtime.configs[-1]
        stage = cfg.plan.stages[0]
        assert (stage.parallelism, stage.degree, stage.devices) == ("tensor", 2, (0, 1))
        assert cfg.layer_timing and not cfg.track_memory and cfg.iterations == 3 and cfg.plan.num_microbatches == 4
        profile = time_profile_from_store(store)
    assert profile.tensor_comm_in_times and profile.num_layers == 5
    assert {(t.tensor_degree, t.micro_batch_size) for t in profile.timings} == {(1, 2), (1, 4), (2, 2), (2, 4)}
    t = next(t for t in profile.timings if (t.tensor_degree, t.micro_batch_size) == (2, 4))
    # median over the 2 micro-batches of (1 + j) -> 1.5; slowest rank (x 1.1); warm-up dropped
    assert t.forward_s[2] == pytest.approx(1e-3 * 2 * 4 * 1.1 * 3 * 1.5)
    assert t.backward_s[2] == pytest.approx(2 * t.forward_s[2])
    assert [l.activation_bytes_per_sample for l in profile.layers] == [128.0, 128.0, 128.0, 128.0, 40.0]
    assert profile.layers[0].parameter_bytes == (16 * 32 + 32) * 4
    # the step of the slowest rank (rank 1: 2 x STEP_S) over the bytes one rank of 2 holds; the overhead of
    # the rank with the least (rank 0)
    mlp_bytes = ((16 * 32 + 32) + (32 * 32 + 32) + (32 * 10 + 10)) * 4
    assert t.optimizer_s_per_byte == pytest.approx(2 * STEP_S / (mlp_bytes / 2))
    assert t.overhead_s == pytest.approx(OVERHEAD_S)
    assert TimeProfile.from_dict(json.loads(profile.to_json())) == profile


def test_links_are_measured_once_and_reach_the_profile(tmp_path):
    calls = []

    def links(device_type: str) -> LinkCosts:
        calls.append(device_type)
        return LinkCosts(backend="gloo", allreduce_latency_s=1e-4, allreduce_bandwidth=2e9, p2p_latency_s=3e-4,
                         p2p_bandwidth=None)

    with ProfileStore(tmp_path / "p.sqlite") as store:
        cfg = TimingConfig(model=MLP, cluster=Cluster.parse("1x2"), micro_batch_sizes=(4,), tensor_degrees=(1,))
        LayerTiming(cfg, store, execute=FakeRuntime(), links=links).run()
        LayerTiming(cfg, store, execute=FakeRuntime(), links=links).run()  # resumed: not measured again
        profile = time_profile_from_store(store)
    assert calls == ["cpu"] and profile.links == links("cpu")
    # Linear(16, 32), ReLU, Linear(32, 32), ReLU, Linear(32, 10): weight and bias per Linear, nothing per ReLU
    assert [layer.parameter_tensors for layer in profile.layers] == [2, 0, 2, 0, 2]


def test_resume_and_failures(tmp_path):
    db = tmp_path / "p.sqlite"
    with ProfileStore(db) as store:
        summary = _timing(store, FakeRuntime(fail_degree=2)).run()
        assert summary.runs_executed == 2 and len(summary.failed) == 2 and "out of memory" in summary.failed[0]
        warnings: list[str] = []
        profile = time_profile_from_store(store, warn=warnings.append)
        assert {t.tensor_degree for t in profile.timings} == {1} and warnings == []  # nothing at all of degree 2
    with ProfileStore(db) as store:
        runtime = FakeRuntime()
        summary = _timing(store, runtime).run()
        assert (summary.runs_resumed, summary.runs_executed) == (2, 2)
        assert {c.plan.stages[0].degree for c in runtime.configs} == {2}


def test_times_of_ranks_that_shared_a_gpu_are_not_recorded(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        summary = _timing(store, FakeRuntime(shared_degree=2)).run()
        assert summary.runs_executed == 2 and len(summary.failed) == 2
        assert all("shared a GPU" in f and "tensor degree 2" in f for f in summary.failed)
        assert {t.tensor_degree for t in time_profile_from_store(store).timings} == {1}


def test_chunks_slices_and_layers_that_cannot_be_split(tmp_path):
    model = get_model("gpt-tiny")
    assert timing_chunks(model, 1, 4) == [(0, 4), (4, 8), (8, 10)]
    runtime = FakeRuntime()
    with ProfileStore(tmp_path / "p.sqlite") as store:
        _timing(store, runtime, model="gpt-tiny", micro_batch_sizes=(2,), tensor_degrees=(1,), max_layers_per_run=4).run()
        assert [c.model.name if isinstance(c.model, ModelSlice) else c.model for c in runtime.configs] == [
            "gpt-tiny[0:4]", "gpt-tiny[4:8]", "gpt-tiny[8:10]"]
        # a degree-2 table where layer 9 could not be split gets layer 9's degree-1 time
        store.record_layer_times("cpu", 2, 2, [(l, 1.0, 2.0, 8) for l in range(9)])
        store.set_meta("time_unsplittable", {"2": [9]})
        profile = time_profile_from_store(store)
        t1, t2 = (next(t for t in profile.timings if t.tensor_degree == d) for d in (1, 2))
        assert t2.forward_s[:9] == (1.0,) * 9 and t2.forward_s[9] == t1.forward_s[9]
        store.set_meta("time_unsplittable", {})
        warnings: list[str] = []
        assert {t.tensor_degree for t in time_profile_from_store(store, warn=warnings.append).timings} == {1}
        assert "incomplete (layer 9 missing)" in warnings[0]


def test_refusals(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        with pytest.raises(ProfileError, match="fake tensors that take no time"):
            _timing(store, FakeRuntime(), run_options={"backend": "sim"})
        with pytest.raises(ProfileError, match="holds no layer times"):
            time_profile_from_store(store)
        _timing(store, FakeRuntime())
        with pytest.raises(ProfileError, match="layer times of another setup"):
            _timing(store, FakeRuntime(), run_options={"precision": "bf16"})
        with pytest.raises(ProfileError, match="cannot time tensor degree 4"):
            _timing(store, FakeRuntime(), tensor_degrees=(1, 4))
    assert default_tensor_degrees(get_model("gpt-tiny"), Cluster.parse("2x4")) == (1, 2, 4)


def test_median_of_a_result():
    result = SimpleNamespace(devices=[_device(0, 1.0, 2, microbatches=3), _device(1, 2.0, 2, microbatches=3)])
    forward, backward, samples = median_layer_times(result, 2)
    assert forward == [4.0, 8.0] and backward == [8.0, 16.0] and samples == 3


@pytest.mark.distributed
def test_profile_time_cli_on_the_real_runtime(tmp_path, capsys):
    from hybridplan.cli import main

    db, out = tmp_path / "p.sqlite", tmp_path / "t.json"
    argv = ["profile", "--model", MLP, "--cluster", "1x2", "--global-batch-size", "16", "--num-microbatches", "4",
            "--db", str(db), "--time", "--time-degrees", "1,2", "--time-micro-batch-sizes", "4", "--time-out", str(out)]
    assert main(argv) == 0
    profile = TimeProfile.load(out)
    assert {(t.tensor_degree, t.micro_batch_size) for t in profile.timings} == {(1, 4), (2, 4)}
    assert all(sum(t.forward_s) > 0 and sum(t.backward_s) > 0 for t in profile.timings)
    # AdamW's step takes time; the overhead is a residual, >= 0 by construction
    assert all(t.optimizer_s_per_byte and t.optimizer_s_per_byte > 0 and t.overhead_s is not None for t in profile.timings)
    assert profile.host_cores == len(os.sched_getaffinity(0))
    # the links, measured by two gloo processes of the runtime: a message costs time
    assert profile.links is not None and profile.links.backend == "gloo"
    assert profile.links.allreduce_latency_s > 0 and profile.links.p2p_latency_s > 0
    out = capsys.readouterr().out
    assert "2 timing runs executed" in out and "links (gloo): all-reduce" in out
    assert main(argv) == 0
    assert "0 timing runs executed, 2 resumed" in capsys.readouterr().out
