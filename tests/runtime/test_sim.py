"""The simulated backend: per-stage reports, copies across a stage, GPU terms, failures, paper sizes."""

from __future__ import annotations

import functools
import gc
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from hybridplan.plan.cluster import Cluster
from hybridplan.errors import UsageError
from hybridplan.runtime.config import RunConfig
from hybridplan.runtime.gpu_memory import (
    CUDA_CONTEXT_BYTES,
    communicators_of,
    cuda_block_bytes,
    estimate_overhead_bytes,
)
from hybridplan.runtime.launch import launch
from hybridplan.runtime.memory import StorageTracker
from hybridplan.runtime.result import RankReport, RunResult
from hybridplan.runtime.sim import fake_process_group, frozen_heap, simulate, simulate_stage
from tests.runtime.util import make_plan

EXAMPLE = make_plan("1f1b", 16, 4, [(0, 3, "tensor", [0, 1]), (3, 7, "none", [2]), (7, 10, "data", [3, 4])])
REPORT_KEYS = {
    "status", "rank", "stage", "rank_in_stage", "node", "in_flight", "iteration_peaks", "static", "data",
    "breakdowns", "seconds", "losses", "timeline", "overhead_bytes", "layer_seconds", "reserved_peaks", "workspaces",
}  # fmt: skip


def config(plan=EXAMPLE, cluster="1x5", **kw) -> RunConfig:
    memory = kw.pop("memory", None)
    kw = {"model": "gpt-tiny", "iterations": 2, "backend": "sim", **kw}
    return RunConfig(plan=plan, cluster=Cluster.parse(cluster, device_memory=memory), **kw)


@functools.cache
def _example() -> RunResult:
    """``launch(config())``: the example plan on simulated CPU devices (one device per stage, copied to the others),
    run once for the three tests that read it (none changes it)."""
    return launch(config())


def test_simulate_stage_reports_like_a_real_rank():
    report = simulate_stage(config(), 1)
    assert isinstance(report, RankReport) and set(report.to_dict()) == REPORT_KEYS
    assert (report.rank, report.stage, report.rank_in_stage, report.in_flight) == (2, 1, 0, 2)
    assert report.losses == [] and report.overhead_bytes is None and report.workspaces is None  # a CPU holds none
    assert len(report.iteration_peaks) == 2 and report.iteration_peaks[1] > report.static[1] > 0
    assert [t["action"] for t in report.timeline] == "F0 F1 B0 F2 B1 F3 B2 B3 step".split()
    assert simulate_stage(config(), 0, rank=1).rank == 1
    with pytest.raises(UsageError, match="stage index 3 is out of range"):
        simulate_stage(config(), 3)
    with pytest.raises(UsageError, match="device 4 is not in stage 0"):
        simulate_stage(config(), 0, rank=4)


def test_one_device_per_stage_is_every_device():
    """[Note: simulating one device per stage]: the copies equal simulating each device."""
    copied = _example()  # launch simulates with distinct_only=True
    every = simulate(config(), distinct_only=False)
    assert copied.ok and every.ok
    strip = lambda r: [{k: v for k, v in d.__dict__.items() if k != "iteration_seconds"} for d in r.devices]  # noqa: E731
    assert strip(copied) == strip(every)


def test_sim_result_has_the_real_form():
    result = _example()
    assert result.ok and result.iteration_seconds is None and result.losses == []
    assert [(d.device, d.stage, d.rank_in_stage) for d in result.devices] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 2, 0), (4, 2, 1)]
    assert result.config["backend"] == "sim"
    again = RunResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.to_dict() == result.to_dict()
    assert "peak memory" in result.summary()


def test_sim_runs_out_of_memory_like_a_real_device():
    result = launch(config(memory="1MiB"))
    assert result.status == "oom" and result.devices == []
    assert result.reason.startswith("device 0 (stage 0): DeviceOutOfMemory: out of memory")
    assert "capacity 1048576 bytes" in result.reason


class _Node:
    """A garbage cycle of one object (``self.me = self``), weakly referable."""


def test_frozen_heap_freezes_for_the_block_and_leaves_another_frozen_set_alone():
    """Objects alive before the block are frozen in it, a cycle made inside is still collected, nothing is frozen
    after it; a frozen set that was there before is left as it is (not released at the end)."""
    import weakref

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        node = _Node()
        node.me = node
        dead = weakref.ref(node)
        del node
        gc.collect()
        assert dead() is None
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() == before
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_inside_the_block_the_heap_is_known_frozen_without_walking_the_frozen_set(monkeypatch):
    """[Note: the frozen set is counted by walking it] (runtime/heap.py): gc.get_freeze_count() walks every frozen
    object, so in the block neither heap_frozen() nor a nested block nor a simulated device asks it."""
    from hybridplan.runtime import heap

    real = gc.get_freeze_count
    with frozen_heap():
        def walked() -> int:
            raise AssertionError("gc.get_freeze_count() called inside the block")

        monkeypatch.setattr(heap.gc, "get_freeze_count", walked)
        assert heap.heap_frozen()
        with frozen_heap():
            assert heap.heap_frozen()
        assert heap.heap_frozen()  # the inner block released nothing
        report = simulate_stage(RunConfig(model="gpt-tiny", plan=ONE_DEVICE, cluster=Cluster.parse("1x1"), backend="sim"), 0)
        assert report.static[-1] > 0
        monkeypatch.setattr(heap.gc, "get_freeze_count", real)
    assert not heap.heap_frozen() and real() == 0


def test_cannot_simulate_inside_a_process_group():
    with fake_process_group(0, 1):
        with pytest.raises(UsageError, match="already has a torch.distributed process group"):
            simulate_stage(config(), 0)


# ---------------------------------------------------------------------------------------------- GPU terms
def test_tracker_counts_cuda_blocks_and_drops_host_tensors():
    tr = StorageTracker(rounding=cuda_block_bytes)
    with tr:
        a = torch.empty(1)  # 4 bytes -> one 512-byte block
        b = torch.empty(0)  # nothing
        c = torch.empty(129)  # 516 bytes -> 1024
        assert tr.current == 1536
        tr.host_resident(a)
        assert tr.current == 1024
        del a, b, c
    exact = StorageTracker()
    with exact:
        d = torch.empty(1)
        exact.host_resident(d)  # on a CPU device nothing lives elsewhere
        assert exact.current == 4
        del d


def test_gpu_terms_round_every_level_and_report_reserved_outside_and_total():
    result = launch(config(device_type="cuda"))
    assert result.ok
    for d in result.devices:
        levels = [d.peak_memory_bytes, d.static_memory_bytes] + [t[k] for t in d.timeline for k in ("before", "peak", "after")]
        assert all(v % 512 == 0 for v in levels)
        # a GPT runs matmuls (cuBLAS) and attention on every device; its communicators depend on the device
        assert d.overhead_bytes == estimate_overhead_bytes(EXAMPLE, d.device, {"cublas", "attention"})
        assert d.reserved_peak_bytes % (2 * 2**20) == 0 and d.reserved_peak_bytes >= d.peak_memory_bytes
        assert d.total_peak_bytes == d.reserved_peak_bytes + d.overhead_bytes
        assert d.peak_breakdown["workspace"] == 65 * 2**20  # ../shared/notes/gpu-h100-facts.md: 68,157,440 B
    cpu = _example()
    assert all(g.peak_memory_bytes >= c.peak_memory_bytes for g, c in zip(result.devices, cpu.devices))
    assert all(c.reserved_peak_bytes is None and c.total_peak_bytes is None for c in cpu.devices)


ONE_DEVICE = make_plan("1f1b", 8, 2, [(0, 10, "none", [0])])


def test_gpt_tiny_on_one_simulated_h100_within_half_a_percent_of_the_measured_peak():
    """../shared/notes/gpu-h100-facts.md: gpt-tiny fp32, B 8 / m 2, 1F1B on one H100 peaked at 77,225,472 bytes
    (torch.cuda.max_memory_allocated); the issue's target is 0.5%. A one-device plan creates no NCCL
    communicator: outside the allocator, the context, cuBLAS and attention (618.8 + 66 + 16 MiB, measured)."""
    d = launch(config(ONE_DEVICE, "1x1", device_type="cuda", iterations=3)).devices[0]
    assert abs(d.peak_memory_bytes - 77_225_472) / 77_225_472 < 0.005
    assert d.overhead_bytes == round(618.8 * 2**20) + 82 * 2**20


def test_a_cuda_capacity_is_the_whole_device_memory():
    """--device-memory on CUDA bounds the total (reserved + outside the allocator), not the tensors alone."""
    fits = launch(config(ONE_DEVICE, "1x1", device_type="cuda")).devices[0]
    assert fits.total_peak_bytes > 700 * 2**20  # the context and libraries alone take 700.8 MiB
    ok = launch(config(ONE_DEVICE, "1x1", device_type="cuda", memory=fits.total_peak_bytes))
    assert ok.ok and ok.devices[0].total_peak_bytes == fits.total_peak_bytes
    # too little for the tensors at their peak once the memory outside the allocator is taken
    short = launch(config(ONE_DEVICE, "1x1", device_type="cuda", memory=fits.overhead_bytes + fits.peak_memory_bytes - 1))
    assert short.status == "oom" and "DeviceOutOfMemory" in short.reason
    # on a CPU the same capacity holds the tensors easily: it bounds tensor bytes only
    assert launch(config(ONE_DEVICE, "1x1", memory=fits.peak_memory_bytes)).ok


def test_communicators_of_the_example_plan():
    # world, the tensor-parallel pair, and the 2-rank pair to device 2 (forward out, gradients in)
    assert communicators_of(EXAMPLE, 0) == [5, 2, 2]
    # device 2 talks to both tensor-parallel ranks (gradients back) and both data-parallel ranks
    assert communicators_of(EXAMPLE, 2) == [5, 2, 2, 2, 2]
    assert communicators_of(EXAMPLE, 4) == [5, 2, 2]


# ---------------------------------------------------------------------------------------------- paper sizes
GPT13_STAGE = make_plan("1f1b", 32, 8, [(0, 7, "none", [0]), (7, 13, "none", [1]), (13, 19, "none", [2]), (19, 26, "none", [3])])


@pytest.mark.slow
def test_one_paper_size_device_needs_little_host_memory():
    """gpt3-1.3b layers [0, 7) (embedding + 6 blocks), 8 micro-batches of 4, fp32: an 18 GiB device
    simulated in a fresh process whose peak RSS stays under 1 GiB (measured ~340 MiB)."""
    script = textwrap.dedent(
        f"""
        import json, resource
        from hybridplan.plan.cluster import Cluster
        from hybridplan.plan import Plan
        from hybridplan.runtime.config import RunConfig
        from hybridplan.runtime.sim import simulate_stage
        plan = Plan.from_dict({json.dumps(GPT13_STAGE.to_dict())})
        report = simulate_stage(RunConfig(model="gpt3-1.3b", plan=plan, cluster=Cluster.parse("1x4")), 0)
        print(json.dumps({{"peak": report.iteration_peaks[-1], "parts": report.breakdowns[-1],
                          "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Hand count: embedding (51200 + 1024) x 2048 and 6 blocks of 12 h^2 + 13 h (h = 2048) parameters.
    h = 2048
    params = (51200 + 1024) * h + 6 * (12 * h * h + 13 * h)
    assert got["parts"]["parameters"] == got["parts"]["gradients"] == 4 * params
    assert got["parts"]["optimizer"] == 8 * params
    assert got["peak"] > 18 * 2**30 and got["rss"] < 2**30


def _mesh_plan(model: str, kind: str, batch: int, micro: int):
    from hybridplan.models.zoo import get_model

    n = get_model(model).num_layers
    cuts = [round(n * i / 4) for i in range(5)]
    return make_plan("1f1b", batch, micro, [(cuts[i], cuts[i + 1], kind, list(range(4 * i, 4 * i + 4))) for i in range(4)])


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, kind, batch",
    [("gpt3-1.3b", "data", 128), ("gpt3-1.3b", "tensor", 128), ("moe-1.3b", "data", 128), ("wresnet-1b", "tensor", 256)],
)
def test_paper_size_plans_on_a_4x4_mesh_of_40gb(model, kind, batch):
    """bf16 mixed precision, CUDA terms, 4 stages x data or tensor 4 on 16 x 40 GiB: they run and fit,
    with every device's parameter, gradient and optimizer bytes 2, 2 and 12 per parameter in allocator blocks."""
    from hybridplan.models.base import LayeredModel
    from hybridplan.models.zoo import get_model

    def blocks(nbytes_per_element: int, tensors: list[torch.Tensor]) -> int:
        return sum(cuda_block_bytes(nbytes_per_element * t.numel()) for t in tensors)

    def within(got: int, nbytes_per_element: int, tensors: list[torch.Tensor], copies: int = 1) -> bool:
        """The caching allocator hands a large block out whole when at most 1 MiB would remain
        (runtime/cuda_allocator.py): each large block may hold up to 1 MiB more than its request."""
        large = sum(cuda_block_bytes(nbytes_per_element * t.numel()) > 2**20 for t in tensors)
        exact = copies * blocks(nbytes_per_element, tensors)
        return exact <= got <= exact + copies * large * 2**20

    plan = _mesh_plan(model, kind, batch, 16)
    cfg = RunConfig(model=model, plan=plan, cluster=Cluster.parse("4x4", device_memory="40GiB"), iterations=2,
                    backend="sim", precision="bf16", device_type="cuda")  # fmt: skip
    result = launch(cfg)
    assert result.ok, result.reason
    m: LayeredModel = get_model(model)
    for d in result.devices:
        stage = plan.stages[d.stage]
        with torch.device("meta"):
            tensors = [p for i in stage.layers for p in m.build_layer(i).parameters()]
        parts = d.peak_breakdown
        if kind == "data":  # each replica holds every parameter, each one its own CUDA block(s)
            assert within(parts["parameters"], 2, tensors) and within(parts["gradients"], 2, tensors)
            assert within(parts["optimizer"], 4, tensors, copies=3)  # master, exp_avg, exp_avg_sq
        else:  # shards, but norms, some biases and the gate stay whole: bounds only
            assert blocks(2, tensors) // stage.degree <= parts["parameters"] <= blocks(2, tensors)
        assert 2**30 < d.peak_memory_bytes < 40 * 2**30 and d.overhead_bytes > CUDA_CONTEXT_BYTES


def test_docstring_examples():
    import doctest

    from hybridplan.runtime import gpu_memory, precision

    for module in (gpu_memory, precision):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__
