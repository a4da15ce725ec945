"""read_facts, LinkSampler and the sysfs slot limits, with the real pynvml on the fake NVML
library and a fake /sys tree."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox.doctor.model import LinkSample, SystemFacts
from gpubox.doctor.nvml_facts import (
    FIELDS,
    LinkSampler,
    SlotLimit,
    pcie_generation,
    read_facts,
    read_slot_limit,
    read_slot_limits,
    sysfs_bus_id,
)
from gpubox.telemetry.backend import BackendUnavailable
from tests.fake_nvml import scenarios
from tests.fake_nvml.scenarios import GPU_IDLE, HW_POWER_BRAKE_SLOWDOWN, MIB, SW_POWER_CAP

Nvml = Callable[..., Any]


class Refusing:
    """pynvml, except that the named functions raise the given NVML error (and calls are counted)."""

    def __init__(self, nvml: Any, refuse: dict[str, type[BaseException]]) -> None:
        self._nvml, self._refuse = nvml, refuse
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(attr):
            return attr

        def call(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self._refuse:
                raise self._refuse[name]()
            return attr(*args)

        return call


def counter_clock() -> Callable[[], float]:
    ticks = iter(range(1_000_000))
    return lambda: float(next(ticks))


# -- read_facts -----------------------------------------------------------------------------


def test_healthy_box(nvml: Nvml) -> None:
    box = scenarios.healthy(2)
    facts = read_facts(nvml(box))
    assert (facts.driver_version, facts.cuda_driver_version, facts.nvml_error) == ("550.54.15", 12040, None)
    assert facts.nvidia_devices
    assert [g.index for g in facts.gpus] == [0, 1]
    g = facts.gpus[1]
    assert (g.uuid, g.name, g.pci_bus_id) == (box.gpus[1].uuid, "NVIDIA H100 80GB HBM3", "0000:2a:00.0")
    assert (g.architecture, g.compute_capability, g.memory_total_bytes) == ("hopper", (9, 0), 81559 * MIB)
    assert g.persistence_mode is True
    assert (g.ecc_enabled, g.ecc_pending) == (True, True)
    ecc = (g.ecc_uncorrected_volatile, g.ecc_corrected_volatile, g.ecc_uncorrected_aggregate, g.ecc_corrected_aggregate)
    assert ecc == (0, 0, 0, 0)
    rows = (g.remapped_rows_corrected, g.remapped_rows_uncorrected, g.remapped_rows_pending, g.remapped_rows_failed)
    assert rows == (0, 0, False, False)
    assert (g.power_limit_w, g.power_default_limit_w, g.power_max_limit_w) == (700.0, 700.0, 700.0)
    assert (g.temperature_c, g.temperature_slowdown_c) == (35.0, 89.0)
    # the first read sees the GPU at rest: the link idles at Gen1
    assert (g.clock_event_reasons, g.pcie_gen, g.pcie_width) == (GPU_IDLE, 1, 16)
    assert (g.pcie_gen_max, g.pcie_width_max, g.pcie_gen_gpu_max, g.pcie_replay_count) == (5, 16, 5, 0)
    # Hopper remaps rows; page retirement is for older GPUs
    assert g.retired_pages_pending is None
    assert g.missing == {"retired_pages_pending": "not_supported"}


def test_ecc_errors(nvml: Nvml) -> None:
    h100, v100 = read_facts(nvml(scenarios.ecc_errors())).gpus
    assert (h100.ecc_uncorrected_volatile, h100.ecc_corrected_volatile) == (2, 5)
    assert (h100.ecc_uncorrected_aggregate, h100.ecc_corrected_aggregate) == (2, 1200)
    assert (h100.remapped_rows_uncorrected, h100.remapped_rows_pending, h100.remapped_rows_failed) == (1, True, False)
    assert (v100.architecture, v100.ecc_corrected_volatile, v100.retired_pages_pending) == ("volta", 1500, True)
    assert v100.remapped_rows_pending is None
    assert v100.missing["remapped_rows_pending"] == "not_supported"
    assert v100.pcie_gen_max == 3


def test_slot_limited_and_low_power_limit(nvml: Nvml) -> None:
    (g,) = read_facts(nvml(scenarios.slot_limited())).gpus
    assert (g.pcie_gen_max, g.pcie_gen_gpu_max) == (4, 5)
    g = read_facts(nvml(scenarios.low_power_limit())).gpus[0]
    assert (g.power_limit_w, g.power_default_limit_w) == (350.0, 700.0)


def test_old_driver_falls_back_to_the_older_clock_call(nvml: Nvml) -> None:
    box = scenarios.old_driver()
    facts = read_facts(nvml(box))  # the build without nvmlDeviceGetCurrentClocksEventReasons
    assert (facts.driver_version, facts.cuda_driver_version) == ("515.105.01", 11070)
    assert [g.clock_event_reasons for g in facts.gpus] == [0, SW_POWER_CAP]
    assert all("clock_event_reasons" not in g.missing for g in facts.gpus)


def test_functions_an_old_driver_lacks_are_missing_with_the_reason(nvml: Nvml) -> None:
    box = scenarios.old_driver()
    box.missing = ["nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetRemappedRows"]
    box.gpus[1].missing = ["nvmlDeviceGetCurrentClocksThrottleReasons"]  # neither name of the call
    gpu0, gpu1 = read_facts(nvml(box)).gpus
    for g in (gpu0, gpu1):
        assert g.pcie_gen_gpu_max is None
        assert g.missing["pcie_gen_gpu_max"] == "function_missing"
        assert g.remapped_rows_pending is None
        keys = ("remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending", "remapped_rows_failed")
        assert {g.missing[k] for k in keys} == {"function_missing"}
        assert g.pcie_gen == 4  # the rest is read as usual
    assert gpu1.clock_event_reasons is None
    assert gpu1.missing["clock_event_reasons"] == "function_missing"


def test_not_supported_and_no_permission(nvml: Nvml) -> None:
    box = scenarios.healthy(1)
    box.gpus[0].unsupported = ["nvmlDeviceGetEccMode", "nvmlDeviceGetTemperatureThreshold"]
    n = nvml(box)
    refusing = Refusing(n, {"nvmlDeviceGetPcieReplayCounter": n.NVMLError_NoPermission})
    (g,) = read_facts(refusing).gpus
    assert (g.ecc_enabled, g.ecc_pending, g.temperature_slowdown_c, g.pcie_replay_count) == (None, None, None, None)
    assert g.missing["ecc_enabled"] == g.missing["ecc_pending"] == "not_supported"
    assert g.missing["temperature_slowdown_c"] == "not_supported"
    assert g.missing["pcie_replay_count"] == "no_permission"
    assert g.temperature_c == 34.0


def test_a_gpu_lost_before_the_read(nvml: Nvml) -> None:
    box = scenarios.healthy(2)
    box.gpus[1].lost_after = 0
    n = nvml(box)
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetUtilizationRates(n.nvmlDeviceGetHandleByIndex(1))
    gpu0, gpu1 = read_facts(n).gpus
    assert gpu0.missing == {"retired_pages_pending": "not_supported"}
    assert (gpu1.index, gpu1.uuid, gpu1.pci_bus_id, gpu1.temperature_c) == (1, "unknown-1", None, None)
    assert set(gpu1.missing) == set(FIELDS)
    assert set(gpu1.missing.values()) == {"gpu_lost"}


def test_a_gpu_lost_during_the_read_is_asked_nothing_more(nvml: Nvml) -> None:
    n = nvml(scenarios.healthy(1))
    refusing = Refusing(n, {"nvmlDeviceGetPowerManagementDefaultLimit": n.NVMLError_GpuIsLost})
    (g,) = read_facts(refusing).gpus
    assert g.power_limit_w == 700.0  # read before the GPU fell off the bus
    assert g.power_default_limit_w is None
    assert g.missing["power_default_limit_w"] == g.missing["pcie_replay_count"] == "gpu_lost"
    assert "nvmlDeviceGetPcieReplayCounter" not in refusing.calls
    assert "nvmlDeviceGetTemperature" not in refusing.calls


def test_nvml_started_and_shut_down_here(nvml: Nvml) -> None:
    n = nvml(scenarios.healthy(1), init=False)
    facts = read_facts()
    assert facts.nvml_error is None
    assert len(facts.gpus) == 1
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()  # read_facts shut down what it started


@pytest.mark.parametrize(
    ("init_error", "sentence"),
    [
        ("driver_not_loaded", "NVML cannot start: the NVIDIA kernel driver is not loaded."),
        ("no_permission", "NVML cannot start: no permission to open the NVIDIA devices (/dev/nvidia*)."),
    ],
)
def test_nvml_that_cannot_start_gives_one_sentence(nvml: Nvml, tmp_path: Path, init_error: str, sentence: str) -> None:
    box = scenarios.healthy(1)
    box.init_error = init_error
    nvml(box, init=False)
    (tmp_path / "dev").mkdir()
    assert read_facts(root=tmp_path) == SystemFacts(None, None, nvml_error=sentence, nvidia_devices=False)
    (tmp_path / "dev/nvidia0").touch()
    assert read_facts(root=tmp_path).nvidia_devices is True
    (tmp_path / "dev/nvidia0").unlink()
    (tmp_path / "dev/nvidiactl").touch()  # the control node alone is no GPU
    assert read_facts(root=tmp_path).nvidia_devices is False
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    assert read_facts(root=tmp_path).nvidia_devices is True


def test_a_device_count_that_fails_gives_one_sentence(nvml: Nvml, tmp_path: Path) -> None:
    n = nvml(scenarios.healthy(1))
    facts = read_facts(Refusing(n, {"nvmlDeviceGetCount": n.NVMLError_Unknown}), root=tmp_path)
    assert facts.gpus == ()
    assert facts.nvml_error == "NVML cannot count the GPUs: Unknown Error."
    assert facts.driver_version == "550.54.15"


def test_bus_ids_in_sysfs_form() -> None:
    assert sysfs_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert sysfs_bus_id("0000:AB:00.0") == "0000:ab:00.0"
    assert sysfs_bus_id("00010000:C1:00.0") == "10000:c1:00.0"


# -- LinkSampler ----------------------------------------------------------------------------


def test_sampler_sees_the_link_under_load_after_the_facts_at_rest(nvml: Nvml) -> None:
    n = nvml(scenarios.downtrained_link())
    facts = read_facts(n)
    assert [(g.pcie_gen, g.pcie_width) for g in facts.gpus] == [(1, 16), (1, 8)]
    sampler = LinkSampler(n, clock=counter_clock())
    first, second = sampler.sample(), sampler.sample()
    assert first == (
        LinkSample(
            at=0.0, gpu=0, pcie_gen=5, pcie_width=16, clock_event_reasons=0, pcie_replay_count=0, gpu_busy=100.0
        ),
        LinkSample(
            at=1.0, gpu=1, pcie_gen=4, pcie_width=8, clock_event_reasons=0, pcie_replay_count=47, gpu_busy=100.0
        ),
    )
    assert [(s.at, s.pcie_replay_count) for s in second] == [(2.0, 0), (3.0, 87)]  # 40 more replays per read


def test_sampler_on_chosen_gpus_and_throttle_reasons(nvml: Nvml) -> None:
    n = nvml(scenarios.throttling())
    (first,) = LinkSampler(n, gpus=[1]).sample()
    assert (first.gpu, first.clock_event_reasons) == (1, GPU_IDLE)  # nothing read it before
    with LinkSampler(n, gpus=[1]) as sampler:
        assert sampler.sample()[0].clock_event_reasons == HW_POWER_BRAKE_SLOWDOWN


def test_sampler_on_an_old_driver(nvml: Nvml) -> None:
    n = nvml(scenarios.old_driver())
    for _ in range(3):
        samples = LinkSampler(n).sample()
        assert [s.clock_event_reasons for s in samples] == [0, SW_POWER_CAP]
        assert [s.gpu_busy for s in samples] == [70.0, 71.0]


def test_sampler_goes_on_without_a_lost_gpu(nvml: Nvml) -> None:
    n = nvml(scenarios.lost_gpu())  # GPU 1 falls off the bus on its third utilization read
    sampler = LinkSampler(n)
    for _ in range(2):
        assert all(s.pcie_gen == 5 for s in sampler.sample())
    third = sampler.sample()
    assert third[0].pcie_gen == 5
    assert third[1] == LinkSample(third[1].at, 1, None, None, None, None, None)
    assert sampler.sample()[1].gpu_busy is None


def test_sampler_skips_calls_that_can_never_work(nvml: Nvml) -> None:
    box = scenarios.healthy(1)
    box.gpus[0].unsupported = ["nvmlDeviceGetPcieReplayCounter"]
    refusing = Refusing(nvml(box), {})
    sampler = LinkSampler(refusing)
    for _ in range(5):
        assert sampler.sample()[0].pcie_replay_count is None
    assert refusing.calls["nvmlDeviceGetPcieReplayCounter"] == 1
    assert refusing.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 5


def test_sampler_that_starts_nvml_shuts_it_down(nvml: Nvml) -> None:
    n = nvml(scenarios.healthy(1), init=False)
    with LinkSampler() as sampler:
        assert sampler.sample()[0].pcie_width == 16
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()
    box = scenarios.healthy(1)
    box.init_error = "driver_not_loaded"
    nvml(box, init=False)
    with pytest.raises(BackendUnavailable, match="driver is not loaded"):
        LinkSampler()


# -- slot limits from sysfs ------------------------------------------------------------------


def make_sysfs(root: Path, devices: dict[str, tuple[str | None, str, str]], ports: dict[str, tuple[str, str]]) -> Path:
    """A /sys tree: devices maps a GPU's address to (its port or None, max_link_speed, max_link_width);
    ports maps a port's address to its (max_link_speed, max_link_width). Returns the /sys root."""
    sys_root = root / "sys"
    (sys_root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for port, (speed, width) in ports.items():
        path = sys_root / "devices/pci0000:00" / port
        path.mkdir(parents=True, exist_ok=True)
        (path / "max_link_speed").write_text(speed + "\n")
        (path / "max_link_width").write_text(width + "\n")
    for bdf, (port, speed, width) in devices.items():
        path = sys_root / "devices/pci0000:00" / (port or "") / bdf
        path.mkdir(parents=True, exist_ok=True)
        (path / "max_link_speed").write_text(speed + "\n")
        (path / "max_link_width").write_text(width + "\n")
        os.symlink(os.path.relpath(path, sys_root / "bus/pci/devices"), sys_root / "bus/pci/devices" / bdf)
    return sys_root


@pytest.fixture
def sysfs(tmp_path: Path) -> Iterator[Path]:
    yield make_sysfs(
        tmp_path,
        devices={
            "0000:18:00.0": ("0000:17:01.0", "32.0 GT/s PCIe", "16"),
            "0000:2a:00.0": ("0000:29:01.0", "32.0 GT/s PCIe", "16"),
            "0000:3a:00.0": (None, "16.0 GT/s PCIe", "16"),
            "0000:5d:00.0": ("0000:5c:01.0", "Unknown", "16"),
        },
        ports={
            "0000:17:01.0": ("32.0 GT/s PCIe", "16"),
            "0000:29:01.0": ("16.0 GT/s PCIe", "8"),
            "0000:5c:01.0": ("8.0 GT/s PCIe", "16"),
        },
    )


@pytest.mark.parametrize(
    ("speed", "gen"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("2.5 GT/s", 1),  # kernels before 5.x wrote no "PCIe"
        ("8 GT/s", 3),
        ("Unknown", None),
        ("", None),
        ("20.0 GT/s PCIe", None),
    ],
)
def test_speeds_map_to_generations(speed: str, gen: int | None) -> None:
    assert pcie_generation(speed) == gen


def test_slot_limits(sysfs: Path) -> None:
    assert read_slot_limit("0000:18:00.0", sysfs) == SlotLimit("0000:18:00.0", 5, 16, "0000:17:01.0", 5, 16)
    assert read_slot_limit("0000:2a:00.0", sysfs) == SlotLimit("0000:2a:00.0", 5, 16, "0000:29:01.0", 4, 8)
    root_bus = read_slot_limit("0000:3a:00.0", sysfs)
    assert (root_bus.gpu_gen_max, root_bus.port, root_bus.port_gen_max) == (4, None, None)
    assert root_bus.missing == dict.fromkeys(("port", "port_gen_max", "port_width_max"), "no_port")
    unknown = read_slot_limit("0000:5d:00.0", sysfs)
    assert (unknown.gpu_gen_max, unknown.gpu_width_max, unknown.port_gen_max) == (None, 16, 3)
    assert unknown.missing == {"gpu_gen_max": "unreadable"}
    absent = read_slot_limit("0000:99:00.0", sysfs)
    assert absent.gpu_gen_max is None
    assert set(absent.missing.values()) == {"no_device"}


def test_slot_limits_of_every_gpu(nvml: Nvml, sysfs: Path) -> None:
    facts = read_facts(nvml(scenarios.healthy(2)))
    limits = read_slot_limits(facts, sysfs)
    assert sorted(limits) == [0, 1]
    assert (limits[1].pci_bus_id, limits[1].port_gen_max, limits[1].port_width_max) == ("0000:2a:00.0", 4, 8)
