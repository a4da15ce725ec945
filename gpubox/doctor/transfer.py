"""The copy and matmul benchmarks judged: pure arithmetic on the timings torch_bench.py reports,
against the PCIe link seen under load and the GPU's datasheet figures.

Rates are in GB/s of 1e9 bytes. A link's theoretical rate is per direction, after line encoding.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpubox.doctor.model import Check, LinkSample, Status, skipped
from gpubox.doctor.thresholds import Thresholds

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

# Defaults for limits that Thresholds may carry under the same names in lower case (doctor.* settings)
PAGEABLE_WARN_RATIO = 0.5  # pageable host-to-device below half the pinned rate: pinning is worth it
D2D_WARN_FRACTION = 0.5  # on-GPU copy traffic below half the datasheet memory bandwidth
MATMUL_WARN_FRACTION = 0.4  # a large matmul below 40% of the dense peak: clocks are held back
# impact = shortfall x weight: copies are a part of each step, the matmul rate is all of it
LINK_WEIGHT, PAGEABLE_WEIGHT, D2D_WEIGHT, MATMUL_WEIGHT = 0.5, 0.3, 0.3, 0.8
NOT_MEASURED = "not measured in this run (--full measures it)"


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


def transfer_checks(result: TransferResult, t: Thresholds) -> list[Check]:
    """The transfer findings for one GPU; a figure that is missing makes its check a skip, with why."""
    return [
        _link_check(result, result.h2d_pinned, t),
        _link_check(result, result.d2h_pinned, t),
        _pageable_check(result, _limit(t, "pageable_warn_ratio", PAGEABLE_WARN_RATIO)),
        _d2d_check(result, _limit(t, "d2d_warn_fraction", D2D_WARN_FRACTION)),
        _matmul_check(result, _limit(t, "matmul_warn_fraction", MATMUL_WARN_FRACTION)),
    ]


def copy_window(data: Mapping[str, Any]) -> tuple[float, float] | None:
    """(first start, last end) of the copies in torch_bench.py's answer, on the system's monotonic
    clock: the window in which to look for the link under load."""
    copies = _mapping(data.get("copies")).values()
    starts = [c["started_at"] for c in copies if isinstance(c, Mapping) and isinstance(c.get("started_at"), float)]
    ends = [c["ended_at"] for c in copies if isinstance(c, Mapping) and isinstance(c.get("ended_at"), float)]
    return (min(starts), max(ends)) if starts and ends else None


def _limit(t: Thresholds, name: str, default: float) -> float:
    """A limit from the thresholds when they carry it, else this module's default."""
    return float(getattr(t, name, default))


_LINK_WORDS = {"h2d": "host-to-device", "d2h": "device-to-host"}
_LINK_MEANING = {
    "h2d": "Every batch crosses this link on its way to the GPU: a slow copy stretches each step it does not overlap.",
    "d2h": "Outputs, metrics and checkpoints come back over this link.",
}


def _link_check(result: TransferResult, copy: LinkCopy, t: Thresholds) -> Check:
    words = _LINK_WORDS[copy.direction]
    check_id, title = f"transfer.{copy.name}", f"{words.capitalize()} copies (pinned)"
    if copy.gb_per_s is None:
        return skipped(check_id, title, "transfer", copy.error or "not measured", result.gpu)
    now, best = result.link_now, result.link_max
    reference, fraction = (
        (best, copy.link_max_fraction) if copy.link_max_fraction is not None else (now, copy.link_fraction)
    )
    base = Check(
        id=check_id,
        title=title,
        category="transfer",
        status="ok",
        detail=f"{_gb(copy.gb_per_s)} {words} from pinned memory",
        value=round(copy.gb_per_s, 3),
        unit="GB/s",
        meaning=_LINK_MEANING[copy.direction],
        gpu=result.gpu,
        evidence=_copy_evidence(result, copy),
    )
    if reference is None or fraction is None:
        return dataclasses.replace(base, detail=base.detail + "; the link's speed is unknown, so no verdict")
    detail = f"{base.detail}, {_pct(fraction)} of the {_gb(reference.gb_per_s)} a {reference.label} link carries"
    status: Status = (
        "fail" if fraction < t.transfer_fail_fraction else "warn" if fraction < t.transfer_warn_fraction else "ok"
    )
    if status == "ok":
        return dataclasses.replace(base, detail=detail)
    if now is not None and best is not None and (now.gb_per_s or 0.0) < (best.gb_per_s or 0.0):
        detail += f": the link ran at {now.label} under load"
        meaning = (
            "The link trained below what the GPU and its slot allow, and that caps every copy to and from the GPU."
        )
        fix = (
            f"Reseat the GPU (or move it to another {best.label} slot), check riser cables or retimers and the "
            f"BIOS PCIe speed setting (Auto or Gen{best.gen}), then rerun `gpubox doctor --only pcie,transfer`"
        )
    else:
        detail += ", and the link ran at its best under load" if now is not None else ""
        meaning = (
            "The link is not what holds these copies back: the host side is (memory placement, IOMMU, other traffic)."
        )
        fix = (
            "Check what else uses this link or its PCIe switch while training runs, that the IOMMU is off or in "
            "passthrough (iommu=pt on the kernel command line), and that the copying process runs on the CPUs of "
            "the GPU's NUMA node"
        )
        if result.affinity_error:
            fix += f" (this benchmark could not run there: {result.affinity_error})"
    return dataclasses.replace(
        base, status=status, detail=detail, meaning=meaning, fix=fix, impact=round(LINK_WEIGHT * (1 - fraction), 3)
    )


def _pageable_check(result: TransferResult, warn_ratio: float) -> Check:
    check_id, title = "transfer.pageable", "Pageable against pinned copies"
    pageable, pinned = result.h2d_pageable, result.h2d_pinned
    if pageable.gb_per_s is None or pinned.gb_per_s is None:
        why = pageable.error or pinned.error or "not measured"
        return skipped(check_id, title, "transfer", why, result.gpu)
    ratio = pageable.gb_per_s / pinned.gb_per_s
    detail = (
        f"host-to-device {_gb(pageable.gb_per_s)} from pageable memory, {_pct(ratio)} of "
        f"the {_gb(pinned.gb_per_s)} from pinned memory"
    )
    back, back_pinned = result.d2h_pageable.gb_per_s, result.d2h_pinned.gb_per_s
    if back is not None and back_pinned is not None:
        detail += f"; device-to-host {_gb(back)} against {_gb(back_pinned)}"
    slow = ratio < warn_ratio
    return Check(
        id=check_id,
        title=title,
        category="transfer",
        status="warn" if slow else "ok",
        detail=detail,
        value=round(100 * ratio, 1),
        unit="%",
        meaning=(
            "A copy from pageable memory goes through a staging buffer in the driver and holds the Python "
            "thread until it ends; from pinned memory the GPU's copy engine reads host memory directly, and "
            "the copy can overlap with compute."
        ),
        fix="DataLoader(..., pin_memory=True), and batch.to(device, non_blocking=True) in the training loop"
        if slow
        else None,
        gpu=result.gpu,
        impact=round(PAGEABLE_WEIGHT * (1 - ratio), 3) if slow else 0.0,
        evidence={
            "h2d_pageable_gb_per_s": pageable.gb_per_s,
            "h2d_pinned_gb_per_s": pinned.gb_per_s,
            "d2h_pageable_gb_per_s": back,
            "d2h_pinned_gb_per_s": back_pinned,
            "ratio": ratio,
            "warn_below": warn_ratio,
        },
    )


def _d2d_check(result: TransferResult, warn_fraction: float) -> Check:
    check_id, title, copy = "transfer.d2d", "Copies within GPU memory", result.d2d
    if copy.gb_per_s is None or copy.traffic_gb_per_s is None:
        return skipped(check_id, title, "transfer", copy.error or "not measured", result.gpu)
    detail = f"{_gb(copy.gb_per_s)} copied within GPU memory ({_gb(copy.traffic_gb_per_s)} of memory traffic"
    spec = gpu_spec(result.device_name)
    fraction = copy.memory_fraction
    if spec is None or copy.memory_gb_per_s is None or fraction is None:
        detail += f"); the memory bandwidth of {result.device_name or 'this GPU'} is not in gpubox's table"
    else:
        detail += f", {_pct(fraction)} of the {spec.label}'s {_gb(copy.memory_gb_per_s)})"
    slow = fraction is not None and fraction < warn_fraction
    return Check(
        id=check_id,
        title=title,
        category="transfer",
        status="warn" if slow else "ok",
        detail=detail,
        value=round(copy.gb_per_s, 3),
        unit="GB/s",
        meaning=(
            "A large copy within GPU memory reads and writes every byte, so it moves close to the datasheet "
            "memory bandwidth; far below it, memory clocks were held back or another process used the GPU."
            if slow
            else "Copies within GPU memory show the memory bandwidth that kernels have to work with."
        ),
        fix="Rerun with nothing else on the GPU (gpubox top shows its processes), and see the gpu.* findings "
        "for clocks held back by power or temperature"
        if slow
        else None,
        gpu=result.gpu,
        impact=round(D2D_WEIGHT * (1 - fraction), 3) if slow and fraction is not None else 0.0,
        evidence={
            "bytes": copy.bytes,
            "reps": copy.reps,
            "median_s": copy.median_s,
            "timer": copy.timer,
            "traffic_gb_per_s": copy.traffic_gb_per_s,
            "memory_gb_per_s": copy.memory_gb_per_s,
            "memory_fraction": fraction,
            "warn_below": warn_fraction,
        },
    )


def _matmul_check(result: TransferResult, warn_fraction: float) -> Check:
    check_id, title, mm = "transfer.matmul", "Matmul rate", result.matmul
    if mm.tflops is None:
        return skipped(check_id, title, "transfer", mm.error or "not measured", result.gpu)
    what = f"{mm.tflops:,.0f} TFLOPS in {mm.n}x{mm.n} {mm.dtype} matmuls"
    spec = gpu_spec(result.device_name)
    fraction = mm.peak_fraction
    if spec is None or mm.peak_tflops is None or fraction is None:
        detail = f"{what}; no {mm.dtype} peak is known for {result.device_name or 'this GPU'}"
    else:
        detail = f"{what}, {_pct(fraction)} of the {spec.label}'s dense peak of {mm.peak_tflops:,.0f} TFLOPS"
    slow = fraction is not None and fraction < warn_fraction
    return Check(
        id=check_id,
        title=title,
        category="transfer",
        status="warn" if slow else "ok",
        detail=detail,
        value=round(mm.tflops, 1),
        unit="TFLOPS",
        meaning=(
            "Large matmuls usually reach well over half of the datasheet peak, which assumes the boost clock; "
            "this far below it, the SM clock was likely held back (power cap, temperature, a locked clock) or "
            "another process shared the GPU."
            if slow
            else "How fast the tensor cores run a large matmul, against the datasheet's dense peak."
        ),
        fix="See the gpu.* findings for clock event reasons under load; `nvidia-smi -q -d PERFORMANCE,POWER,CLOCK` "
        "during a run shows what holds the clock back"
        if slow
        else None,
        gpu=result.gpu,
        impact=round(MATMUL_WEIGHT * (1 - fraction), 3) if slow and fraction is not None else 0.0,
        evidence={
            "n": mm.n,
            "dtype": mm.dtype,
            "matmuls_per_rep": mm.matmuls_per_rep,
            "reps": mm.reps,
            "median_s": mm.median_s,
            "peak_tflops": mm.peak_tflops,
            "peak_fraction": fraction,
            "warn_below": warn_fraction,
        },
    )


def _copy_evidence(result: TransferResult, copy: LinkCopy) -> dict[str, Any]:
    return {
        "bytes": copy.bytes,
        "reps": copy.reps,
        "median_s": copy.median_s,
        "min_s": copy.min_s,
        "max_s": copy.max_s,
        "timer": copy.timer,
        "link_under_load": result.link_now.label if result.link_now else None,
        "link_max": result.link_max.label if result.link_max else None,
        "link_gb_per_s": copy.link_gb_per_s,
        "link_fraction": copy.link_fraction,
        "link_max_gb_per_s": copy.link_max_gb_per_s,
        "link_max_fraction": copy.link_max_fraction,
        "affinity_cpus": list(result.affinity_cpus) if result.affinity_cpus is not None else None,
    }


def _gb(rate: float | None) -> str:
    if rate is None:
        return "? GB/s"
    return f"{rate:,.0f} GB/s" if rate >= 100 else f"{rate:.1f} GB/s"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


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
