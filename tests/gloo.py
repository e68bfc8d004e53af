"""Test helpers: run a function in N real processes on gloo, check tensor-parallel layers against unsplit
ones, and the single-process checks every model family shares.

:class:`GlooPool` spawns ``world`` processes (spawn context, one thread each) that join one gloo group
through a ``FileStore`` in a temporary directory (no TCP ports: other test runs share this machine).
``pool.run(fn, *args)`` calls ``fn(rank, world, *args)`` on every rank; each rank sends back its return
value or its traceback, and the parent raises with every failing rank's traceback or returns the
values by rank. ``fn`` must be importable (a module-level function), its arguments picklable. The
``gloo_pool`` fixture (conftest.py) keeps one pool per world size for the whole session.

``check_tensor_parallel`` is such a function: it splits layers of a model with their
:class:`TensorParallelPlan` and measures how far forward, backward and one AdamW step are from the
unsplit layer; :func:`assert_tensor_parallel_matches` asserts on those measurements in the parent.
"""

from __future__ import annotations

import itertools
import queue
import re
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = [
    "GlooPool",
    "check_tensor_parallel",
    "tensor_parallel_group",
    "WORLD",
    "assert_tensor_parallel_matches",
    "unsplit_name",
    "tensor_parallel_layers",
    "run_chain",
    "run_chain_fake",
    "assert_samples_independent",
    "assert_builds_deterministic",
    "assert_make_batch_deterministic",
    "meta_parameter_count",
]

WORLD = 4
"""Processes of the shared test pool: degree-4 checks use them all, degree-2 checks two pairs at once."""

_launches = itertools.count()
_GRACE_S = 10.0
"""After one rank fails, how long the others get to answer before the pool is killed (they may hang in a
collective that the failed rank never joined)."""


def _serve(rank: int, world: int, store: str, jobs: Any, results: Any) -> None:
    """A worker: join the gloo group, then run ``(fn, args)`` jobs, answering each, until killed."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
    except BaseException:  # report everything to the parent, which shows it
        results.put((rank, "error", traceback.format_exc()))
        return
    while True:
        fn, args = jobs.get()
        try:
            answer: tuple[str, Any] = ("ok", fn(rank, world, *args))
        except BaseException:
            answer = ("error", traceback.format_exc())
        finally:
            torch.set_default_dtype(torch.float32)  # a job may change it; the next starts clean
        results.put((rank, *answer))


class GlooPool:
    """``world`` spawned processes in one gloo group, kept for many jobs (a launch costs seconds of
    imports; a job milliseconds). Any failure kills the pool (a rank may be stuck in a collective);
    the next :meth:`run` starts a fresh one."""

    def __init__(self, world: int, directory: Path) -> None:
        self.world = world
        self.directory = directory
        self._procs: list[Any] = []

    def _start(self) -> None:
        launch = self.directory / f"gloo-{next(_launches)}"
        launch.mkdir(parents=True)
        ctx = mp.get_context("spawn")
        self._jobs = [ctx.Queue() for _ in range(self.world)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(target=_serve, args=(r, self.world, str(launch / "store"), self._jobs[r], self._results))
            for r in range(self.world)
        ]
        for p in self._procs:
            p.daemon = True
            p.start()

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 180.0) -> list[Any]:
        """Run ``fn(rank, world, *args)`` on every rank; return the results by rank.

        Raises:
            AssertionError: with each failing rank's traceback, or naming the ranks that did not answer.
        """
        if not self._procs:
            self._start()
        for jobs in self._jobs:
            jobs.put((fn, args))
        answers: dict[int, tuple[str, Any]] = {}
        deadline, failed_at = time.monotonic() + timeout, None
        while len(answers) < self.world:
            now = time.monotonic()
            if now > deadline or (failed_at is not None and now - failed_at > _GRACE_S):
                break
            try:
                rank, status, value = self._results.get(timeout=0.2)
            except queue.Empty:
                if any(not p.is_alive() for r, p in enumerate(self._procs) if r not in answers):
                    failed_at = failed_at or now
                continue
            answers[rank] = (status, value)
            if status != "ok":
                failed_at = failed_at or now
        problems = [
            f"rank {r}: no answer (exit code {p.exitcode}; timed out, died, or waited on a failed peer)"
            if r not in answers
            else f"rank {r} raised:\n{answers[r][1]}"
            for r, p in enumerate(self._procs)
            if r not in answers or answers[r][0] != "ok"
        ]
        if problems:
            self.close()
            raise AssertionError(f"{fn.__name__} in {self.world} processes failed:\n" + "\n".join(problems))
        return [answers[r][1] for r in range(self.world)]

    def close(self) -> None:
        """Stop the workers. They hold nothing worth saving, and a polite exit (interpreter and gloo
        teardown) costs seconds per process on a busy machine, so they are killed."""
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.join()
        self._procs = []


# ---------------------------------------------------------------------------------------------- TP equivalence
def unsplit_name(name: str) -> str:
    """The unsplit layer's name of a split layer's parameter (parametrizations, RowParallel's ``tp_bias``)."""
    name = re.sub(r"parametrizations\.(\w+)\.original$", r"\1", name)
    return re.sub(r"(^|\.)tp_bias$", r"\1bias", name)


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    """Max absolute difference relative to the largest magnitude of the reference ``b`` (at least ``floor``)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor parameter or gradient (no communication), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def _shard_of(reference: torch.Tensor, param: torch.Tensor, tp: Any) -> torch.Tensor:
    """The slice of an unsplit tensor that this rank's ``param`` holds (the whole tensor if replicated).

    Comparing shards locally, rather than gathering them, keeps the check free of collectives; the
    parent sees every rank's errors, so every shard is checked.
    """
    if not hasattr(param, "placements"):
        return reference
    (placement,) = param.placements
    return reference.chunk(tp.size, dim=placement.dim)[tp.rank]


def _jitter(layer: torch.nn.Module, seed: int) -> None:
    """Perturb every parameter the same way in both copies, so no gradient is zero by construction
    (e.g. a zero-initialised norm scale would hide every gradient before it)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def tensor_parallel_group(rank: int, world: int, degree: int) -> Any:
    """This rank's :class:`TensorParallelGroup` of ``degree`` consecutive ranks (the whole world, or one of
    ``world // degree`` groups made with ``new_group``, as a runtime does for hybrid stages)."""
    from torch.distributed.device_mesh import DeviceMesh

    from hybridplan.models.tensor_parallel import TensorParallelGroup

    if world % degree:
        raise ValueError(f"degree {degree} does not divide the world size {world}")
    group: Any
    if degree == world:
        group = dist.group.WORLD
    else:
        if degree not in _SUBGROUPS:  # every rank creates every group, in the same order
            _SUBGROUPS[degree] = [dist.new_group(list(range(s, s + degree))) for s in range(0, world, degree)]
        group = _SUBGROUPS[degree][rank // degree]
    mesh = DeviceMesh.from_group(group, "cpu")
    return TensorParallelGroup(group=group, mesh=mesh, rank=dist.get_rank(group), size=degree)


_SUBGROUPS: dict[int, list[Any]] = {}


def check_tensor_parallel(
    rank: int,
    world: int,
    cases: list[tuple[Any, list[int]]],
    degree: int | None = None,
    batch: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> dict[str, float]:
    """For each ``(model, layer indices)`` case, split each layer over ``degree`` ranks (default: all)
    and compare it with the unsplit layer on every rank.

    The input of layer ``i`` is the unsplit model's activation on a synthetic batch (the same on all
    ranks). Layers are built in ``dtype``: float64 by default, so that rounding (shards' GEMMs
    blocked differently, partial sums added in another order) stays near 1e-13 and any real
    difference stands out. Returns relative errors keyed ``"<model> <layer> <quantity>"``: output,
    input grad, each parameter's value after sharding, its grad and its value after one AdamW step
    (sharded ones: this rank's shard against the same slice of the unsplit tensor); plus
    ``"<model> <layer> sharded"`` = the number of sharded parameters.
    """
    tp = tensor_parallel_group(rank, world, degree or world)
    torch.set_default_dtype(dtype)
    errors: dict[str, float] = {}
    for model, indices in cases:
        errors.update(_check_model(model, indices, tp, batch, seed, dtype))
    return errors


def _check_model(
    model: Any, indices: list[int], tp: Any, batch: int, seed: int, dtype: torch.dtype
) -> dict[str, float]:
    from hybridplan.models.base import build_layers
    from hybridplan.models.tensor_parallel import is_sharded_parameter

    inputs, _ = model.make_batch(batch, torch.Generator().manual_seed(seed + 1))
    activations = [inputs.to(dtype) if inputs.is_floating_point() else inputs]
    with torch.no_grad():
        for layer in build_layers(model, 0, max(indices, default=0), seed):
            activations.append(layer(activations[-1]))

    errors: dict[str, float] = {}
    for i in indices:
        full, split = build_layers(model, i, i + 1, seed)[0], build_layers(model, i, i + 1, seed)[0]
        _jitter(full, seed + i)
        _jitter(split, seed + i)
        model.tensor_parallel_plan(i).apply(split, tp)
        x = activations[i]
        x_full = x.clone().requires_grad_(x.is_floating_point())
        x_split = x.clone().requires_grad_(x.is_floating_point())
        out_full, out_split = full(x_full), split(x_split)
        weight = torch.randn(out_full.shape, generator=torch.Generator().manual_seed(seed + 100 + i))
        (out_full * weight).sum().backward()
        (out_split * weight).sum().backward()
        key = f"{model.name} {model.layer_name(i)}"
        errors[f"{key} output"] = _rel(out_split, out_full)
        if x.is_floating_point():
            errors[f"{key} input grad"] = _rel(x_split.grad, x_full.grad)
        params = [(unsplit_name(n), p) for n, p in split.named_parameters()]
        errors[f"{key} sharded"] = float(sum(is_sharded_parameter(p) for _, p in params))
        # A gradient that is zero up to rounding (the key bias: softmax ignores it) is compared with the
        # layer's gradient scale instead of its own.
        grad_scale = max((float(p.grad.abs().max()) for p in full.parameters()), default=0.0)
        for name, p in params:
            reference = full.get_parameter(name)
            errors[f"{key} {name} init"] = _rel(_local(p), _shard_of(reference, p, tp))
            errors[f"{key} {name} grad"] = _rel(
                _local(p.grad), _shard_of(reference.grad, p, tp), floor=1e-3 * grad_scale
            )
        if params:
            # eps 1e-3, not 1e-8: Adam divides by |grad| + eps, so a gradient that is zero up to rounding
            # (the key bias) would otherwise make a step of a random sign.
            for module in (full, split):
                torch.optim.AdamW(module.parameters(), lr=1e-2, eps=1e-3).step()
        for name, p in params:
            errors[f"{key} {name} step"] = _rel(_local(p), _shard_of(full.get_parameter(name), p, tp))
    return errors


def assert_tensor_parallel_matches(results: list[dict[str, float]], tolerance: float = 1e-9) -> None:
    """Assert every rank's measurements from :func:`check_tensor_parallel` are within ``tolerance``
    (1e-9: float64 rounding stays near 1e-12; a real mistake gives errors near 1)."""
    for rank, errors in enumerate(results):
        bad = {k: v for k, v in errors.items() if not k.endswith(" sharded") and not v <= tolerance}
        assert not bad, f"rank {rank}: tensor-parallel layer differs from the unsplit one (relative errors): {bad}"


# ---------------------------------------------------------------------------------------------- single-process checks
def tensor_parallel_layers(model: Any, degree: int) -> list[int]:
    """Layers of ``model`` that declare a split and can be split at ``degree``."""
    return [
        i
        for i in range(model.num_layers)
        if model.tensor_parallel_plan(i) is not None and model.tensor_parallel_problem(i, degree) is None
    ]


def run_chain(model: Any, num_samples: int, seed: int = 0, batch_seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward the whole model as a chain of its layers on a synthetic batch and back-propagate the loss.

    Returns ``(output, loss)``. Asserts the loss is finite and every parameter got a finite gradient.
    """
    from hybridplan.models.base import build_layers

    layers = build_layers(model, 0, model.num_layers, seed)
    x, target = model.make_batch(num_samples, torch.Generator().manual_seed(batch_seed))
    for layer in layers:
        x = layer(x)
        assert x.shape[0] == num_samples, f"a layer changed the batch dimension to {x.shape[0]}"
    loss = model.loss(x, target)
    loss.backward()
    assert torch.isfinite(loss), f"loss {loss}"
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"layer {i} {name}: gradient {p.grad}"
    return x.detach(), loss.detach()


def assert_samples_independent(model: Any, num_samples: int = 4, split: int = 2) -> None:
    """The output for a batch equals the outputs for its parts of ``split`` samples (micro-batches or
    data-parallel shards): no batch statistics, no randomness, so every plan computes the same math."""
    from hybridplan.models.base import build_layers

    layers = build_layers(model, 0, model.num_layers, 0)
    x, _ = model.make_batch(num_samples, torch.Generator().manual_seed(1))

    def forward(t: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            t = layer(t)
        return t

    with torch.no_grad():
        whole, parts = forward(x), torch.cat([forward(chunk) for chunk in x.split(split)])
    # Tolerance: the same math on another batch size may round differently (GEMM blocking).
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5)


def assert_builds_deterministic(model: Any, layers: list[int] | None = None) -> None:
    """Same seed: identical weights; another seed: different weights (for layers with parameters)."""
    from hybridplan.models.base import build_layers

    for i in range(model.num_layers) if layers is None else layers:
        a, b, c = (build_layers(model, i, i + 1, seed)[0].state_dict() for seed in (0, 0, 1))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"layer {i} {key} differs between builds with the same seed"
        random = [k for k in a if a[k].is_floating_point() and a[k].numel() > 1 and a[k].std() > 0]
        assert all(torch.equal(a[k], c[k]) for k in a if k not in random)
        assert not random or any(not torch.equal(a[k], c[k]) for k in random), f"layer {i} ignores the seed"


def assert_make_batch_deterministic(model: Any, num_samples: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Same generator state: same batch; another state: another batch. Returns the batch."""
    x1, y1 = model.make_batch(num_samples, torch.Generator().manual_seed(5))
    x2, y2 = model.make_batch(num_samples, torch.Generator().manual_seed(5))
    x3, _ = model.make_batch(num_samples, torch.Generator().manual_seed(6))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert x1.device.type == "cpu" and x1.shape[0] == num_samples and y1.shape[0] == num_samples
    return x1, y1


def run_chain_fake(model: Any, num_samples: int) -> torch.Size:
    """Forward + backward of the whole model under ``FakeTensorMode`` (static shapes only, no memory).

    Returns the output shape.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, target = model.make_batch(num_samples, torch.Generator().manual_seed(0))
    with FakeTensorMode() as mode:
        layers = [model.build_layer(i) for i in range(model.num_layers)]
        out = mode.from_tensor(x)
        for layer in layers:
            out = layer(out)
        model.loss(out, mode.from_tensor(target)).backward()
        assert all(p.grad is not None for layer in layers for p in layer.parameters())
    return out.shape


def meta_parameter_count(model: Any) -> int:
    """Parameters counted on the meta device, checking that every layer builds there."""
    total = 0
    with torch.device("meta"):
        for i in range(model.num_layers):
            layer = model.build_layer(i)
            assert all(p.device.type == "meta" for p in layer.parameters()), f"layer {i} left the meta device"
            total += sum(p.numel() for p in layer.parameters())
    assert total == model.parameter_count()
    return total
