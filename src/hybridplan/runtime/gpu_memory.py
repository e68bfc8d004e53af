"""Peak memory in GPU terms, for simulated CUDA devices: what the caching allocator hands out and
reserves, and what the device holds outside it.

Simulated devices run on fake CPU tensors (fake CUDA tensors do not work on a CPU-only build of
torch, ../shared/notes/pytorch-cpu-facts.md), so what differs in a CUDA run is modelled. A simulated
CUDA device (:class:`CudaDeviceModel`, used by ``StorageTracker(device=...)``) reports three figures,
as a real one does (runtime/meters.py ``CudaMemoryMeter``):

- the TENSOR PEAK, what ``torch.cuda.max_memory_allocated`` shows: every storage as the block the
  caching allocator gives it, replayed allocation by allocation (runtime/cuda_allocator.py, [Note: the
  caching allocator model]), plus the cuBLAS/cuBLASLt workspaces ([Note: cuBLAS workspaces]);
- the RESERVED PEAK, ``torch.cuda.max_memory_reserved``: the segments the same replay reserves;
- the TOTAL, what nvidia-smi shows: the reserved peak plus the memory outside the allocator ([Note:
  memory outside the allocator]). A plan fits a CUDA device when its total does: ``--device-memory``
  is the device's whole capacity.

Two more rules: AdamW's scalar step counters are not counted, since torch.optim keeps them on the host
unless the optimizer is capturable or fused (torch/optim/adam.py ``_init_group``;
``StorageTracker.host_resident``, called by runtime/executor.py), and the fp32 optimizer is the
multi-tensor AdamW torch picks for CUDA tensors (runtime/precision.py ``build_optimizer``).

[Note: cuBLAS workspaces] PyTorch gives every (cuBLAS handle, stream) pair a workspace allocated
THROUGH the caching allocator, so ``max_memory_allocated`` counts it (aten/src/ATen/cuda/
CublasHandlePool.cpp ``setWorkspaceForHandle``, ``getNewWorkspace``): ``CUBLAS_WORKSPACE_CONFIG``'s
size, by default 32 MiB on Hopper (sm90: ``4096 * 8 * 1024`` bytes) and ``4096 * 1024 * 2 + 16 * 1024 *
8`` bytes on other GPUs; and, for a cuBLASLt matmul (``addmm`` with a bias vector, i.e. ``nn.Linear``'s
forward: ``gemm_and_bias``), a separate cuBLASLt workspace of ``CUBLASLT_WORKSPACE_SIZE``, 1024 KiB by
default (``getCUDABlasLtWorkspace``; "unified" only if ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` is set).
Handles are per thread (``DeviceThreadHandlePool``): the forward pass runs on the Python thread,
autograd's backward pass on the engine's device thread. So a rank whose forward has a bias ``Linear``
and whose backward has matmuls holds 32 + 1 + 32 = 65 MiB from its first backward on: exactly the
68,157,440 bytes measured on an H100 (../shared/notes/gpu-h100-facts.md: a constant 65.0 MiB inside the
allocator, which ``CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0`` removed, after which
gpt3-1.3b matched the simulator to the byte). A recomputed forward (activation checkpointing) runs on
the backward thread, whose handle then gets its own cuBLASLt workspace (66 MiB: derived, not measured).
The simulated device allocates each at the first matmul of its thread, the thread read from the
tracker's phase ("backward": the engine's thread). The cuBLAS workspace's size is the device's GPU's (plan/gpus.py:
32 MiB on Hopper, 8,519,680 bytes on the catalogue's other GPUs); a CUDA device of no named GPU gets Hopper's, the
notes' GPU.

[Note: memory outside the allocator] Memory a GPU process uses that the caching allocator did not
reserve, measured on an H100 as ``total - free - memory_reserved`` (../shared/notes/gpu-h100-facts.md,
torch 2.11, CUDA 13.0, NCCL 2.28.9, driver 580): the CUDA context (618.8 MiB with one tensor), plus
kernels each library loads on first use (lazy module loading): +66 MiB at the first cuBLAS matmul, +16
MiB at the first scaled-dot-product attention, +2 MiB at the first cuDNN convolution; plus +562 MiB
for the first NCCL communicator the process creates. The simulated device adds each library's term
when its first op runs (:data:`LIBRARY_OPS`). The NCCL term is counted per communicator the rank
joins (:func:`communicators_of`): measured for the first, one-rank communicator only; later and
larger ones are assumed equal (on 4 x A100, NVIDIA/nccl#964 measured 544 MiB for 2 ranks and 688 MiB
for 4, so the assumption may be off by about 20% per communicator). A one-device plan creates none:
the runtime does not synchronise a world of one rank (runtime/executor.py ``barrier``), so its
estimate is 618.8 + 66 + 16 = 700.8 MiB for a GPT (the H100 run of the notes, whose barriers created a
communicator, measured 1313-1333 MiB: 700.8 + 562 = 1262.8 MiB, 3.8-5.3% under; the rest is not isolated).
The context is the H100's on every GPU (the only one measured, plan/gpus.py ``cuda_context_bytes``), and so are
the library and NCCL terms. Not modelled: cuDNN's workspaces (allocated through the allocator by the algorithm cuDNN picks at run
time, up to 166 MiB more on the notes' convolutional models, not isolated), and other processes on a
shared GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

from hybridplan.errors import UsageError
from hybridplan.plan import Plan
from hybridplan.plan.cluster import Cluster
from hybridplan.plan.gpus import CUBLASLT_WORKSPACE_BYTES, GPUS, MEASURED_CONTEXT_GPU, cuda_context_bytes, gpu_spec
from hybridplan.runtime.cuda_allocator import AllocatorOutOfMemory, CachingAllocatorModel, round_size
from hybridplan.runtime.routing import Layout, layout_of, route

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "LIBRARY_BYTES",
    "LIBRARY_OPS",
    "NCCL_COMMUNICATOR_BYTES",
    "CUBLAS_WORKSPACE_BYTES",
    "CUBLASLT_WORKSPACE_BYTES",
    "CudaDeviceModel",
    "AllocatorOutOfMemory",
    "cuda_block_bytes",
    "check_cuda_capacity",
    "communicators_of",
    "estimate_overhead_bytes",
]

_MIB = 2**20

CUDA_CONTEXT_BYTES = cuda_context_bytes(None)
"""The CUDA context of a PyTorch process holding one tensor, outside the allocator: 618.8 MiB measured on
an H100 (../shared/notes/gpu-h100-facts.md, "CUDA context + one tensor"), the catalogue's figure (plan/gpus.py)
for every GPU."""

LIBRARY_BYTES = {"cublas": 66 * _MIB, "attention": 16 * _MIB, "cudnn": 2 * _MIB}
"""Memory outside the allocator each library adds when its first kernel runs, measured on an H100
(../shared/notes/gpu-h100-facts.md: first cuBLAS matmul +66 MiB, first SDPA +16 MiB, first cuDNN
convolution +2 MiB)."""

LIBRARY_OPS = {
    "cublas": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_addmm_activation"),
    "attention": ("_scaled_dot_product",),
    "cudnn": ("convolution",),
}
"""Which aten ops load each library: the exact overload packet names of the matmuls (CUDA runs them with
cuBLAS, aten/src/ATen/native/cuda/Blas.cpp), and name prefixes/parts for attention (every
``_scaled_dot_product_*`` kernel) and convolutions (``convolution``, ``convolution_backward``, cuDNN's on CUDA)."""

NCCL_COMMUNICATOR_BYTES = 562 * _MIB
"""Device memory of an NCCL communicator, outside the allocator: +562 MiB measured on an H100 at the first
barrier of a one-rank world, which created the first communicator (../shared/notes/gpu-h100-facts.md);
assumed for every communicator (see [Note: memory outside the allocator])."""

CUBLAS_WORKSPACE_BYTES = GPUS[MEASURED_CONTEXT_GPU].cublas_workspace_bytes
"""cuBLAS workspace per (handle, stream) of a CUDA device of no named GPU: Hopper's 32 MiB, the notes' GPU
(``parseChosenWorkspaceSize`` in aten/src/ATen/cuda/CublasHandlePool.cpp; per GPU: plan/gpus.py). See [Note: cuBLAS
workspaces]. The cuBLASLt workspace, :data:`CUBLASLT_WORKSPACE_BYTES`, is 1024 KiB on every GPU."""


def _workspace_bytes(gpu: str | None) -> int:
    """The cuBLAS workspace of a device of ``gpu`` (None: :data:`CUBLAS_WORKSPACE_BYTES`)."""
    return CUBLAS_WORKSPACE_BYTES if gpu is None else gpu_spec(gpu).cublas_workspace_bytes


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``nbytes`` when a block is split
    exactly (``round_size``; runtime/cuda_allocator.py replays the unsplit cases too).

    Example:
        >>> [cuda_block_bytes(n) for n in (0, 1, 512, 513, 4096)]
        [0, 512, 512, 1024, 4096]
    """
    return round_size(nbytes)


def check_cuda_capacity(cluster: Cluster) -> None:
    """On CUDA a capacity is the device's whole memory: one that cannot even hold the CUDA context is a mistake,
    not a plan that runs out. (Imports no torch: the CLI checks it before loading torch.)

    Raises:
        UsageError: naming the smallest such capacity and the context's measured size.
    """
    from hybridplan.units import format_bytes

    small = [m for d in cluster.devices if (m := d.memory_bytes) is not None and m <= cuda_context_bytes(d.gpu)]
    if small:
        raise UsageError(
            f"device memory {format_bytes(min(small))} cannot even hold a CUDA context ({format_bytes(CUDA_CONTEXT_BYTES)}"
            " measured on an H100): on CUDA --device-memory is the whole device's memory, as nvidia-smi counts it",
            fix="give the GPU's capacity, e.g. --device-memory 80GB",
        )


def _library_of(op: str) -> str | None:
    """The library whose kernels a CUDA run of aten op ``op`` (overload packet name) loads, if any."""
    if op in LIBRARY_OPS["cublas"]:
        return "cublas"
    if op.startswith(LIBRARY_OPS["attention"]):
        return "attention"
    if any(part in op for part in LIBRARY_OPS["cudnn"]):
        return "cudnn"
    return None


class CudaDeviceModel:
    """One simulated CUDA device: its caching allocator, its cuBLAS workspaces and the memory outside the
    allocator (see the module docstring).

    Args:
        capacity_bytes: the device's whole memory (None: unlimited); the allocator may reserve what the
            memory outside it leaves.
        communicators: NCCL communicators the rank joins (:func:`communicators_of`).
        gpu: the device's GPU in the catalogue (plan/gpus.py), which sizes its cuBLAS workspaces and context
            (None: Hopper's workspaces and the measured H100 context).

    Example (a bias Linear's forward, then its backward's matmul, on another thread):
        >>> dev = CudaDeviceModel(None, communicators=0)
        >>> dev.workspaces_for("addmm", bias=True, backward=False)
        [(('workspace', 'cublas', 'forward'), 33554432), (('workspace', 'cublaslt', 'forward'), 1048576)]
        >>> [n >> 20 for _, n in dev.workspaces_for("mm", bias=False, backward=True)]
        [32]
        >>> dev.workspaces_for("mm", bias=False, backward=True), dev.allocator.allocated >> 20
        ([], 65)
        >>> dev.outside_bytes == CUDA_CONTEXT_BYTES + LIBRARY_BYTES["cublas"]
        True
        >>> [n for _, n in CudaDeviceModel(None, communicators=0, gpu="a100-80gb").workspaces_for(
        ...     "mm", bias=False, backward=False)]  # an Ampere GPU's default, 8 MiB + 128 KiB
        [8519680]
    """

    def __init__(self, capacity_bytes: int | None, *, communicators: int, gpu: str | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.libraries: set[str] = set()
        self.cublas_workspace_bytes = _workspace_bytes(gpu)
        """The cuBLAS workspace of each thread's handle on this device's GPU."""
        self.base_bytes = cuda_context_bytes(gpu) + communicators * NCCL_COMMUNICATOR_BYTES
        """The context and the communicators: held from the start (the runtime creates its groups first)."""
        self.allocator = CachingAllocatorModel(None)
        if capacity_bytes is not None:  # a capacity below this fails at the first allocation, as on a GPU
            self.allocator.limit_bytes = max(0, capacity_bytes - self.outside_bytes)

    @property
    def outside_bytes(self) -> int:
        """Memory outside the allocator now (context, communicators, libraries loaded so far)."""
        return self.base_bytes + sum(LIBRARY_BYTES[lib] for lib in self.libraries)

    @property
    def total_peak_bytes(self) -> int:
        """What nvidia-smi would show at the peak: the reserved peak plus the memory outside the allocator."""
        return self.allocator.peak_reserved + self.outside_bytes

    def _set_limit(self) -> None:
        """A library just loaded outside the allocator: less is left for it (an error if what it holds no longer fits)."""
        if self.capacity_bytes is not None:
            self.allocator.limit_bytes = max(0, self.capacity_bytes - self.outside_bytes)
            if self.allocator.reserved > self.allocator.limit_bytes:
                raise AllocatorOutOfMemory(0, self.allocator.reserved, self.allocator.limit_bytes)

    def workspaces_for(self, op: str, *, bias: bool, backward: bool) -> list[tuple[Hashable, int]]:
        """Note that aten op ``op`` runs (on the backward thread or not); allocate the workspaces its first
        use on that thread needs and load its library. Returns each new workspace's allocator key and block bytes.

        Raises:
            AllocatorOutOfMemory: if the device's memory cannot hold them.
        """
        library = _library_of(op)
        if library is None:
            return []
        if library not in self.libraries:
            self.libraries.add(library)
            self._set_limit()
        if library != "cublas":
            return []
        thread = "backward" if backward else "forward"
        blocks: list[tuple[Hashable, int]] = []
        wanted = [("cublas", self.cublas_workspace_bytes)]
        if bias and op in ("addmm", "_addmm_activation"):
            wanted.append(("cublaslt", CUBLASLT_WORKSPACE_BYTES))
        for kind, nbytes in wanted:
            key = ("workspace", kind, thread)
            if self.allocator.block_of(key) == 0:
                blocks.append((key, self.allocator.malloc(key, nbytes)))
        return blocks


def communicators_of(plan: Plan, rank: int) -> list[int]:
    """Sizes (in ranks) of the NCCL communicators ``rank`` creates when the runtime runs ``plan``.

    ProcessGroupNCCL creates communicators lazily, on a rank's first operation in a group: the world
    (the runtime's barriers, skipped in a world of one rank), the rank's tensor-parallel group and its
    data-parallel group where the stage has such a degree (tensor-parallel collectives; the gradient
    all-reduce), and one 2-rank communicator per point-to-point peer (send/receive pairs get their own
    communicator, keyed by the pair).
    """
    return list(_communicators(*_layouts(plan))[rank])


def communicators_by_device(plan: Plan) -> dict[int, list[int]]:
    """:func:`communicators_of` every device of ``plan``."""
    return {rank: list(sizes) for rank, sizes in _communicators(*_layouts(plan)).items()}


def _layouts(plan: Plan) -> tuple[int, int, tuple[Layout, ...]]:
    """What a plan's communicators depend on: its device count, micro-batch rows and stage layouts (not its
    layers, ZeRO or recompute: a search asks for the same layout under each of its cuts and stage options)."""
    return plan.num_devices, plan.microbatch_size, tuple(layout_of(stage) for stage in plan.stages)


@functools.lru_cache(maxsize=256)
def _communicators(num_devices: int, rows: int, layouts: tuple[Layout, ...]) -> dict[int, tuple[int, ...]]:
    """:func:`communicators_of` every device of a plan of these ``layouts``, each stage's neighbours routed once (a
    prediction of a 256-device plan asks for all of them); kept per layout (read only)."""
    out: dict[int, tuple[int, ...]] = {}
    for index, here in enumerate(layouts):
        sizes = [num_devices] if num_devices > 1 else []
        if here.replica_size > 1:  # the tensor group
            sizes.append(here.replica_size)
        if here.replicas > 1:  # the data group
            sizes.append(here.replicas)
        neighbours = [_p2p_peers(layouts[other], here, rows) for other in (index - 1, index + 1)
                      if 0 <= other < len(layouts)]
        for rank in here.ranks:
            peers: set[int] = set()
            for pairs in neighbours:
                peers |= pairs.get(rank, frozenset())
            out[rank] = tuple(sizes + [2] * len(peers - {rank}))
    return out


@functools.lru_cache(maxsize=64)
def _p2p_peers(a: Layout, b: Layout, rows: int) -> dict[int, frozenset[int]]:
    """Each rank's point-to-point peers between neighbouring stages ``a`` and ``b`` (both directions): kept, since
    a plan's every rank asks for the same pair (a 128-rank stage routes 2,048 transfers each way)."""
    peers: dict[int, set[int]] = {}
    for t in route(a, b, rows) + route(b, a, rows):
        peers.setdefault(t.src, set()).add(t.dst)
        peers.setdefault(t.dst, set()).add(t.src)
    return {rank: frozenset(others) for rank, others in peers.items()}


def overhead_bytes_by_device(plan: Plan, libraries: set[str] | frozenset[str] = frozenset(), *,
                             gpu: str | None = None) -> dict[int, int]:
    """:func:`estimate_overhead_bytes` of every device of ``plan``."""
    base = cuda_context_bytes(gpu) + sum(LIBRARY_BYTES[lib] for lib in libraries)
    return {rank: base + len(sizes) * NCCL_COMMUNICATOR_BYTES for rank, sizes in _communicators(*_layouts(plan)).items()}


def estimate_overhead_bytes(plan: Plan, rank: int, libraries: set[str] | frozenset[str] = frozenset(), *,
                            gpu: str | None = None) -> int:
    """Estimated device memory ``rank`` uses outside the caching allocator when ``plan`` runs on GPUs
    with NCCL: the CUDA context (of its ``gpu``, plan/gpus.py), the ``libraries`` its kernels load (keys of
    :data:`LIBRARY_BYTES`) and each of its communicators (see [Note: memory outside the allocator]).

    Example (a single device running matmuls and attention: no communicator):
        >>> from hybridplan.plan import Plan
        >>> plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2,
        ...     "stages": [{"layers": [0, 10], "parallelism": "none", "degree": 1, "devices": [0]}]})
        >>> round(estimate_overhead_bytes(plan, 0, {"cublas", "attention"}) / 2**20, 1)
        700.8
    """
    return (cuda_context_bytes(gpu) + sum(LIBRARY_BYTES[lib] for lib in libraries)
            + len(communicators_of(plan, rank)) * NCCL_COMMUNICATOR_BYTES)
