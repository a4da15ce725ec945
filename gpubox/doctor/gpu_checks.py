"""Checks of each GPU's health: pure functions of the NVML facts, the samples taken while the
benchmarks loaded the GPUs, and the thresholds. gpu_checks() gathers them with the PCIe checks
(pcie_checks.py), which build on why_missing() and _check() here.

One check per GPU per question. A figure NVML does not give makes the check a skip that says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpubox.doctor.model import Check, GpuFacts, LinkSample, Status, SystemFacts, skipped
from gpubox.doctor.nvml_facts import SlotLimit
from gpubox.doctor.thresholds import Thresholds
from gpubox.telemetry.nvml_backend import CLOCK_EVENT_NAMES

GPU = "gpu"

# Clock event reasons (nvmlClocksEventReason*) that cost speed. NVML's documentation: HW slowdown
# cuts the clocks by a factor of two or more; the power brake is asserted by the system.
HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x40, 0x80  # nvmlClocksEventReasonHw*
HARDWARE_SLOWDOWN = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE
SW_POWER_CAP = 0x4
HW_FAIL_SHARE = 0.1  # a hardware slowdown in this share of the samples under load fails; less warns
POWER_CAP_NOTE_SHARE = 0.5  # the power cap in half the samples at full load is worth a word, not a warning
FULL_LOAD_BUSY = 90.0  # gpu_busy % from which a sample counts as full load
HW_SLOWDOWN_COST = 0.5  # share of speed lost while a hardware slowdown holds (clocks halved or worse)

WHY = {
    "not_supported": "this GPU or its driver does not report it",
    "no_permission": "NVML does not give it to this user (run as root to see it)",
    "function_missing": "the driver is older than the NVML call that reads it (update the driver)",
    "gpu_lost": "the GPU has fallen off the bus (look for Xid 79 in `sudo dmesg`)",
    "library_mismatch": "the driver and the NVML bindings disagree (update the driver or nvidia-ml-py)",
}


def gpu_checks(
    facts: SystemFacts,
    samples: Sequence[LinkSample] = (),
    thresholds: Thresholds | None = None,
    slots: Mapping[int, SlotLimit] | None = None,
) -> list[Check]:
    """Every GPU and PCIe check for every GPU. `samples`: the LinkSamples taken while the
    benchmarks loaded the GPUs (none: the links were only seen at rest); `slots`: the sysfs slot
    limits by GPU index (nvml_facts.read_slot_limits), without which pcie.slot relies on NVML."""
    # here, not at the top: pcie_checks imports this module's helpers
    from gpubox.doctor.pcie_checks import link_check, replays_check, slot_check

    t = thresholds or Thresholds()
    out: list[Check] = []
    for gpu in facts.gpus:
        mine = sorted((s for s in samples if s.gpu == gpu.index), key=lambda s: s.at)
        out += [
            persistence_check(gpu),
            ecc_check(gpu, t),
            memory_repair_check(gpu),
            clock_events_check(gpu, mine),
            power_limit_check(gpu, t),
            temperature_check(gpu, t),
            replays_check(gpu, mine, t),
            link_check(gpu, mine),
            slot_check(gpu, (slots or {}).get(gpu.index)),
        ]
    return out


def why_missing(gpu: GpuFacts, what: str, *fields: str) -> str:
    """The skip line for a figure NVML did not give: which, and why."""
    reason = next((gpu.missing[f] for f in fields if f in gpu.missing), "error")
    return f"NVML gives no {what} for GPU {gpu.index}: {WHY.get(reason, 'NVML failed to read it')} ({reason})"


def _check(gpu: GpuFacts, id: str, title: str, category: str, status: Status, detail: str, **kw: Any) -> Check:
    return Check(id=id, title=title, category=category, status=status, detail=detail, gpu=gpu.index, **kw)


# -- state of the GPU ---------------------------------------------------------------------------


def persistence_check(gpu: GpuFacts) -> Check:
    id, title, i = "gpu.persistence_mode", "Persistence mode", gpu.index
    if gpu.persistence_mode is None:
        return skipped(id, title, GPU, why_missing(gpu, "persistence mode", "persistence_mode"), i)
    evidence = {"persistence_mode": gpu.persistence_mode}
    if gpu.persistence_mode:
        return _check(gpu, id, title, GPU, "ok", "on", value=True, evidence=evidence)
    return _check(
        gpu,
        id,
        title,
        GPU,
        "warn",
        "off",
        value=False,
        meaning=(
            "Without it the driver tears the GPU down whenever no process uses it, so each new CUDA process "
            "waits for it to initialise again (a second or more per GPU), and settings made with nvidia-smi "
            "(power limit, clocks) can fall back to their defaults."
        ),
        fix=(
            "sudo systemctl enable --now nvidia-persistenced (the daemon NVIDIA recommends); "
            f"or, until the next reboot: sudo nvidia-smi -i {i} -pm 1"
        ),
        impact=0.05,
        evidence=evidence,
    )


def ecc_check(gpu: GpuFacts, t: Thresholds) -> Check:
    id, title, i = "gpu.ecc", "ECC memory errors", gpu.index
    if gpu.ecc_enabled is None:
        return skipped(id, title, GPU, why_missing(gpu, "ECC mode", "ecc_enabled"), i)
    unc, corr = gpu.ecc_uncorrected_volatile, gpu.ecc_corrected_volatile
    evidence = {
        "enabled": gpu.ecc_enabled,
        "pending": gpu.ecc_pending,
        "uncorrected_volatile": unc,
        "corrected_volatile": corr,
        "uncorrected_aggregate": gpu.ecc_uncorrected_aggregate,
        "corrected_aggregate": gpu.ecc_corrected_aggregate,
    }
    if not gpu.ecc_enabled:
        if gpu.ecc_pending:
            fix = f"Reboot, or stop the GPU's processes and reset it (sudo nvidia-smi -r -i {i}), to turn ECC on"
            return _check(
                gpu, id, title, GPU, "warn", "off; turns on at the next reboot", fix=fix, impact=0.02, evidence=evidence
            )
        meaning = (
            "Most GeForce and workstation boards ship with ECC off. Turning it on (sudo nvidia-smi -i "
            f"{i} -e 1, then a reboot) costs some memory bandwidth and capacity."
        )
        return _check(
            gpu, id, title, GPU, "ok", "off: memory errors are neither corrected nor counted", meaning=meaning
        )
    if unc is None or corr is None:
        return skipped(
            id,
            title,
            GPU,
            why_missing(gpu, "ECC error counts", "ecc_uncorrected_volatile", "ecc_corrected_volatile"),
            i,
        )
    life = gpu.ecc_uncorrected_aggregate
    counts = f"{unc} uncorrected and {corr} corrected since the driver loaded" + (
        f" ({life} uncorrected over the GPU's life)" if life is not None else ""
    )
    query = "ROW_REMAPPER" if gpu.remapped_rows_pending is not None else "PAGE_RETIREMENT"
    if unc > 0:
        return _check(
            gpu,
            id,
            title,
            GPU,
            "fail",
            f"ECC on; {counts}",
            value=unc,
            unit="count",
            meaning=(
                "An uncorrected memory error corrupts data: the process that touched it was stopped or its "
                "results are suspect (Xid 48, 63, 94 or 95 in the kernel log). The driver takes the bad memory "
                "out of use at the next GPU reset."
            ),
            fix=(
                f"nvidia-smi -q -d ECC,{query} -i {i} and sudo dmesg | grep -i xid show what happened; stop the "
                f"GPU's processes and reset it: sudo nvidia-smi -r -i {i}. If uncorrected errors come back "
                "after the reset, have the GPU replaced (RMA)."
            ),
            impact=1.0,
            evidence=evidence,
        )
    if corr > t.ecc_corrected_warn:
        return _check(
            gpu,
            id,
            title,
            GPU,
            "warn",
            f"ECC on; {counts}, above {t.ecc_corrected_warn:g}",
            value=corr,
            unit="count",
            meaning=(
                "ECC corrected these without harm, but so many point at weak memory that may soon give "
                "uncorrected errors, which stop jobs."
            ),
            fix=(
                f"Watch the count (nvidia-smi -q -d ECC,{query} -i {i}); if it keeps growing, plan a reset "
                f"(sudo nvidia-smi -r -i {i}) and ask the vendor about a replacement."
            ),
            impact=0.1,
            evidence=evidence,
        )
    return _check(gpu, id, title, GPU, "ok", f"ECC on; {counts}", value=unc, unit="count", evidence=evidence)


def memory_repair_check(gpu: GpuFacts) -> Check:
    """Row remapping (Ampere and newer), or page retirement on older GPUs."""
    i = gpu.index
    if gpu.remapped_rows_pending is not None:
        id, title = "gpu.remapped_rows", "Row remapping"
        corr, unc = gpu.remapped_rows_corrected, gpu.remapped_rows_uncorrected
        value = {"corrected": corr, "uncorrected": unc, "pending": gpu.remapped_rows_pending}
        value["failed"] = gpu.remapped_rows_failed
        rows = f"{_rows(unc)} remapped for uncorrected errors, {_rows(corr)} for corrected ones"
        query = f"nvidia-smi -q -d ROW_REMAPPER -i {i}"
        if gpu.remapped_rows_failed:
            return _check(
                gpu,
                id,
                title,
                GPU,
                "fail",
                f"a row remap failed ({rows})",
                value=value,
                unit="rows",
                meaning="The GPU could not swap a spare row in for bad memory: NVIDIA says such a GPU needs service.",
                fix=f"Stop using GPU {i}; record {query}, then ask the vendor for a replacement (RMA).",
                impact=1.0,
                evidence=value,
            )
        if gpu.remapped_rows_pending:
            return _check(
                gpu,
                id,
                title,
                GPU,
                "fail",
                f"a row remap waits for a GPU reset ({rows})",
                value=value,
                unit="rows",
                meaning=(
                    "The GPU found bad memory and swaps a spare row in at its next reset; until then it runs "
                    "with that memory fenced off, and NVIDIA advises resetting it soon."
                ),
                fix=f"Stop the GPU's processes, then: sudo nvidia-smi -r -i {i} (or reboot); check with {query}",
                impact=0.8,
                evidence=value,
            )
        return _check(gpu, id, title, GPU, "ok", f"no remap pending or failed; {rows}", value=value, unit="rows")
    if gpu.retired_pages_pending is not None:
        id, title = "gpu.retired_pages", "Retired memory pages"
        evidence = {"pending": gpu.retired_pages_pending}
        if not gpu.retired_pages_pending:
            return _check(gpu, id, title, GPU, "ok", "no page retirement pending", value=False, evidence=evidence)
        return _check(
            gpu,
            id,
            title,
            GPU,
            "fail",
            "a page retirement waits for a GPU reset or reboot",
            value=True,
            meaning="A memory page went bad; the driver stops using it once the GPU is reset or the driver reloads.",
            fix=(
                f"Stop the GPU's processes, then reset it (sudo nvidia-smi -r -i {i}) or reboot; "
                f"check with nvidia-smi -q -d PAGE_RETIREMENT -i {i}"
            ),
            impact=0.8,
            evidence=evidence,
        )
    why = why_missing(gpu, "row remapping or page retirement state", "remapped_rows_pending", "retired_pages_pending")
    return skipped("gpu.remapped_rows", "Row remapping", GPU, why, i)


def power_limit_check(gpu: GpuFacts, t: Thresholds) -> Check:
    id, title, i = "gpu.power_limit", "Power limit", gpu.index
    now, default = gpu.power_limit_w, gpu.power_default_limit_w
    if now is None or default is None or default <= 0:
        return skipped(id, title, GPU, why_missing(gpu, "power limit", "power_limit_w", "power_default_limit_w"), i)
    ratio = now / default
    top = f", max {gpu.power_max_limit_w:.0f} W" if gpu.power_max_limit_w is not None else ""
    detail = f"{now:.0f} W enforced, {ratio:.0%} of the {default:.0f} W default{top}"
    evidence = {"enforced_w": now, "default_w": default, "max_w": gpu.power_max_limit_w}
    if ratio >= t.power_limit_warn_fraction:
        return _check(gpu, id, title, GPU, "ok", detail, value=now, unit="W", evidence=evidence)
    return _check(
        gpu,
        id,
        title,
        GPU,
        "warn",
        detail,
        value=now,
        unit="W",
        meaning="Held below its default power, the GPU runs compute-heavy work at lower clocks.",
        fix=(
            f"If nobody lowered it on purpose (heat, power budget): sudo nvidia-smi -i {i} -pl {default:.0f}. "
            f"nvidia-smi -q -d POWER -i {i} shows which limit is in force; a limit set by nvidia-smi lasts until "
            "the driver unloads, so keep persistence mode on and set it again at boot."
        ),
        impact=min(1.0, (1 - ratio) * 0.5),
        evidence=evidence,
    )


def temperature_check(gpu: GpuFacts, t: Thresholds) -> Check:
    id, title, i = "gpu.temperature", "Temperature", gpu.index
    temp, slowdown = gpu.temperature_c, gpu.temperature_slowdown_c
    if temp is None or slowdown is None:
        return skipped(id, title, GPU, why_missing(gpu, "temperature", "temperature_c", "temperature_slowdown_c"), i)
    margin = slowdown - temp
    evidence = {
        "temperature_c": temp,
        "slowdown_c": slowdown,
        "margin_c": margin,
        "warn_margin_c": t.temperature_margin_c,
    }
    if margin >= t.temperature_margin_c:
        detail = f"{temp:.0f} C, {margin:.0f} C below the {slowdown:.0f} C where it slows down"
        return _check(gpu, id, title, GPU, "ok", detail, value=temp, unit="C", evidence=evidence)
    hot = margin <= 0
    detail = (
        f"{temp:.0f} C, at or above the {slowdown:.0f} C where it slows down"
        if hot
        else f"{temp:.0f} C, only {margin:.0f} C below the {slowdown:.0f} C where it slows down"
    )
    return _check(
        gpu,
        id,
        title,
        GPU,
        "fail" if hot else "warn",
        detail,
        value=temp,
        unit="C",
        meaning="At the slowdown temperature the GPU lowers its clocks to cool down; near it, more load throttles.",
        fix=(
            f"Check the cooling (nvidia-smi -q -d TEMPERATURE,PERFORMANCE -i {i}): clear the airflow path and "
            "filters, check the fans and the inlet temperature, leave a slot free between cards; or lower the "
            f"power limit (sudo nvidia-smi -i {i} -pl <watts>)."
        ),
        impact=0.3 if hot else 0.1,
        evidence=evidence,
    )


def clock_events_check(gpu: GpuFacts, samples: Sequence[LinkSample]) -> Check:
    id, title, i = "gpu.clock_events", "Clock event reasons under load", gpu.index
    ordered = sorted(samples, key=lambda s: s.at)
    seen: list[tuple[int, float | None]] = [
        (s.clock_event_reasons, s.gpu_busy) for s in ordered if s.clock_event_reasons is not None
    ]
    if not seen:
        rest = gpu.clock_event_reasons
        if rest is None:
            return skipped(id, title, GPU, why_missing(gpu, "clock event reasons", "clock_event_reasons"), i)
        if not rest & HARDWARE_SLOWDOWN:
            names = ", ".join(_names(rest)) or "none"
            why = f"seen only at rest ({names}): no benchmark loaded GPU {i}, and at rest low clocks are on purpose"
            return skipped(id, title, GPU, why, i)
        seen = [(rest, None)]  # a hardware slowdown at rest is a finding of its own
    n = len(seen)
    share = {name: sum(1 for m, _ in seen if m & bit) / n for bit, name in CLOCK_EVENT_NAMES}
    full = [m for m, busy in seen if busy is None or busy >= FULL_LOAD_BUSY]
    power_cap = sum(1 for m in full if m & SW_POWER_CAP) / len(full) if full else 0.0
    hardware = _hardware_slowdowns([m for m, _ in seen]) / n
    thermal = share["sw_thermal_slowdown"]
    value = {name: round(s, 3) for name, s in share.items() if s > 0}
    evidence = {"samples": n, "full_load_samples": len(full), "shares": value, "power_cap_at_full_load": power_cap}
    observed = ", ".join(f"{name} in {s:.0%}" for name, s in value.items()) or "no clock event"
    detail = f"{observed} of {n} sample{'s' if n != 1 else ''} under load"
    fixes = []
    if share["hw_thermal_slowdown"] or thermal:
        fixes.append(f"cooling: airflow, fans and inlet temperature (nvidia-smi -q -d TEMPERATURE -i {i})")
    if share["hw_power_brake_slowdown"]:
        fixes.append("the system applied the power brake: check the power supplies, the PDU and the BMC's power cap")
    if share["hw_slowdown"]:
        fixes.append("check the GPU's power cables and the power supply" + ("" if fixes else ", and its cooling"))
    status: Status = "ok"
    impact = 0.0
    if hardware:
        status, impact = ("fail" if hardware >= HW_FAIL_SHARE else "warn"), hardware * HW_SLOWDOWN_COST
    elif thermal:
        status, impact = "warn", thermal * 0.2
    if status == "ok":
        # Sustained heavy kernels run at the power limit by design; a lowered limit is gpu.power_limit's finding.
        why = (
            "the GPU ran at its power limit, as heavy kernels do (gpu.power_limit says whether that limit is lowered)"
            if power_cap >= POWER_CAP_NOTE_SHARE
            else "none holds speed back"
        )
        return _check(gpu, id, title, GPU, "ok", f"{detail}: {why}", value=value, evidence=evidence)
    return _check(
        gpu,
        id,
        title,
        GPU,
        status,
        detail,
        value=value,
        unit="share of samples",
        meaning="The GPU held its clocks down while it worked, so its kernels ran slower"
        + (": a hardware slowdown cuts them by half or more." if hardware else "."),
        fix=f"nvidia-smi -q -d PERFORMANCE -i {i} shows the active reasons; " + "; ".join(fixes),
        impact=min(1.0, impact),
        evidence=evidence,
    )


def _hardware_slowdowns(masks: Sequence[int]) -> int:
    """Samples held back by hardware: thermal or power-brake slowdown always; the bare hw_slowdown bit
    only twice in a row, as NVML also sets it for a moment during a P-state or clock change."""
    count = 0
    for k, mask in enumerate(masks):
        bare = bool(mask & HW_SLOWDOWN)
        neighbours = (masks[k - 1] if k else 0) | (masks[k + 1] if k + 1 < len(masks) else 0)
        if mask & (HW_THERMAL | HW_POWER_BRAKE) or (bare and neighbours & HW_SLOWDOWN):
            count += 1
    return count


def _names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_NAMES if mask & bit]


def _rows(n: int | None) -> str:
    return f"{n} row{'' if n == 1 else 's'}"
