"""The GPU catalogue: what naming a GPU (``--gpu h100-sxm``, or ``gpu = "h100-sxm"`` in a cluster file) tells a plan.

A user thinks of a cluster as "2 nodes of 8 H100 SXM", not as "80 GiB of cuda". From the GPU model follow its memory
capacity, its peak FLOP rates and memory bandwidth (for a FLOP/byte time estimate), the link between two GPUs of a node,
and the CUDA terms a simulated CUDA device needs (runtime/gpu_memory.py): the cuBLAS workspace PyTorch allocates on its
architecture and the CUDA context. ``hybridplan gpus`` prints the table; docs/gpus.md holds it with its sources.

Where every figure comes from (a figure no source gives is ``None``, never a guess):

- memory, FLOP rates, memory bandwidth and links: the vendor's datasheet or product page named in each entry's
  ``source``. Datasheets quote Tensor Core rates "with sparsity" (2:4 structured sparsity) where the architecture has
  it (Ampere and later) and say the dense rate is half; the catalogue keeps DENSE rates, the datasheet figure halved
  where it was quoted with sparsity (:func:`_sparse`), since training does not run 2:4-sparse matmuls. An NVLink's
  datasheet figure is the sum of both directions; the catalogue keeps one direction (half), as a cluster's bandwidths
  are (plan/cluster.py: NVLink 3's "600 GB/s" is 300 GB/s per direction). A PCIe link's rate is the PCIe
  specification's (:func:`_pcie`; the datasheets round both directions together to 32/64/128 GB/s).
- memory capacity as the card states it: an "80GB" card has 80 GiB (85,899,345,920 bytes) of HBM, since memory chips
  come in powers of two (issue 33: reading "80GB" as 80e9 bytes made every figure 7% short). A CUDA process can
  reach somewhat less (the driver keeps some); that usable total (``torch.cuda.mem_get_info()[1]``) has not been
  measured on any of these GPUs by this project (../shared/notes/gpu-h100-facts.md has no such figure), so the stated
  capacity is what ``--gpu`` sets; ``--device-memory`` overrides it with a measured figure.
- compute capability: NVIDIA's CUDA GPUs list, https://developer.nvidia.com/cuda-gpus.
- cuBLAS workspace: PyTorch's ``parseChosenWorkspaceSize`` (aten/src/ATen/cuda/CublasHandlePool.cpp, pytorch/pytorch
  at 26a39059): 32 MiB (``4096 * 8 * 1024`` bytes) on compute capability 9.0 (Hopper), ``4096 * 1024 * 2 + 16 * 1024 *
  8`` = 8,519,680 bytes (":4096:2:16:8") on every other GPU; later PyTorch also gives 32 MiB to majors 10 and 12
  (Blackwell), none of which is in the catalogue. The cuBLASLt workspace is 1024 KiB on every GPU
  (``parseCUDABlasLtWorkspaceSize``, same file). On an H100 the 32 + 1 + 32 MiB they add up to was measured
  (../shared/notes/gpu-h100-facts.md, runtime/gpu_memory.py [Note: cuBLAS workspaces]).
- CUDA context: 618.8 MiB measured on an H100 SXM 80GB ("CUDA context + one tensor", ../shared/notes/gpu-h100-facts.md);
  not measured on the other GPUs (``cuda_context_bytes`` None there), where the simulated device takes the H100's
  figure (:func:`cuda_context_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

from hybridplan.errors import ClusterError, UsageError

__all__ = [
    "Gpu",
    "GPUS",
    "PRECISIONS",
    "Precision",
    "CUBLASLT_WORKSPACE_BYTES",
    "MEASURED_CONTEXT_GPU",
    "gpu_spec",
    "gpu_peak_flops",
    "gpu_memory_bandwidth",
    "cublas_workspace_bytes",
    "cuda_context_bytes",
]

_GIB = 2**30
_TERA = 1e12
_GIGA = 1e9

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16", "fp16")
"""The math a peak rate is given for: fp32 on the CUDA cores (what PyTorch runs fp32 matmuls on unless TF32 is
allowed), tf32/bf16/fp16 on the Tensor Cores (fp32 accumulation for bf16/fp16)."""

CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
"""cuBLASLt workspace per (handle, stream) on every GPU: ``parseCUDABlasLtWorkspaceSize``'s default of 1024 KiB
(aten/src/ATen/cuda/CublasHandlePool.cpp)."""

MEASURED_CONTEXT_GPU = "h100-sxm"
"""The GPU whose CUDA context this project measured (../shared/notes/gpu-h100-facts.md: an "NVIDIA H100 80GB HBM3",
the SXM5 board, the one with HBM3); the other GPUs take its figure."""


def _pcie(generation: int) -> float:
    """Bytes/s in one direction of a PCIe x16 link: 8, 16 and 32 GT/s per lane for generations 3, 4 and 5 with
    128b/130b encoding (the PCI Express Base Specification), i.e. 15.75, 31.5 and 63.0 GB/s.

    Example:
        >>> round(_pcie(4) / 1e9, 2)
        31.51
    """
    return {3: 8e9, 4: 16e9, 5: 32e9}[generation] * 16 * 128 / 130 / 8


def _sparse(datasheet_tflops: float) -> float:
    """FLOP/s of a datasheet's Tensor Core figure quoted "with sparsity": half of it is the dense rate, as the
    datasheets' own footnotes say ("specifications are one-half lower without sparsity")."""
    return datasheet_tflops * _TERA / 2


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One GPU model of the catalogue; every figure from ``source`` unless ``notes`` says otherwise."""

    key: str
    """The name ``--gpu`` and a cluster file take, e.g. ``"h100-sxm"``."""
    name: str
    """The vendor's full name."""
    architecture: str
    """NVIDIA's architecture name (Hopper, Ampere, Ada Lovelace, Turing, Volta)."""
    compute_capability: tuple[int, int]
    """CUDA compute capability (major, minor): what PyTorch chooses its cuBLAS workspace by."""
    memory_stated: str
    """The capacity as the datasheet prints it, e.g. "80GB HBM3"."""
    memory_bytes: int
    """That capacity in bytes: the stated figure in GiB (module docstring)."""
    fp32_flops: float | None
    """Peak dense FP32 FLOP/s on the CUDA cores (None: not published)."""
    tf32_flops: float | None
    """Peak dense TF32 Tensor Core FLOP/s (None: the architecture has no TF32, or not published)."""
    bf16_flops: float | None
    """Peak dense BF16 Tensor Core FLOP/s, fp32 accumulate (None: no BF16 Tensor Cores, or not published)."""
    fp16_flops: float | None
    """Peak dense FP16 Tensor Core FLOP/s, fp32 accumulate (None: not published)."""
    memory_bandwidth: float | None
    """Peak memory bandwidth in bytes/s (None: not published)."""
    link: str
    """The default link between two GPUs of a node, e.g. "NVLink 4" or "PCIe Gen4 x16"."""
    link_bandwidth: float | None
    """That link's bytes/s in one direction (half the datasheet's bidirectional figure; None: not published)."""
    cuda_context_bytes: int | None = None
    """The CUDA context of a PyTorch process holding one tensor, outside the allocator, where this project measured it
    (None: not measured; :func:`cuda_context_bytes` then takes :data:`MEASURED_CONTEXT_GPU`'s)."""
    source: str
    """The vendor document the figures come from: its title and address."""
    notes: str = ""
    """What the source does not say, or says differently."""

    @property
    def cublas_workspace_bytes(self) -> int:
        """The cuBLAS workspace PyTorch allocates per (handle, stream) on this GPU (:func:`cublas_workspace_bytes`)."""
        return cublas_workspace_bytes(self.compute_capability)

    def peak_flops(self, precision: Precision) -> float | None:
        """Peak dense FLOP/s in ``precision`` (None where the datasheet gives none); see :func:`gpu_peak_flops`."""
        return gpu_peak_flops(self, precision)


def cublas_workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """The cuBLAS workspace PyTorch allocates per (handle, stream) through its caching allocator, by default:
    ``parseChosenWorkspaceSize`` in aten/src/ATen/cuda/CublasHandlePool.cpp (module docstring).

    Example:
        >>> cublas_workspace_bytes((9, 0)), cublas_workspace_bytes((8, 0))
        (33554432, 8519680)
    """
    return 4096 * 8 * 1024 if compute_capability == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8


_H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet (H100 SXM and H100 PCIe columns),"
                   " https://www.nvidia.com/en-us/data-center/h100/")
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/"
_A100_DATASHEET = ("NVIDIA A100 Tensor Core GPU datasheet (A100 SXM columns),"
                   " https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                   "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_V100_DATASHEET = ("NVIDIA Tesla V100 GPU datasheet (V100 SXM2 column),"
                   " https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
_L4_DATASHEET = "NVIDIA L4 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/l4/"
_T4_DATASHEET = ("NVIDIA T4 Tensor Core GPU datasheet,"
                 " https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf;"
                 " memory bandwidth: NVIDIA T4 product brief (PB-09256), table 2")
_G5_PAGE = "Amazon EC2 G5 instances (NVIDIA A10G Tensor Core GPUs), https://aws.amazon.com/ec2/instance-types/g5/"

_H100_CONTEXT_BYTES = round(618.8 * 2**20)
"""618.8 MiB: "CUDA context + one tensor" measured on an H100 SXM 80GB (../shared/notes/gpu-h100-facts.md)."""

_NO_SPARSITY_NOTE = "{arch} Tensor Cores have no 2:4 sparsity: the datasheet's rates are dense."

_H100_SXM = Gpu(
    key="h100-sxm", name="NVIDIA H100 SXM5 80GB", architecture="Hopper", compute_capability=(9, 0),
    memory_stated="80GB HBM3", memory_bytes=80 * _GIB,
    fp32_flops=67 * _TERA, tf32_flops=_sparse(989), bf16_flops=_sparse(1979), fp16_flops=_sparse(1979),
    memory_bandwidth=3.35 * _TERA, link="NVLink 4", link_bandwidth=900 * _GIGA / 2,
    cuda_context_bytes=_H100_CONTEXT_BYTES, source=_H100_DATASHEET,
    notes="CUDA context measured by this project (../shared/notes/gpu-h100-facts.md).")

_A100_40 = Gpu(
    key="a100-40gb", name="NVIDIA A100 SXM4 40GB", architecture="Ampere", compute_capability=(8, 0),
    memory_stated="40GB HBM2", memory_bytes=40 * _GIB,
    fp32_flops=19.5 * _TERA, tf32_flops=156 * _TERA, bf16_flops=312 * _TERA, fp16_flops=312 * _TERA,
    memory_bandwidth=1555 * _GIGA, link="NVLink 3", link_bandwidth=600 * _GIGA / 2, source=_A100_DATASHEET,
    notes="The datasheet gives the dense rates beside the sparse ones.")

_V100_16 = Gpu(
    key="v100-16gb", name="NVIDIA Tesla V100 SXM2 16GB", architecture="Volta", compute_capability=(7, 0),
    memory_stated="16GB HBM2", memory_bytes=16 * _GIB,
    fp32_flops=15.7 * _TERA, tf32_flops=None, bf16_flops=None, fp16_flops=125 * _TERA,
    memory_bandwidth=900 * _GIGA, link="NVLink 2", link_bandwidth=300 * _GIGA / 2, source=_V100_DATASHEET,
    notes="Volta has no TF32 or BF16; fp16 is the datasheet's \"Tensor Performance\". "
          + _NO_SPARSITY_NOTE.format(arch="Volta"))

_CATALOGUE: tuple[Gpu, ...] = (
    _H100_SXM,
    Gpu(key="h100-pcie", name="NVIDIA H100 PCIe 80GB", architecture="Hopper", compute_capability=(9, 0),
        memory_stated="80GB HBM2e", memory_bytes=80 * _GIB,
        fp32_flops=51 * _TERA, tf32_flops=_sparse(756), bf16_flops=_sparse(1513), fp16_flops=_sparse(1513),
        memory_bandwidth=2.0 * _TERA, link="PCIe Gen5 x16", link_bandwidth=_pcie(5), source=_H100_DATASHEET,
        notes="The datasheet's NVLink bridge (600 GB/s) joins pairs of cards only, so a node's default link is PCIe."),
    # the H100 SXM's rates and link (the datasheet's figures are the same), more and faster memory
    replace(_H100_SXM, key="h200", name="NVIDIA H200 SXM 141GB", memory_stated="141GB HBM3e", memory_bytes=141 * _GIB,
            memory_bandwidth=4.8 * _TERA, cuda_context_bytes=None, source=_H200_DATASHEET, notes=""),
    _A100_40,
    replace(_A100_40, key="a100-80gb", name="NVIDIA A100 SXM4 80GB", memory_stated="80GB HBM2e",
            memory_bytes=80 * _GIB, memory_bandwidth=2039 * _GIGA),
    _V100_16,
    replace(_V100_16, key="v100-32gb", name="NVIDIA Tesla V100 SXM2 32GB", memory_stated="32GB HBM2",
            memory_bytes=32 * _GIB),
    Gpu(key="l4", name="NVIDIA L4 24GB", architecture="Ada Lovelace", compute_capability=(8, 9),
        memory_stated="24GB GDDR6", memory_bytes=24 * _GIB,
        fp32_flops=30.3 * _TERA, tf32_flops=_sparse(120), bf16_flops=_sparse(242), fp16_flops=_sparse(242),
        memory_bandwidth=300 * _GIGA, link="PCIe Gen4 x16", link_bandwidth=_pcie(4), source=_L4_DATASHEET),
    Gpu(key="t4", name="NVIDIA T4 16GB", architecture="Turing", compute_capability=(7, 5),
        memory_stated="16GB GDDR6", memory_bytes=16 * _GIB,
        fp32_flops=8.1 * _TERA, tf32_flops=None, bf16_flops=None, fp16_flops=65 * _TERA,
        memory_bandwidth=320 * _GIGA, link="PCIe Gen3 x16", link_bandwidth=_pcie(3), source=_T4_DATASHEET,
        notes="Turing has no TF32 or BF16; fp16 is the datasheet's \"Mixed Precision (FP16/FP32)\"; the bandwidth"
              " is NVIDIA's T4 product brief's \"up to 320 GBytes/s\". " + _NO_SPARSITY_NOTE.format(arch="Turing")),
    Gpu(key="a10g", name="NVIDIA A10G 24GB (AWS)", architecture="Ampere", compute_capability=(8, 6),
        memory_stated="24GB", memory_bytes=24 * _GIB,
        fp32_flops=None, tf32_flops=None, bf16_flops=None, fp16_flops=None,
        memory_bandwidth=None, link="PCIe", link_bandwidth=None, source=_G5_PAGE,
        notes="AWS's variant of the A10. NVIDIA publishes no A10G datasheet; AWS gives its 24 GB, not its rates,"
              " bandwidth or PCIe generation, so those are unknown here (the A10's datasheet rates do not carry over:"
              " the two differ in Tensor Core rates, https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-"
              "inference/). The GPUs of a multi-GPU G5 instance are joined by PCIe (the GPU-instance table of"
              " https://gist.github.com/shashankprasanna/10ebe6dc1ba1d8d93db17da4e2cc890e)."),
)

GPUS: Mapping[str, Gpu] = MappingProxyType({g.key: g for g in _CATALOGUE})
"""The catalogue by key, in the order ``hybridplan gpus`` lists it."""


def gpu_spec(name: str | Gpu) -> Gpu:
    """The catalogue entry called ``name`` (case does not matter).

    Raises:
        ClusterError: for a name not in the catalogue, listing the known ones.

    Example:
        >>> gpu_spec("H100-SXM").memory_bytes
        85899345920
    """
    if isinstance(name, Gpu):
        return name
    gpu = GPUS.get(name.strip().lower()) if isinstance(name, str) else None
    if gpu is None:
        raise ClusterError(f"unknown GPU {name!r}", fix=f"name one of {', '.join(GPUS)} ('hybridplan gpus' lists them),"
                           " or describe the device with --device cuda --device-memory SIZE")
    return gpu


def gpu_peak_flops(gpu: str | Gpu, precision: Precision) -> float | None:
    """Peak dense FLOP/s of ``gpu`` in ``precision``, for a FLOP-based time estimate (None: the datasheet gives none).

    Raises:
        ClusterError: for an unknown GPU.
        UsageError: for a precision not in :data:`PRECISIONS`.

    Example:
        >>> gpu_peak_flops("a100-80gb", "bf16") / 1e12
        312.0
    """
    spec = gpu_spec(gpu)
    if precision not in PRECISIONS:
        raise UsageError(f"no peak rate for precision {precision!r}", fix=f"ask for one of {', '.join(PRECISIONS)}")
    rate: float | None = getattr(spec, f"{precision}_flops")
    return rate


def gpu_memory_bandwidth(gpu: str | Gpu) -> float | None:
    """Peak memory bandwidth of ``gpu`` in bytes/s (None: not published).

    Example:
        >>> gpu_memory_bandwidth("h100-sxm") / 1e12
        3.35
    """
    return gpu_spec(gpu).memory_bandwidth


def cuda_context_bytes(gpu: str | Gpu | None) -> int:
    """The CUDA context a simulated device of ``gpu`` holds outside the allocator: the GPU's own measured figure,
    else that of :data:`MEASURED_CONTEXT_GPU` (the only one measured; also for ``gpu`` None, a CUDA device of no
    named model)."""
    measured = gpu_spec(gpu).cuda_context_bytes if gpu is not None else None
    if measured is not None:
        return measured
    return _H100_CONTEXT_BYTES
