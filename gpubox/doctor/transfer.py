"""The copy and matmul benchmarks judged: pure arithmetic on the timings torch_bench.py reports,
against the PCIe link seen under load and the GPU's datasheet figures.

Rates are in GB/s of 1e9 bytes. A link's theoretical rate is per direction, after line encoding.
The checks made of these records are in transfer_checks.py, the datasheet figures in gpu_specs.py.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpubox.doctor.gpu_specs import GpuSpec, gpu_spec
from gpubox.doctor.model import LinkSample

GB = 1e9
# Transfer rate (GT/s) and line-code efficiency per PCIe generation (PCI-SIG base specifications):
# 8b/10b up to Gen2, 128b/130b for Gen3-5, and Gen6's 256-byte FLIT that carries 242 bytes of TLP and DLLP.
PCIE_SIGNALLING: Mapping[int, tuple[float, float]] = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}
LANE_GB_PER_S: Mapping[int, float] = {gen: gt * code / 8 for gen, (gt, code) in PCIE_SIGNALLING.items()}

NOT_MEASURED = "not measured in this run (--full measures it)"


@dataclass(frozen=True)
class PcieLink:
    gen: int
    width: int

    @property
    def label(self) -> str:
        return f"Gen{self.gen} x{self.width}"

    @property
    def gb_per_s(self) -> float | None:
        """Theoretical rate per direction; None for a generation this table does not know."""
        lane = LANE_GB_PER_S.get(self.gen)
        return None if lane is None else lane * self.width

    @classmethod
    def of(cls, gen: int | None, width: int | None) -> PcieLink | None:
        return cls(gen, width) if gen and width else None


def link_under_load(
    samples: Iterable[LinkSample], gpu: int, since: float | None = None, until: float | None = None
) -> PcieLink | None:
    """The fastest link a GPU showed while the copies ran: an idle link drops to a lower speed and
    needs a moment to come back, so the slowest sample says little; a link that never reaches its
    maximum under load is downtrained."""
    seen = [
        link
        for s in samples
        if s.gpu == gpu
        and (since is None or s.at >= since)
        and (until is None or s.at <= until)
        and (link := PcieLink.of(s.pcie_gen, s.pcie_width)) is not None
    ]
    return max(seen, key=lambda link: (link.gb_per_s or 0.0, link.gen), default=None)


@dataclass(frozen=True)
class LinkCopy:
    """Copies of one kind across the PCIe link."""

    name: str  # "h2d_pinned", ...
    direction: str  # "h2d" (host to device) or "d2h"
    host_memory: str  # "pinned" or "pageable"
    bytes: int | None
    timer: str | None  # "cuda_event" or "wall"
    reps: int
    median_s: float | None
    min_s: float | None
    max_s: float | None
    gb_per_s: float | None  # bytes / median seconds
    link_gb_per_s: float | None  # theoretical, for the link under load
    link_fraction: float | None
    link_max_gb_per_s: float | None  # theoretical, for the best link GPU and slot allow
    link_max_fraction: float | None
    error: str | None


@dataclass(frozen=True)
class DeviceCopy:
    """A copy within GPU memory: every byte is read once and written once."""

    bytes: int | None
    timer: str | None
    reps: int
    median_s: float | None
    gb_per_s: float | None  # copy rate
    traffic_gb_per_s: float | None  # memory traffic, twice the copy rate
    memory_gb_per_s: float | None  # datasheet bandwidth; None when the GPU is not in the table
    memory_fraction: float | None
    error: str | None


@dataclass(frozen=True)
class Matmul:
    n: int | None
    dtype: str | None  # "bfloat16", or "float16" before Ampere
    matmuls_per_rep: int | None
    timer: str | None
    reps: int
    median_s: float | None
    tflops: float | None
    peak_tflops: float | None  # dense datasheet peak for dtype; None when unknown
    peak_fraction: float | None
    error: str | None


@dataclass(frozen=True)
class TransferResult:
    gpu: int | None  # NVML index
    device_name: str | None
    torch_version: str | None
    error: str | None  # why nothing was measured
    affinity_cpus: tuple[int, ...] | None  # the CPUs the benchmark ran on
    affinity_error: str | None
    link_now: PcieLink | None  # seen under load
    link_max: PcieLink | None
    h2d_pageable: LinkCopy
    h2d_pinned: LinkCopy
    d2h_pageable: LinkCopy
    d2h_pinned: LinkCopy
    d2d: DeviceCopy
    matmul: Matmul

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def transfer_result(
    data: Mapping[str, Any],
    *,
    gpu: int | None,
    link_now: PcieLink | None = None,
    link_max: PcieLink | None = None,
    gpu_name: str | None = None,
) -> TransferResult:
    """torch_bench.py transfer's answer, measured against the link and the GPU's datasheet."""
    device = _mapping(data.get("device"))
    name = gpu_name or _text(device.get("name"))
    error = _text(data.get("error"))
    copies = _mapping(data.get("copies"))
    kinds = ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "d2d")
    entry = {kind: _entry(copies.get(kind), error or NOT_MEASURED) for kind in kinds}
    default_bytes = _int(data.get("bytes"))
    affinity = _mapping(data.get("affinity"))
    cpus = affinity.get("cpus")
    spec = gpu_spec(name)
    return TransferResult(
        gpu=gpu,
        device_name=name,
        torch_version=_text(data.get("torch_version")),
        error=error,
        affinity_cpus=tuple(int(c) for c in cpus) if isinstance(cpus, list) else None,
        affinity_error=_text(affinity.get("error")),
        link_now=link_now,
        link_max=link_max,
        h2d_pageable=_link_copy("h2d_pageable", entry["h2d_pageable"], default_bytes, link_now, link_max),
        h2d_pinned=_link_copy("h2d_pinned", entry["h2d_pinned"], default_bytes, link_now, link_max),
        d2h_pageable=_link_copy("d2h_pageable", entry["d2h_pageable"], default_bytes, link_now, link_max),
        d2h_pinned=_link_copy("d2h_pinned", entry["d2h_pinned"], default_bytes, link_now, link_max),
        d2d=_device_copy(entry["d2d"], default_bytes, spec),
        matmul=_matmul(_entry(data.get("matmul"), error or NOT_MEASURED), spec),
    )


def failed_transfer(reason: str, *, gpu: int | None, gpu_name: str | None = None) -> TransferResult:
    """A benchmark that did not run (no torch, no CUDA, timed out): every figure null, with the reason."""
    return transfer_result({"error": reason}, gpu=gpu, gpu_name=gpu_name)


def copy_window(data: Mapping[str, Any]) -> tuple[float, float] | None:
    """(first start, last end) of the copies in torch_bench.py's answer, on the system's monotonic
    clock: the window in which to look for the link under load."""
    copies = _mapping(data.get("copies")).values()
    starts = [c["started_at"] for c in copies if isinstance(c, Mapping) and isinstance(c.get("started_at"), float)]
    ends = [c["ended_at"] for c in copies if isinstance(c, Mapping) and isinstance(c.get("ended_at"), float)]
    return (min(starts), max(ends)) if starts and ends else None


def _mapping(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _entry(raw: Any, missing: str) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {"error": missing}


def _seconds(entry: Mapping[str, Any]) -> tuple[list[float], str | None]:
    """The repetitions' seconds, or the reason there are none."""
    if entry.get("error"):
        return [], str(entry["error"])
    raw = entry.get("seconds")
    if not isinstance(raw, list) or not raw:
        return [], "no timings came back"
    if not all(isinstance(s, int | float) and math.isfinite(s) and s > 0 for s in raw):
        return [], f"unusable timings: {raw[:3]}"
    return [float(s) for s in raw], None


def _link_copy(
    name: str, entry: Mapping[str, Any], default_bytes: int | None, now: PcieLink | None, best: PcieLink | None
) -> LinkCopy:
    seconds, error = _seconds(entry)
    nbytes = _int(entry.get("bytes")) or default_bytes
    median = statistics.median(seconds) if seconds else None
    rate = nbytes / median / GB if median and nbytes else None
    now_rate = now.gb_per_s if now else None
    best_rate = best.gb_per_s if best else None
    direction, _, memory = name.partition("_")
    return LinkCopy(
        name=name,
        direction=direction,
        host_memory=memory,
        bytes=nbytes,
        timer=_text(entry.get("timer")),
        reps=len(seconds),
        median_s=median,
        min_s=min(seconds) if seconds else None,
        max_s=max(seconds) if seconds else None,
        gb_per_s=rate,
        link_gb_per_s=now_rate,
        link_fraction=_ratio(rate, now_rate),
        link_max_gb_per_s=best_rate,
        link_max_fraction=_ratio(rate, best_rate),
        error=error,
    )


def _device_copy(entry: Mapping[str, Any], default_bytes: int | None, spec: GpuSpec | None) -> DeviceCopy:
    seconds, error = _seconds(entry)
    nbytes = _int(entry.get("bytes")) or default_bytes
    median = statistics.median(seconds) if seconds else None
    rate = nbytes / median / GB if median and nbytes else None
    traffic = 2 * rate if rate is not None else None
    memory = spec.memory_gb_per_s if spec else None
    return DeviceCopy(
        bytes=nbytes,
        timer=_text(entry.get("timer")),
        reps=len(seconds),
        median_s=median,
        gb_per_s=rate,
        traffic_gb_per_s=traffic,
        memory_gb_per_s=memory,
        memory_fraction=_ratio(traffic, memory),
        error=error,
    )


def _matmul(entry: Mapping[str, Any], spec: GpuSpec | None) -> Matmul:
    seconds, error = _seconds(entry)
    flops = _int(entry.get("flops"))
    median = statistics.median(seconds) if seconds else None
    tflops = flops / median / 1e12 if median and flops else None
    dtype = _text(entry.get("dtype"))
    peak = None
    if spec is not None:
        peak = spec.bf16_tflops if dtype == "bfloat16" else spec.fp16_tflops if dtype == "float16" else None
    return Matmul(
        n=_int(entry.get("n")),
        dtype=dtype,
        matmuls_per_rep=_int(entry.get("matmuls_per_rep")),
        timer=_text(entry.get("timer")),
        reps=len(seconds),
        median_s=median,
        tflops=tflops,
        peak_tflops=peak,
        peak_fraction=_ratio(tflops, peak),
        error=error,
    )


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _text(value: Any) -> str | None:
    return str(value) if value is not None and value != "" else None
