"""The GPU and PCIe checks: each doctor scenario through the real pynvml on the fake NVML library
(facts read at rest, then link samples under load), and the verdicts' edges on hand-made facts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpubox.doctor.gpu_checks import gpu_checks
from gpubox.doctor.model import Check, GpuFacts, LinkSample, SystemFacts
from gpubox.doctor.nvml_facts import LinkSampler, SlotLimit, read_facts, read_slot_limits
from gpubox.doctor.thresholds import Thresholds
from tests.doctor.test_nvml_facts import counter_clock, make_sysfs
from tests.fake_nvml import scenarios
from tests.fake_nvml.scenarios import FakeBox

Nvml = Callable[..., Any]
Checks = dict[tuple[str, int | None], Check]
GPU_IDS = (
    "gpu.persistence_mode",
    "gpu.ecc",
    "gpu.remapped_rows",
    "gpu.clock_events",
    "gpu.power_limit",
    "gpu.temperature",
    "pcie.replays",
    "pcie.link",
    "pcie.slot",
)


def doctor(
    nvml: Nvml, box: FakeBox, loads: int = 10, sys_root: Path | None = None, thresholds: Thresholds | None = None
) -> Checks:
    """The facts at rest, `loads` link samples under load, then the checks, by (id, GPU)."""
    n = nvml(box)
    facts = read_facts(n)
    sampler = LinkSampler(n, clock=counter_clock())
    samples = [s for _ in range(loads) for s in sampler.sample()]
    slots = read_slot_limits(facts, sys_root) if sys_root else None
    checks = gpu_checks(facts, samples, thresholds or Thresholds(), slots)
    assert len({(c.id, c.gpu) for c in checks}) == len(checks)  # one per GPU per check
    return {(c.id, c.gpu): c for c in checks}


def gen5_slots(tmp_path: Path, box: FakeBox, port_speed: str = "32.0 GT/s PCIe", port_width: str = "16") -> Path:
    """A /sys tree with every GPU of `box` (a Gen5 x16 card) under a port of its own."""
    devices, ports = {}, {}
    for gpu in box.gpus:
        bdf = f"0000:{gpu.pci_bus_id.split(':')[1].lower()}:00.0"
        port = f"0000:{int(bdf[5:7], 16) - 1:02x}:01.0"
        devices[bdf] = (port, "32.0 GT/s PCIe", "16")
        ports[port] = (port_speed, port_width)
    return make_sysfs(tmp_path, devices, ports)


def assert_concrete(check: Check, *words: str) -> None:
    assert check.fix, check
    for word in words:
        assert word in check.fix, (word, check.fix)
    assert check.meaning
    assert check.impact > 0


# -- the scenarios --------------------------------------------------------------------------


def test_healthy_box_is_all_ok(nvml: Nvml, tmp_path: Path) -> None:
    box = scenarios.healthy(2)
    checks = doctor(nvml, box, sys_root=gen5_slots(tmp_path, box))
    assert sorted({id for id, _ in checks}) == sorted(GPU_IDS)
    assert {(id, c.status) for (id, _), c in checks.items() if c.status != "ok"} == set()
    c = checks["pcie.link", 1]
    assert (c.value, c.category, c.gpu) == ("Gen5 x16", "pcie", 1)
    assert c.detail == "Gen5 x16 under load, its maximum (Gen1 x16 at rest)"
    assert checks["gpu.temperature", 0].value == 34.0
    assert checks["gpu.power_limit", 1].value == 700.0
    assert checks["pcie.replays", 0].value == 0
    assert checks["pcie.slot", 0].value == {"gpu": "Gen5 x16", "slot": "Gen5 x16"}
    assert "port 0000:17:01.0" in checks["pcie.slot", 0].detail
    assert all(c.fix is None and c.impact == 0 for c in checks.values())


def test_links_seen_only_at_rest_are_not_called_downtrained(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.healthy(1), loads=0)
    link = checks["pcie.link", 0]
    assert link.status == "skip"
    assert "seen only at rest (Gen1 x16 of Gen5 x16)" in link.detail
    assert "idle link slows down to save power" in link.detail
    assert checks["gpu.clock_events", 0].status == "skip"
    assert "seen only at rest (gpu_idle)" in checks["gpu.clock_events", 0].detail
    assert checks["pcie.replays", 0].status == "skip"
    assert checks["pcie.slot", 0].status == "ok"  # from NVML: GPU Gen5, GPU and slot together Gen5


def test_downtrained_link(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.downtrained_link())
    assert checks["pcie.link", 0].status == "ok"
    link = checks["pcie.link", 1]
    assert (link.status, link.value, link.impact) == ("fail", "Gen4 x8", 0.75)
    assert "Gen4 x8 under load, below the Gen5 x16 the GPU and slot allow: 75%" in link.detail
    assert "15.8 GB/s of 63.0 GB/s" in link.detail
    assert_concrete(link, "Reseat GPU 1", "lspci -vv -s 0000:2a:00.0", "BIOS", "Gen5")
    assert link.evidence["at_rest"] == "Gen1 x8"
    replays = checks["pcie.replays", 1]
    assert (replays.status, replays.value, replays.unit) == ("fail", 360, "count")  # 9 reads after the first, 40 each
    assert "360 replays while the benchmarks ran (47 to 407" in replays.detail
    assert_concrete(replays, "Reseat GPU 1", "riser")
    assert checks["pcie.replays", 0].status == "ok"


def test_link_held_by_the_slot(nvml: Nvml, tmp_path: Path) -> None:
    box = scenarios.slot_limited()
    checks = doctor(nvml, box, sys_root=gen5_slots(tmp_path, box, port_speed="16.0 GT/s PCIe"))
    assert checks["pcie.link", 0].status == "ok"  # Gen4 is all the GPU and slot allow together
    slot = checks["pcie.slot", 0]
    assert (slot.status, slot.value, slot.impact) == ("warn", {"gpu": "Gen5 x16", "slot": "Gen4 x16"}, 0.5)
    assert "port 0000:17:01.0" in slot.detail
    assert_concrete(slot, "Move GPU 0 to a Gen5 x16 slot")
    # without sysfs, NVML alone tells the same story
    slot = doctor(nvml, box)["pcie.slot", 0]
    assert (slot.status, slot.value) == ("warn", {"gpu": "Gen5", "slot": "Gen4"})
    assert "(NVML)" in slot.detail


def test_slot_and_gpu_can_do_more_than_nvml_allows(nvml: Nvml, tmp_path: Path) -> None:
    box = scenarios.slot_limited()
    slot = doctor(nvml, box, sys_root=gen5_slots(tmp_path, box))["pcie.slot", 0]
    assert slot.status == "warn"
    assert "yet NVML caps the link at Gen4" in slot.detail
    assert_concrete(slot, "BIOS", "Gen5")


def test_a_narrow_slot(nvml: Nvml, tmp_path: Path) -> None:
    box = scenarios.healthy(1)
    slot = doctor(nvml, box, sys_root=gen5_slots(tmp_path, box, port_width="8"))["pcie.slot", 0]
    assert (slot.status, slot.value["slot"], slot.impact) == ("warn", "Gen5 x8", 0.5)


def test_throttling_under_load(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.throttling())
    hw = checks["gpu.clock_events", 0]
    assert (hw.status, hw.impact) == ("fail", 0.5)
    assert hw.value == {"hw_slowdown": 1.0, "hw_thermal_slowdown": 1.0}
    assert hw.detail == "hw_slowdown in 100%, hw_thermal_slowdown in 100% of 10 samples under load"
    assert_concrete(hw, "nvidia-smi -q -d PERFORMANCE -i 0", "cooling", "power cables")
    brake = checks["gpu.clock_events", 1]
    assert (brake.status, brake.value) == ("fail", {"hw_power_brake_slowdown": 1.0})
    assert_concrete(brake, "power brake", "power supplies")
    # Heavy kernels run at the (default) power limit by design: worth a word, not a warning.
    cap = checks["gpu.clock_events", 2]
    assert (cap.status, cap.value, cap.impact) == ("ok", {"sw_power_cap": 1.0}, 0.0)
    assert "ran at its power limit" in cap.detail and "gpu.power_limit" in cap.detail
    assert {c.status for (id, _), c in checks.items() if id != "gpu.clock_events"} == {"ok"}


def test_ecc_errors(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.ecc_errors())
    ecc = checks["gpu.ecc", 0]
    assert (ecc.status, ecc.value, ecc.unit, ecc.impact) == ("fail", 2, "count", 1.0)
    assert "2 uncorrected and 5 corrected since the driver loaded (2 uncorrected over the GPU's life)" in ecc.detail
    assert_concrete(ecc, "nvidia-smi -q -d ECC,ROW_REMAPPER -i 0", "sudo nvidia-smi -r -i 0")
    remap = checks["gpu.remapped_rows", 0]
    assert (remap.status, remap.impact) == ("fail", 0.8)
    assert remap.value == {"corrected": 0, "uncorrected": 1, "pending": True, "failed": False}
    assert "a row remap waits for a GPU reset" in remap.detail
    assert_concrete(remap, "sudo nvidia-smi -r -i 0")
    # the V100: many corrected errors, and a page retirement instead of row remapping
    ecc = checks["gpu.ecc", 1]
    assert (ecc.status, ecc.value) == ("warn", 1500)
    assert "above 1000" in ecc.detail
    assert_concrete(ecc, "PAGE_RETIREMENT -i 1")
    assert ("gpu.remapped_rows", 1) not in checks
    pages = checks["gpu.retired_pages", 1]
    assert (pages.status, pages.value) == ("fail", True)
    assert_concrete(pages, "sudo nvidia-smi -r -i 1", "PAGE_RETIREMENT")


def test_ecc_threshold_is_a_setting(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.ecc_errors(), thresholds=Thresholds(ecc_corrected_warn=2000))
    assert checks["gpu.ecc", 1].status == "ok"


def test_persistence_off(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.persistence_off())
    for i in range(2):
        c = checks["gpu.persistence_mode", i]
        assert (c.status, c.value, c.detail) == ("warn", False, "off")
        assert_concrete(c, f"sudo nvidia-smi -i {i} -pm 1", "nvidia-persistenced")


def test_low_power_limit(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.low_power_limit())
    c = checks["gpu.power_limit", 0]
    assert (c.status, c.value, c.unit, c.impact) == ("warn", 350.0, "W", 0.25)
    assert c.detail == "350 W enforced, 50% of the 700 W default, max 700 W"
    assert_concrete(c, "sudo nvidia-smi -i 0 -pl 700")
    assert checks["gpu.power_limit", 1].status == "ok"


def test_hot_gpu(nvml: Nvml) -> None:
    checks = doctor(nvml, scenarios.hot_gpu())
    warm, hot = checks["gpu.temperature", 0], checks["gpu.temperature", 1]
    assert (warm.status, warm.value, warm.unit) == ("warn", 85.0, "C")
    assert warm.detail == "85 C, only 4 C below the 89 C where it slows down"
    assert (hot.status, hot.value) == ("fail", 90.0)
    assert "at or above the 89 C" in hot.detail
    assert_concrete(hot, "nvidia-smi -q -d TEMPERATURE,PERFORMANCE -i 1", "airflow")
    cooler = doctor(nvml, scenarios.hot_gpu(), thresholds=Thresholds(temperature_margin_c=3))
    assert cooler["gpu.temperature", 0].status == "ok"


def test_old_driver(nvml: Nvml) -> None:
    box = scenarios.old_driver()  # the build without nvmlDeviceGetCurrentClocksEventReasons
    checks = doctor(nvml, box)
    clocks = checks["gpu.clock_events", 1]  # read through the call's older name
    assert (clocks.status, clocks.value) == ("ok", {"sw_power_cap": 1.0})  # 71% busy: not full load
    assert checks["pcie.link", 0].status == "ok"


def test_functions_an_old_driver_lacks_are_skipped_with_the_reason(nvml: Nvml) -> None:
    box = scenarios.old_driver()
    box.missing = [
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetGpuMaxPcieLinkGeneration",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceGetPowerManagementDefaultLimit",
    ]
    checks = doctor(nvml, box)
    for id in ("gpu.remapped_rows", "pcie.slot", "gpu.temperature", "gpu.power_limit"):
        c = checks[id, 0]
        assert c.status == "skip", c
        assert "the driver is older than the NVML call that reads it (update the driver) (function_missing)" in c.detail
    assert checks["gpu.temperature", 0].detail.startswith("NVML gives no temperature for GPU 0")
    assert checks["gpu.persistence_mode", 0].status == "ok"


def test_a_lost_gpu_skips_everything_saying_so(nvml: Nvml) -> None:
    box = scenarios.healthy(2)
    box.gpus[1].lost_after = 0
    n = nvml(box)
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetUtilizationRates(n.nvmlDeviceGetHandleByIndex(1))
    checks = gpu_checks(read_facts(n), LinkSampler(n).sample(), Thresholds())
    lost = [c for c in checks if c.gpu == 1]
    assert len(lost) == len(GPU_IDS)
    assert {c.status for c in lost} == {"skip"}
    assert all("fallen off the bus" in c.detail for c in lost)
    assert {c.status for c in checks if c.gpu == 0} <= {"ok", "skip"}


def test_no_nvml_no_checks() -> None:
    facts = SystemFacts(None, None, nvml_error="NVML cannot start: the NVIDIA kernel driver is not loaded.")
    assert gpu_checks(facts, (), Thresholds()) == []


# -- edges, on hand-made facts --------------------------------------------------------------

H100 = GpuFacts(
    index=0,
    uuid="GPU-x",
    name="NVIDIA H100 80GB HBM3",
    pci_bus_id="0000:18:00.0",
    persistence_mode=True,
    ecc_enabled=True,
    ecc_pending=True,
    ecc_uncorrected_volatile=0,
    ecc_corrected_volatile=0,
    remapped_rows_corrected=0,
    remapped_rows_uncorrected=0,
    remapped_rows_pending=False,
    remapped_rows_failed=False,
    power_limit_w=700.0,
    power_default_limit_w=700.0,
    temperature_c=40.0,
    temperature_slowdown_c=89.0,
    clock_event_reasons=1,
    pcie_gen=1,
    pcie_width=16,
    pcie_gen_max=5,
    pcie_width_max=16,
    pcie_gen_gpu_max=5,
    pcie_replay_count=0,
)


def one(gpu: GpuFacts, id: str, samples: tuple[LinkSample, ...] = (), **kw: Any) -> Check:
    checks = gpu_checks(SystemFacts("550.54.15", 12040, (gpu,)), samples, Thresholds(), **kw)
    return next(c for c in checks if c.id == id)


def loaded(
    *masks: int, gen: int = 5, width: int = 16, busy: float | None = 100.0, replays: int = 0
) -> tuple[LinkSample, ...]:
    return tuple(LinkSample(float(k), 0, gen, width, m, replays, busy) for k, m in enumerate(masks))


def test_a_failed_remap_needs_service() -> None:
    c = one(dataclasses.replace(H100, remapped_rows_failed=True, remapped_rows_uncorrected=8), "gpu.remapped_rows")
    assert (c.status, c.impact) == ("fail", 1.0)
    assert_concrete(c, "RMA", "nvidia-smi -q -d ROW_REMAPPER -i 0")


def test_ecc_modes() -> None:
    off = one(dataclasses.replace(H100, ecc_enabled=False, ecc_pending=False), "gpu.ecc")
    assert (off.status, off.fix) == ("ok", None)
    assert "nvidia-smi -i 0 -e 1" in off.meaning
    turning_on = one(dataclasses.replace(H100, ecc_enabled=False, ecc_pending=True), "gpu.ecc")
    assert turning_on.status == "warn"
    assert turning_on.fix and "reset it (sudo nvidia-smi -r -i 0)" in turning_on.fix
    unknown = dataclasses.replace(H100, ecc_enabled=None, missing={"ecc_enabled": "not_supported"})
    skip = one(unknown, "gpu.ecc")
    assert skip.status == "skip"
    assert skip.detail == "NVML gives no ECC mode for GPU 0: this GPU or its driver does not report it (not_supported)"


def test_a_hardware_slowdown_now_and_then_warns() -> None:
    c = one(H100, "gpu.clock_events", loaded(*[0] * 23, 0x8, 0x8))
    assert (c.status, c.value) == ("warn", {"hw_slowdown": 0.08})
    assert c.impact == pytest.approx(0.04)
    thermal = one(H100, "gpu.clock_events", loaded(*[0] * 19, 0x40))
    assert (thermal.status, thermal.impact) == ("warn", pytest.approx(0.025))


def test_a_lone_hw_slowdown_bit_is_a_clock_change_not_a_slowdown() -> None:
    # NVML sets the bare hw_slowdown bit for a moment during a P-state or clock change, as when a
    # benchmark wakes the GPU: one sample with it is no finding, however few samples there are.
    for masks in ((0x8, 0, 0, 0, 0), (0, 0, 0x8, 0, 0x8), (0x1, 0x8, 0, 0)):
        c = one(H100, "gpu.clock_events", loaded(*masks))
        assert c.status == "ok", masks
        assert c.value["hw_slowdown"] > 0  # still reported in the figures
    held = one(H100, "gpu.clock_events", loaded(0, 0x8, 0x8, 0, 0))
    assert (held.status, held.evidence["shares"]["hw_slowdown"]) == ("fail", 0.4)


def test_a_hardware_slowdown_at_rest_fails_without_a_benchmark() -> None:
    c = one(dataclasses.replace(H100, clock_event_reasons=0x40 | 0x1), "gpu.clock_events")
    assert c.status == "fail"
    assert "hw_thermal_slowdown in 100% of 1 sample" in c.detail


def test_power_cap_counts_only_at_full_load_and_idle_reasons_are_fine() -> None:
    half_busy = one(H100, "gpu.clock_events", loaded(0x4, 0x4, busy=50.0))
    assert (half_busy.status, half_busy.value) == ("ok", {"sw_power_cap": 1.0})
    benign = one(H100, "gpu.clock_events", loaded(0x1, 0x2, 0x10, 0x100))
    assert benign.status == "ok"
    assert benign.detail.endswith(": none holds speed back")
    unknown_busy = one(H100, "gpu.clock_events", loaded(0x4, 0x4, busy=None))
    assert unknown_busy.status == "ok" and "ran at its power limit" in unknown_busy.detail
    thermal = one(H100, "gpu.clock_events", loaded(0x20, 0))
    assert (thermal.status, thermal.impact) == ("warn", 0.1)
    assert_concrete(thermal, "cooling")


def test_link_at_its_maximum_at_rest_needs_no_benchmark() -> None:
    c = one(dataclasses.replace(H100, pcie_gen=5), "pcie.link")
    assert (c.status, c.value) == ("ok", "Gen5 x16")


def test_a_link_that_comes_up_late_is_judged_by_its_best_sample() -> None:
    samples = (*loaded(0, 0, 0, gen=1), LinkSample(9.0, 0, 5, 16, 0, 0, 100.0))
    assert one(H100, "pcie.link", samples).status == "ok"


def test_a_link_a_little_short_warns() -> None:
    c = one(dataclasses.replace(H100, pcie_width_max=16), "pcie.link", loaded(0, gen=5, width=12))
    assert (c.status, c.impact) == ("warn", 0.25)
    assert c.meaning and "not fully seated" in c.meaning


def test_replays_within_the_threshold_are_ok() -> None:
    samples = (*loaded(0, replays=100), LinkSample(5.0, 0, 5, 16, 0, 110, 100.0))
    c = one(H100, "pcie.replays", samples)
    assert (c.status, c.value) == ("ok", 10)
    c = one(H100, "pcie.replays", (*samples[:1], LinkSample(5.0, 0, 5, 16, 0, 111, 100.0)))
    assert (c.status, c.value) == ("warn", 11)


def test_slot_from_sysfs_when_nvml_has_no_gpu_maximum() -> None:
    gpu = dataclasses.replace(H100, pcie_gen_gpu_max=None, missing={"pcie_gen_gpu_max": "function_missing"})
    slot = SlotLimit("0000:18:00.0", 5, 16, "0000:17:01.0", 4, 16)
    c = one(gpu, "pcie.slot", slots={0: slot})
    assert (c.status, c.value) == ("warn", {"gpu": "Gen5 x16", "slot": "Gen4 x16"})
    unreadable = SlotLimit("0000:18:00.0", missing={"gpu_gen_max": "no_device"})
    c = one(gpu, "pcie.slot", slots={0: unreadable})
    assert c.status == "skip"
    assert c.detail.endswith("(function_missing); sysfs: no_device")


def test_power_limit_without_a_default_is_skipped() -> None:
    gpu = dataclasses.replace(H100, power_default_limit_w=None, missing={"power_default_limit_w": "no_permission"})
    c = one(gpu, "gpu.power_limit")
    assert c.status == "skip"
    assert "run as root" in c.detail
