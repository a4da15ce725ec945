"""The PCIe checks of each GPU: replays counted while the benchmarks ran (pcie.replays), the link
seen under load against the best the GPU and slot allow (pcie.link), and whether the slot or the GPU
limits that best (pcie.slot). Pure functions of the NVML facts, the link samples, the sysfs slot
limits and the thresholds; gpu_checks.gpu_checks() runs them after the GPU's own checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpubox.doctor.gpu_checks import _check, why_missing
from gpubox.doctor.model import Check, GpuFacts, LinkSample, skipped
from gpubox.doctor.nvml_facts import SlotLimit
from gpubox.doctor.thresholds import Thresholds
from gpubox.doctor.transfer import PcieLink, link_under_load

PCIE = "pcie"
REPLAY_FAIL_FACTOR = 10  # replays above this many times doctor.pcie_replay_warn fail
LINK_FAIL_LOSS = 0.5  # a link under load that lost this share of its bandwidth fails; less warns


def replays_check(gpu: GpuFacts, samples: Sequence[LinkSample], t: Thresholds) -> Check:
    id, title, i = "pcie.replays", "PCIe replays", gpu.index
    counts = [s.pcie_replay_count for s in samples if s.pcie_replay_count is not None]
    if len(counts) < 2:
        if gpu.pcie_replay_count is None:
            return skipped(id, title, PCIE, why_missing(gpu, "PCIe replay counter", "pcie_replay_count"), i)
        why = f"counted once ({gpu.pcie_replay_count} since the driver loaded): no benchmark ran to see it grow"
        return skipped(id, title, PCIE, why, i)
    growth = max(0, counts[-1] - counts[0])
    evidence = {"first": counts[0], "last": counts[-1], "growth": growth, "samples": len(counts)}
    detail = f"{growth} replays while the benchmarks ran ({counts[0]} to {counts[-1]} since the driver loaded)"
    if growth <= t.pcie_replay_warn:
        return _check(gpu, id, title, PCIE, "ok", detail, value=growth, unit="count", evidence=evidence)
    bad = growth > t.pcie_replay_warn * REPLAY_FAIL_FACTOR
    return _check(
        gpu,
        id,
        title,
        PCIE,
        "fail" if bad else "warn",
        f"{detail}, above {t.pcie_replay_warn:g}",
        value=growth,
        unit="count",
        meaning=(
            "Each replay resends a packet that arrived corrupted: a marginal link (seating, riser, cable, "
            "retimer) wastes bandwidth and may drop to a lower speed or fail."
        ),
        fix=(
            f"Reseat GPU {i} and any riser or cable, or try another slot; update the BIOS and the GPU firmware; "
            "behind a riser, set the slot one PCIe generation lower in the BIOS. "
            f"nvidia-smi -q -i {i} | grep -i replay shows the counter."
        ),
        impact=0.3 if bad else 0.1,
        evidence=evidence,
    )


def link_check(gpu: GpuFacts, samples: Sequence[LinkSample]) -> Check:
    id, title, i = "pcie.link", "PCIe link under load", gpu.index
    best_possible = PcieLink.of(gpu.pcie_gen_max, gpu.pcie_width_max)
    if best_possible is None:
        return skipped(id, title, PCIE, why_missing(gpu, "maximum PCIe link", "pcie_gen_max", "pcie_width_max"), i)
    rest = PcieLink.of(gpu.pcie_gen, gpu.pcie_width)
    loaded = link_under_load(samples, i)
    evidence: dict[str, Any] = {
        "max": best_possible.label,
        "under_load": loaded.label if loaded else None,
        "at_rest": rest.label if rest else None,
        "samples": sum(1 for s in samples if s.pcie_gen is not None),
    }
    if loaded is None:
        if rest is not None and _reaches(rest, best_possible):
            detail = f"{rest.label} at rest, its maximum"
            return _check(gpu, id, title, PCIE, "ok", detail, value=rest.label, evidence=evidence)
        now = f"{rest.label} of {best_possible.label}" if rest else "unknown"
        why = (
            f"seen only at rest ({now}): an idle link slows down to save power, and no benchmark loaded GPU {i} "
            "to see it come back up"
        )
        return skipped(id, title, PCIE, why, i)
    if _reaches(loaded, best_possible):
        detail = f"{loaded.label} under load, its maximum" + (
            f" ({rest.label} at rest)" if rest and rest != loaded else ""
        )
        return _check(gpu, id, title, PCIE, "ok", detail, value=loaded.label, evidence=evidence)
    lost = 1 - (loaded.gb_per_s or 0.0) / (best_possible.gb_per_s or 1.0)
    evidence["bandwidth_lost"] = round(lost, 3)
    where = f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""
    check_cmd = f"sudo lspci -vv -s {gpu.pci_bus_id} | grep -E 'LnkCap|LnkSta'" if gpu.pci_bus_id else "sudo lspci -vv"
    narrow = loaded.width < best_possible.width
    return _check(
        gpu,
        id,
        title,
        PCIE,
        "fail" if lost >= LINK_FAIL_LOSS else "warn",
        (
            f"{loaded.label} under load, below the {best_possible.label} the GPU and slot allow: "
            f"{lost:.0%} of the link's bandwidth lost ({_gb(loaded.gb_per_s)} of {_gb(best_possible.gb_per_s)})"
        ),
        value=loaded.label,
        meaning=(
            "The link trained below what the GPU and its slot allow and stayed there under load: every copy "
            "between host and GPU is capped at the lower rate."
            + (
                " A narrower link usually means a card not fully seated or a slot wired for fewer lanes."
                if narrow
                else ""
            )
        ),
        fix=(
            f"Reseat GPU {i}{where} and any riser or cable, in a slot wired x{best_possible.width}; in the BIOS set "
            f"the slot's PCIe speed to Auto (or Gen{best_possible.gen}) and update the BIOS; then check: {check_cmd}"
        ),
        impact=max(0.0, min(1.0, lost)),
        evidence=evidence,
    )


def slot_check(gpu: GpuFacts, slot: SlotLimit | None) -> Check:
    """Whether the slot (the port above the GPU) or the GPU itself limits the link."""
    id, title, i = "pcie.slot", "PCIe slot", gpu.index
    gpu_gen = (slot.gpu_gen_max if slot else None) or gpu.pcie_gen_gpu_max
    gpu_width = slot.gpu_width_max if slot else None
    port_gen, port_width = (slot.port_gen_max, slot.port_width_max) if slot else (None, None)
    evidence: dict[str, Any] = {
        "gpu_gen_max": gpu_gen,
        "gpu_width_max": gpu_width,
        "port": slot.port if slot else None,
        "port_gen_max": port_gen,
        "port_width_max": port_width,
        "nvml_gen_max": gpu.pcie_gen_max,
        "nvml_gpu_gen_max": gpu.pcie_gen_gpu_max,
    }
    if gpu_gen is None or (port_gen is None and gpu.pcie_gen_max is None):
        sysfs = ", ".join(sorted(set(slot.missing.values()))) if slot and slot.missing else "not read"
        why = why_missing(gpu, "maximum link generation", "pcie_gen_gpu_max", "pcie_gen_max") + f"; sysfs: {sysfs}"
        return skipped(id, title, PCIE, why, i)
    gpu_link = f"Gen{gpu_gen}" + (f" x{gpu_width}" if gpu_width else "")
    # the slot: the port above the GPU where sysfs tells, else what NVML says GPU and system allow together
    slot_gen: int | None
    if port_gen is not None:
        slot_gen, slot_width, source = port_gen, port_width, f"port {slot.port if slot else '?'}"
    else:
        slot_gen, slot_width, source = gpu.pcie_gen_max, gpu.pcie_width_max if gpu_width else None, "NVML"
    slot_link = f"Gen{slot_gen}" + (f" x{slot_width}" if slot_width else "")
    value = {"gpu": gpu_link, "slot": slot_link}
    width = gpu_width or slot_width or 16  # the ratio needs a width; the same on both sides when unknown
    full = PcieLink(gpu_gen, width)
    capped = PcieLink(min(gpu_gen, slot_gen or gpu_gen), min(width, slot_width or width))
    if capped != full:
        lost = 1 - (capped.gb_per_s or 0.0) / (full.gb_per_s or 1.0)
        evidence["bandwidth_lost"] = round(lost, 3)
        return _check(
            gpu,
            id,
            title,
            PCIE,
            "warn",
            f"the slot allows {slot_link} ({source}), the GPU {gpu_link}: the slot caps the link {lost:.0%} lower",
            value=value,
            meaning="The GPU can talk faster than its slot allows: every copy to and from it runs at the slot's rate.",
            fix=(
                f"Move GPU {i} to a Gen{gpu_gen} x{width} slot wired to the CPU (the board's manual says which), "
                "or accept the slot's rate."
            ),
            impact=max(0.0, min(1.0, lost)),
            evidence=evidence,
        )
    if port_gen is not None and gpu.pcie_gen_max is not None and gpu.pcie_gen_max < min(gpu_gen, port_gen):
        return _check(
            gpu,
            id,
            title,
            PCIE,
            "warn",
            f"the slot (port {slot.port if slot else '?'}) and the GPU both allow Gen{min(gpu_gen, port_gen)}, "
            f"yet NVML caps the link at Gen{gpu.pcie_gen_max}",
            value=value,
            meaning="Hardware on both ends can do more: a BIOS setting most likely holds the slot's speed down.",
            fix=f"In the BIOS set this slot's PCIe speed to Auto (or Gen{min(gpu_gen, port_gen)}); update the BIOS.",
            impact=0.3,
            evidence=evidence,
        )
    detail = f"the slot allows {slot_link} ({source}), as much as the GPU ({gpu_link})"
    return _check(gpu, id, title, PCIE, "ok", detail, value=value, evidence=evidence)


def _reaches(link: PcieLink, best: PcieLink) -> bool:
    return link.gen >= best.gen and link.width >= best.width


def _gb(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.1f} GB/s"
