"""The transfer findings for one GPU: transfer_checks() turns a TransferResult into the checks of
the pinned copies against the PCIe link (transfer.h2d_pinned, transfer.d2h_pinned), pageable
against pinned copies (transfer.pageable), copies within GPU memory (transfer.d2d) and the matmul
rate (transfer.matmul), against the link and the GPU's datasheet figures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpubox.doctor.gpu_specs import gpu_spec
from gpubox.doctor.model import Check, Status, skipped
from gpubox.doctor.thresholds import Thresholds
from gpubox.doctor.transfer import LinkCopy, TransferResult

# impact = shortfall x weight: copies are a part of each step, the matmul rate is all of it
LINK_WEIGHT, D2D_WEIGHT, MATMUL_WEIGHT = 0.5, 0.3, 0.8


def transfer_checks(result: TransferResult, t: Thresholds) -> list[Check]:
    """The transfer findings for one GPU; a figure that is missing makes its check a skip, with why."""
    return [
        _link_check(result, result.h2d_pinned, t),
        _link_check(result, result.d2h_pinned, t),
        _pageable_check(result),
        _d2d_check(result, t.d2d_warn_fraction),
        _matmul_check(result, t.matmul_warn_fraction),
    ]


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
    # Judged against the link as it ran under load (pcie.link judges the link itself against its best), so
    # one downtrained link is one finding, not three; the best link is said alongside.
    reference, fraction = (
        (now, copy.link_fraction) if copy.link_fraction is not None else (best, copy.link_max_fraction)
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
    if reference is now and best is not None and copy.link_max_fraction is not None and best != now:
        detail += f" ({_pct(copy.link_max_fraction)} of the {_gb(best.gb_per_s)} at {best.label}, see pcie.link)"
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


def _pageable_check(result: TransferResult) -> Check:
    """Pageable against pinned copies: a figure for the pipeline, not a fault of the box (pageable copies
    are slower on every box); `gpubox doctor loader` measures whether pinning helps a given pipeline."""
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
    return Check(
        id=check_id,
        title=title,
        category="transfer",
        status="ok",
        detail=detail,
        value=round(100 * ratio, 1),
        unit="%",
        meaning=(
            "A copy from pageable memory goes through a staging buffer in the driver and holds the Python "
            "thread until it ends; from pinned memory the GPU's copy engine reads host memory directly, and "
            "the copy can overlap with compute. A DataLoader that does not pin its batches copies at the "
            "pageable rate: DataLoader(..., pin_memory=True) with batch.to(device, non_blocking=True) gets the "
            "pinned one (`gpubox doctor loader` measures it on your pipeline)."
        ),
        gpu=result.gpu,
        evidence={
            "h2d_pageable_gb_per_s": pageable.gb_per_s,
            "h2d_pinned_gb_per_s": pinned.gb_per_s,
            "d2h_pageable_gb_per_s": back,
            "d2h_pinned_gb_per_s": back_pinned,
            "ratio": ratio,
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
