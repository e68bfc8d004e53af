"""Peak memory in GPU terms, for simulated CUDA devices: the caching allocator's rounding, and the
memory a device uses outside its tensors.

Simulated devices run on fake CPU tensors (fake CUDA tensors do not work on a CPU-only build of
torch, ../shared/notes/pytorch-cpu-facts.md), so what differs in a CUDA run is modelled. The rules:

1. every storage counts as the block the CUDA caching allocator gives it ([Note: CUDA allocation
   rounding]; ``StorageTracker(rounding=cuda_block_bytes)``);
2. AdamW's scalar step counters are not counted: torch.optim keeps them on the host unless the
   optimizer is capturable or fused (torch/optim/adam.py ``_init_group``), so they take no GPU memory
   (``StorageTracker.host_resident``, called by runtime/executor.py);
3. the fp32 optimizer is the multi-tensor AdamW that torch picks for CUDA tensors, with its larger
   temporaries (runtime/precision.py ``build_optimizer``);
4. the memory outside the allocator is estimated and reported apart ([Note: per-device overhead]).

[Note: CUDA allocation rounding] ``torch.cuda.max_memory_allocated`` reports the allocator's
``allocated_bytes`` statistic, which grows by the size of the BLOCK given out for each allocation
(``increase_stat(stats.allocated_bytes[...], block->size)`` in c10/cuda/CUDACachingAllocator.cpp).
A request of ``n > 0`` bytes gets a block of ``round_size(n)``: at least ``kMinBlockSize = 512``
bytes, else ``n`` rounded up to a multiple of 512 (``kMinBlockSize * ((size + kMinBlockSize - 1) /
kMinBlockSize)``; same file, checked against pytorch/pytorch's source). A zero-byte tensor allocates
nothing (the allocator's ``allocate`` calls ``malloc`` only for a non-zero size). Not modelled, because they depend on the allocation history, not on the program: a cached
free block of a "large" request (> 1 MiB) is handed out whole when the remainder would be 1 MiB or
less (``should_split``), and the optional ``roundup_power2_divisions`` setting (off by default). The
rounded count is thus what ``max_memory_allocated`` reports when every block is split exactly, a
lower bound otherwise.

[Note: per-device overhead] Memory a GPU process uses outside the caching allocator: the CUDA context
(driver state and the kernels loaded into it) and NCCL's communication buffers. It is NOT part of
``peak_memory_bytes`` (which, like ``max_memory_allocated``, counts tensors), and capacity checks
leave it out too, as in the real runtime, whose capacity limit
(``torch.cuda.set_per_process_memory_fraction``) applies to the allocator only. It is reported
separately as ``overhead_bytes``: subtract it from a device's capacity before comparing peaks when
deciding whether a plan fits. (The real limit applies to the allocator's RESERVED memory, whole
segments of 2 MiB or more, which fragmentation can keep above the allocated bytes: a plan within a few
percent of the capacity may still run out on a real GPU.) The estimate is coarse (the real figure
depends on the GPU, driver, CUDA and NCCL versions and NCCL's channel count); a real CUDA run measures
it instead (``CudaMemoryMeter.overhead_bytes``), and benchmarks/sim_vs_gpu compares the two.
"""

from __future__ import annotations

from hybridplan.plan import Plan
from hybridplan.runtime.routing import layout_of, route

__all__ = [
    "CUDA_MIN_BLOCK_BYTES",
    "CUDA_CONTEXT_BYTES",
    "NCCL_PAIR_COMMUNICATOR_BYTES",
    "NCCL_GROUP_COMMUNICATOR_BYTES",
    "cuda_block_bytes",
    "communicators_of",
    "estimate_overhead_bytes",
]

CUDA_MIN_BLOCK_BYTES = 512
"""``kMinBlockSize`` of c10/cuda/CUDACachingAllocator.cpp: every allocation is a multiple of it."""

CUDA_CONTEXT_BYTES = 400 * 2**20
"""The CUDA context of a PyTorch process: "around 400MB if CUDA >= 11.7 is used and lazy module loading
enabled (default in PyTorch)" (a PyTorch CUDA maintainer, pytorch/pytorch#109888); pytorch/pytorch#86509
measured 287,047,680 bytes (``total - free``) for a process holding one small tensor, before cuBLAS and
cuDNN load their kernels."""

NCCL_PAIR_COMMUNICATOR_BYTES = 544 * 2**20
"""Device memory of one 2-rank NCCL communicator after its first collective: 544 MiB per GPU measured
on 4 x A100 with NVLink (NVIDIA/nccl#964). NCCL's memory grows with its channel count
(NVIDIA/nccl#986), so newer GPUs may use more."""

NCCL_GROUP_COMMUNICATOR_BYTES = 688 * 2**20
"""The same for a communicator of more than 2 ranks: 688 MiB per GPU (NVIDIA/nccl#964)."""


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``nbytes`` (see [Note: CUDA
    allocation rounding]).

    Example:
        >>> [cuda_block_bytes(n) for n in (0, 1, 512, 513, 4096)]
        [0, 512, 512, 1024, 4096]
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES


def communicators_of(plan: Plan, rank: int) -> list[int]:
    """Sizes (in ranks) of the NCCL communicators ``rank`` creates when the runtime runs ``plan``.

    ProcessGroupNCCL creates communicators lazily, on a rank's first operation in a group: the world
    (the runtime's barriers), the rank's tensor-parallel group and its data-parallel group where the stage
    has such a degree (tensor-parallel collectives; the gradient all-reduce), and one 2-rank communicator
    per point-to-point peer
    (send/receive pairs get their own communicator, keyed by the pair).
    """
    sizes = [plan.num_devices] if plan.num_devices > 1 else []
    index = plan.stage_of_device(rank)
    stage = plan.stages[index]
    if stage.tensor_degree > 1:
        sizes.append(stage.tensor_degree)
    if stage.data_degree > 1:
        sizes.append(stage.data_degree)
    here = layout_of(stage)
    b = plan.microbatch_size
    peers: set[int] = set()
    for other in (index - 1, index + 1):
        if 0 <= other < plan.num_stages:
            there = layout_of(plan.stages[other])
            for t in route(there, here, b) + route(here, there, b):
                if rank in (t.src, t.dst):
                    peers.add(t.dst if t.src == rank else t.src)
    sizes += [2] * len(peers - {rank})
    return sizes


def estimate_overhead_bytes(plan: Plan, rank: int) -> int:
    """Estimated device memory ``rank`` uses outside its tensors when ``plan`` runs on GPUs with NCCL:
    the CUDA context plus each of its communicators (see [Note: per-device overhead]).

    Example (a single device: only the context):
        >>> from hybridplan.plan import Plan
        >>> plan = Plan.from_dict({"schedule": "1f1b", "global_batch_size": 4, "num_microbatches": 2,
        ...     "stages": [{"layers": [0, 10], "parallelism": "none", "degree": 1, "devices": [0]}]})
        >>> estimate_overhead_bytes(plan, 0) == CUDA_CONTEXT_BYTES
        True
    """
    total = CUDA_CONTEXT_BYTES
    for size in communicators_of(plan, rank):
        total += NCCL_PAIR_COMMUNICATOR_BYTES if size == 2 else NCCL_GROUP_COMMUNICATOR_BYTES
    return total
