"""The GPU catalogue (plan/gpus.py) against the vendors' figures, written here from the datasheets independently:
memory as the card states it (read in GiB), dense peak TFLOP/s (a figure the datasheet gives "with sparsity"
halved), memory bandwidth, the link in one direction (NVLink: half the datasheet's bidirectional figure; PCIe: the
specification's x16 rate), compute capability (NVIDIA's CUDA GPUs list), and PyTorch's default cuBLAS workspace."""

from __future__ import annotations

import pytest

from hybridplan.errors import ClusterError, UsageError
from hybridplan.plan.gpus import (
    GPUS,
    cublas_workspace_bytes,
    cuda_context_bytes,
    gpu_memory_bandwidth,
    gpu_peak_flops,
    gpu_spec,
)

GIB = 2**30
T = 1e12
G = 1e9
PCIE3, PCIE4, PCIE5 = 15.75 * G, 31.5 * G, 63.0 * G  # x16, one direction: 8/16/32 GT/s per lane, 128b/130b

# key: (GiB, fp32, tf32, bf16, fp16 TFLOP/s dense, memory GB/s, link GB/s one direction, compute capability)
DATASHEETS = {
    # H100 datasheet: FP32 67 TF; TF32 989*, BF16 1,979*, FP16 1,979* (* with sparsity); 3.35 TB/s; NVLink 900 GB/s
    "h100-sxm": (80, 67, 989 / 2, 1979 / 2, 1979 / 2, 3350, 900 / 2, (9, 0)),
    # H100 PCIe column: 51 TF; 756*, 1,513*, 1,513*; 2 TB/s; PCIe Gen5
    "h100-pcie": (80, 51, 756 / 2, 1513 / 2, 1513 / 2, 2000, PCIE5 / G, (9, 0)),
    # H200 SXM: the H100 SXM's rates; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s
    "h200": (141, 67, 989 / 2, 1979 / 2, 1979 / 2, 4800, 900 / 2, (9, 0)),
    # A100 datasheet (dense figures printed beside the sparse ones): 19.5, 156, 312, 312; NVLink 600 GB/s
    "a100-40gb": (40, 19.5, 156, 312, 312, 1555, 600 / 2, (8, 0)),
    "a100-80gb": (80, 19.5, 156, 312, 312, 2039, 600 / 2, (8, 0)),
    # V100 SXM2: single precision 15.7, tensor 125 (fp16); no TF32, no BF16; 900 GB/s; NVLink 300 GB/s
    "v100-16gb": (16, 15.7, None, None, 125, 900, 300 / 2, (7, 0)),
    "v100-32gb": (32, 15.7, None, None, 125, 900, 300 / 2, (7, 0)),
    # L4: FP32 30.3; TF32 120*, BF16 242*, FP16 242*; 300 GB/s; PCIe Gen4 x16
    "l4": (24, 30.3, 120 / 2, 242 / 2, 242 / 2, 300, PCIE4 / G, (8, 9)),
    # T4: single precision 8.1, mixed precision (FP16/FP32) 65; up to 320 GB/s; PCIe Gen3 x16
    "t4": (16, 8.1, None, None, 65, 320, PCIE3 / G, (7, 5)),
    # A10G (AWS G5): 24 GB, GPUs on PCIe; no rate, bandwidth or PCIe generation published
    "a10g": (24, None, None, None, None, None, None, (8, 6)),
}


def _approx(value: float | None, scale: float) -> object:
    return None if value is None else pytest.approx(value * scale, rel=2e-3)  # PCIe written to 4 digits here


def test_the_catalogue_has_the_gpus_the_issue_asks_for_and_no_others_untested():
    assert set(GPUS) == set(DATASHEETS)


@pytest.mark.parametrize("key", list(DATASHEETS))
def test_each_gpu_has_its_datasheet_figures(key):
    gib, fp32, tf32, bf16, fp16, memory_gbs, link_gbs, capability = DATASHEETS[key]
    g = GPUS[key]
    assert g.memory_bytes == gib * GIB
    assert [g.fp32_flops, g.tf32_flops, g.bf16_flops, g.fp16_flops] == [_approx(r, T) for r in (fp32, tf32, bf16, fp16)]
    assert g.memory_bandwidth == _approx(memory_gbs, G)
    assert g.link_bandwidth == _approx(link_gbs, G)
    assert g.compute_capability == capability
    assert "http" in g.source, "every entry names the document its figures come from"


def test_an_80gb_card_has_80_gib():
    """Issue 33: "80 GB" read as 80e9 bytes left every figure 7% short; the card has 80 GiB."""
    assert GPUS["h100-sxm"].memory_bytes == 85_899_345_920
    assert GPUS["h100-sxm"].memory_bytes / 80e9 == pytest.approx(1.0737, abs=1e-4)


def test_the_cublas_workspace_is_32_mib_on_hopper_and_the_4096_2_16_8_default_elsewhere():
    """PyTorch's parseChosenWorkspaceSize: 4096 * 8 KiB on sm90, else :4096:2:16:8 (2 x 4 MiB + 8 x 16 KiB)."""
    assert cublas_workspace_bytes((9, 0)) == 32 * 2**20
    assert cublas_workspace_bytes((8, 0)) == 2 * 4096 * 1024 + 8 * 16 * 1024 == 8_519_680
    by_architecture = {g.architecture: g.cublas_workspace_bytes for g in GPUS.values()}
    assert by_architecture == {"Hopper": 33_554_432, "Ampere": 8_519_680, "Volta": 8_519_680,
                               "Ada Lovelace": 8_519_680, "Turing": 8_519_680}


def test_the_cuda_context_is_the_one_measured_on_the_h100_everywhere():
    """618.8 MiB measured on an H100 SXM 80GB (../shared/notes/gpu-h100-facts.md); the only GPU measured."""
    measured = round(618.8 * 2**20)
    assert GPUS["h100-sxm"].cuda_context_bytes == measured
    assert [k for k, g in GPUS.items() if g.cuda_context_bytes is not None] == ["h100-sxm"]
    assert {cuda_context_bytes(k) for k in GPUS} == {measured} == {cuda_context_bytes(None)}


def test_peak_rates_and_bandwidth_for_a_time_estimate():
    assert gpu_peak_flops("h100-sxm", "bf16") == pytest.approx(989.5e12)
    assert gpu_peak_flops(GPUS["a100-40gb"], "tf32") == pytest.approx(156e12)
    assert GPUS["l4"].peak_flops("fp16") == pytest.approx(121e12)
    assert gpu_peak_flops("v100-32gb", "bf16") is None  # Volta has no BF16
    assert gpu_memory_bandwidth("h200") == pytest.approx(4.8e12)
    assert gpu_memory_bandwidth("a10g") is None
    with pytest.raises(UsageError, match="fp8"):
        gpu_peak_flops("h100-sxm", "fp8")  # type: ignore[arg-type]


def test_names_are_looked_up_ignoring_case():
    assert gpu_spec(" H100-SXM ").key == "h100-sxm"


def test_an_unknown_gpu_is_refused_listing_the_known_ones():
    with pytest.raises(ClusterError) as e:
        gpu_spec("h100")
    assert "unknown GPU 'h100'" in e.value.message
    assert all(key in (e.value.fix or "") for key in GPUS)
