"""The GPU datasheet figures the benchmarks are judged against: GpuSpec (memory bandwidth and dense
bf16/fp16 tensor rates), the GPU_SPECS table of the GPUs gpubox knows, and gpu_spec(), which finds a
GPU's figures by the name NVML and torch report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    label: str
    memory_gb_per_s: float | None  # datasheet memory bandwidth
    bf16_tflops: float | None  # dense (no sparsity), FP32 accumulate
    fp16_tflops: float | None


# Datasheet figures, matched on the words of the name NVML and torch report ("NVIDIA A100-SXM4-80GB").
# The datasheets quote tensor rates "with sparsity": the dense rate is half. First match wins.
GPU_SPECS: tuple[tuple[frozenset[str], GpuSpec], ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet (2024): 4.8 TB/s; BF16 1,979 (SXM) and 1,671 (NVL) TFLOPS sparse
    (frozenset({"h200", "nvl"}), GpuSpec("H200 NVL", 4800, 835.5, 835.5)),
    (frozenset({"h200"}), GpuSpec("H200 SXM", 4800, 989.4, 989.4)),
    # NVIDIA H100 Tensor Core GPU datasheet: SXM 3.35 TB/s, PCIe 2.0 TB/s, NVL 3.9 TB/s;
    # BF16 1,979 / 1,513 / 1,671 TFLOPS sparse
    (frozenset({"h100", "nvl"}), GpuSpec("H100 NVL", 3900, 835.5, 835.5)),
    (frozenset({"h100", "pcie"}), GpuSpec("H100 PCIe", 2000, 756.5, 756.5)),
    (frozenset({"h100"}), GpuSpec("H100 SXM", 3350, 989.4, 989.4)),
    # NVIDIA A100 Tensor Core GPU datasheet: 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s, 40GB 1,555 GB/s; BF16 312
    (frozenset({"a100", "80gb", "pcie"}), GpuSpec("A100 80GB PCIe", 1935, 312.0, 312.0)),
    (frozenset({"a100", "80gb"}), GpuSpec("A100 80GB SXM", 2039, 312.0, 312.0)),
    (frozenset({"a100"}), GpuSpec("A100 40GB", 1555, 312.0, 312.0)),
    # NVIDIA L40S / L40 / L4 datasheets: 864 / 864 / 300 GB/s; BF16 362.05 / 181.05 / 121 TFLOPS dense
    (frozenset({"l40s"}), GpuSpec("L40S", 864, 362.05, 362.05)),
    (frozenset({"l40"}), GpuSpec("L40", 864, 181.05, 181.05)),
    (frozenset({"l4"}), GpuSpec("L4", 300, 121.0, 121.0)),
    # NVIDIA A40 and A10 datasheets: 696 and 600 GB/s; BF16 149.7 and 125 TFLOPS dense
    (frozenset({"a40"}), GpuSpec("A40", 696, 149.7, 149.7)),
    (frozenset({"a10"}), GpuSpec("A10", 600, 125.0, 125.0)),
    # NVIDIA Ampere GA102 whitepaper: RTX A6000 768 GB/s, 154.8 TFLOPS; RTX 3090 936 GB/s, 71 TFLOPS (FP32 accumulate)
    (frozenset({"rtx", "a6000"}), GpuSpec("RTX A6000", 768, 154.8, 154.8)),
    (frozenset({"rtx", "3090"}), GpuSpec("GeForce RTX 3090", 936, 71.0, 71.0)),
    # NVIDIA Ada Lovelace whitepaper: RTX 4090 1,008 GB/s; 165.2 TFLOPS with FP32 accumulate
    (frozenset({"rtx", "4090"}), GpuSpec("GeForce RTX 4090", 1008, 165.2, 165.2)),
    # NVIDIA V100 and T4 datasheets (no bf16): V100S 1,134 GB/s 130 TFLOPS, V100 SXM2 900 GB/s 125,
    # V100 PCIe 900 GB/s 112, T4 320 GB/s 65 (mixed precision)
    (frozenset({"v100s"}), GpuSpec("V100S PCIe", 1134, None, 130.0)),
    (frozenset({"v100", "sxm2"}), GpuSpec("V100 SXM2", 900, None, 125.0)),
    (frozenset({"v100"}), GpuSpec("V100 PCIe", 900, None, 112.0)),
    (frozenset({"t4"}), GpuSpec("T4", 320, None, 65.0)),
)


def gpu_spec(name: str | None) -> GpuSpec | None:
    """The datasheet figures for a GPU by its reported name; None for a GPU not in the table."""
    if not name:
        return None
    words = set(re.split(r"[\s\-_/]+", name.lower()))
    return next((spec for needed, spec in GPU_SPECS if needed <= words), None)
