"""Scenarios for the fake NVML library: a box of GPUs and processes, written as the key=value file
that fake_nvml.c reads at nvmlInit (its header documents every key).

Every figure in the named scenarios is distinct and easy to assert: GPU i of hopper8() has
gpu_util 60+i, temperature 40+i, PCIe TX (1000+100*i) MiB/s, and so on. PCIe rates are whole MiB/s
(hence whole KiB/s) so the GPM, field-counter and throughput paths all give the exact same rate.

The doctor's scenarios (healthy, downtrained_link, ...) script the link and the clock event reasons
as sequences: the first read sees the GPU at rest, every later read sees it under load, as when the
doctor reads the facts first and then samples while a benchmark runs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
GIB = 1024 * MIB

# Clock event reason bits (nvmlClocksEventReason*).
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100

H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY = 81559 * MIB
H100_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass
class FakeProcess:
    pid: int
    used_memory: int = 1 * GIB
    sm_util: int = 0
    mem_util: int = 0
    enc_util: int = 0
    dec_util: int = 0
    type: str = "compute"  # "compute", "graphics", "both", or "mps" (a client of an MPS server)
    sampled: bool = True  # False: no utilization sample (the process ran no kernel lately)
    gpu_instance_id: int | None = None  # the MIG device it runs in
    compute_instance_id: int = 0


@dataclass
class FakeMig:
    gpu_instance_id: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int = 0
    compute_instance_id: int = 0
    bar1_total: int | None = None  # None: the GPU's
    bar1_used: int = 0
    sm_active: float = 0.0  # GPM, through nvmlGpmMigSampleGet
    sm_occupancy: float = 0.0


@dataclass
class FakeGpu:
    name: str = H100_NAME
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    serial: str = "1323021000000"
    pci_bus_id: str = "00000000:18:00.0"
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    architecture: str = "hopper"
    cuda_cc: int = 90  # major * 10 + minor
    gpm: bool = True
    pcie_counters: bool = True  # NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES
    pcie_throughput: bool = True  # nvmlDeviceGetPcieThroughput
    gpu_util: int = 0
    mem_util: int = 0
    sm_active: float = 0.0
    sm_occupancy: float = 0.0
    pcie_tx_bps: int = 0
    pcie_rx_bps: int = 0
    # pcie_gen, pcie_width, clock_event_reasons and pcie_replays also take a list: successive
    # NVML calls return its values in turn, the last one repeating
    pcie_gen: int | list[int] = 5
    pcie_gen_max: int = 5  # what the GPU and the slot allow together
    pcie_width: int | list[int] = 16
    pcie_width_max: int = 16
    pcie_gen_gpu_max: int | None = None  # what the GPU alone allows; None: pcie_gen_max
    pcie_replays: int | list[int] = 0
    pcie_replays_per_call: int = 0  # added to the replay counter for every earlier read
    energy_mj: int = 0  # the energy counter (mJ since the driver loaded) at the first read
    energy_mj_per_call: int = 0  # added to it for every earlier read
    memory_total: int = H100_MEMORY
    memory_used: int = 0
    memory_reserved: int = 0
    bar1_total: int = 128 * GIB
    bar1_used: int = 0
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    enforced_power_limit_mw: int | None = None  # None: the management limit
    temperature: int = 30
    sm_clock: int = 1980
    mem_clock: int = 2619
    graphics_clock: int | None = None  # None: sm_clock
    video_clock: int = 1545
    max_sm_clock: int = 1980
    max_mem_clock: int = 2619
    max_graphics_clock: int | None = None  # None: max_sm_clock
    max_video_clock: int = 1545
    clock_event_reasons: int | list[int] = 0
    fan_speed: int | None = None  # None: no fan (NOT_SUPPORTED)
    performance_state: int = 0
    persistence_mode: int = 1
    display_mode: int = 0
    display_active: int = 0
    compute_mode: int = 0
    ecc_errors: int = 0  # every ECC count below that is None
    ecc_mode: bool = True
    ecc_mode_pending: bool | None = None  # None: ecc_mode
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_corrected: int = 0  # Ampere and newer
    remapped_rows_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pages_pending: bool = False  # before Ampere
    power_default_limit_mw: int | None = None  # None: power_limit_mw
    power_min_limit_mw: int | None = None  # None: a quarter of the default limit
    power_max_limit_mw: int | None = None  # None: the default limit
    temperature_shutdown: int = 92
    temperature_slowdown: int = 89
    temperature_mem_max: int = 95
    temperature_gpu_max: int = 87
    encoder_util: int = 0
    decoder_util: int = 0
    nvlink_links: int = 0
    mig_capable: bool = False
    mig_mode: bool = False
    max_mig_devices: int = 7
    lost_after: int | None = None  # lost after this many nvmlDeviceGetUtilizationRates calls
    unsupported: list[str] = field(default_factory=list)  # NVML functions NOT_SUPPORTED here
    missing: list[str] = field(default_factory=list)  # NVML functions answering FUNCTION_NOT_FOUND
    migs: list[FakeMig] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeBox:
    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    cuda_driver_version: int = 12040
    init_error: str | None = None  # driver_not_loaded, no_permission, lib_rm_version_mismatch, unknown
    process_utilization: str = "ok"  # "ok", "no_permission" or "not_supported"
    struct_version_mismatch: bool = False
    unsupported: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # as a driver older than these functions
    pcie_throughput_delay_us: int = 0
    library_variant: str = "full"  # which build of the library the scenario is meant for

    @property
    def processes(self) -> list[FakeProcess]:
        return [p for g in self.gpus for p in g.processes]

    def render(self) -> str:
        lines = [
            "# gpubox fake NVML scenario",
            "[system]",
            f"driver_version={self.driver_version}",
            f"nvml_version={self.nvml_version}",
            f"cuda_driver_version={self.cuda_driver_version}",
            f"device_count={len(self.gpus)}",
            f"process_utilization={self.process_utilization}",
            f"struct_version_mismatch={int(self.struct_version_mismatch)}",
            f"pcie_throughput_delay_us={self.pcie_throughput_delay_us}",
        ]
        if self.init_error:
            lines.append(f"init_error={self.init_error}")
        if self.unsupported:
            lines.append(f"unsupported={','.join(self.unsupported)}")
        if self.missing:
            lines.append(f"missing={','.join(self.missing)}")
        for gpu in self.gpus:
            lines.append("")
            lines.append("[gpu]")
            lines.extend(_fields(gpu, skip={"migs", "processes"}))
            for mig in gpu.migs:
                lines.append("[mig]")
                lines.extend(_fields(mig))
            for proc in gpu.processes:
                lines.append("[process]")
                lines.extend(_fields(proc))
        return "\n".join(lines) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the scenario file; point FAKE_NVML_SCENARIO at the returned path."""
        out = Path(path)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(self.render())
        os.replace(tmp, out)  # a library reading it at nvmlInit never sees half a file
        return out


_HEX_FIELDS = frozenset({"pci_device_id", "pci_subsystem_id", "clock_event_reasons"})


def _fields(obj: object, skip: frozenset[str] | set[str] = frozenset()) -> list[str]:
    out = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None:
            if f.name == "fan_speed":
                out.append("fan_speed=-1")
            elif f.name == "lost_after":
                out.append("lost_after=-1")
            continue  # the library's default applies
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, list):
            if not value:
                continue
            value = ",".join(_number(f.name, v) if isinstance(v, int) else v for v in value)
        elif f.name in _HEX_FIELDS:
            value = f"{value:#x}"
        text = str(value)
        if "\n" in text:
            raise ValueError(f"{f.name}={text!r} cannot be written to a scenario file")
        out.append(f"{f.name}={text}")
    return out


def _number(name: str, value: int) -> str:
    return f"{value:#x}" if name in _HEX_FIELDS else str(value)


# -- named scenarios ------------------------------------------------------------------------

_EVENT_REASONS = (
    0,
    GPU_IDLE,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    HW_POWER_BRAKE_SLOWDOWN,
    SW_POWER_CAP | SW_THERMAL_SLOWDOWN,
    DISPLAY_CLOCK_SETTING,
)


def h100(i: int) -> FakeGpu:
    """GPU i of a Hopper box: every figure depends on i, so none two are alike."""
    return FakeGpu(
        name=H100_NAME,
        uuid=f"GPU-{0xA1000000 + i:08x}-1111-4222-8333-{0x100000000000 + i:012x}",
        serial=f"13230210{i:05d}",
        pci_bus_id=f"00000000:{H100_BUS_IDS[i % len(H100_BUS_IDS)]}:00.0",
        gpu_util=60 + i,
        mem_util=30 + i,
        sm_active=45.25 + i,
        sm_occupancy=20.5 + i,
        pcie_tx_bps=(1000 + 100 * i) * MIB,
        pcie_rx_bps=(2000 + 100 * i) * MIB,
        pcie_gen=4 if i == 7 else 5,  # GPU 7 trained down to Gen4 x8
        pcie_width=8 if i == 7 else 16,
        power_mw=300_000 + 1_000 * i,
        energy_mj=5_000_000_000 + 1_000_000 * i,
        power_limit_mw=700_000,
        enforced_power_limit_mw=690_000 - 1_000 * i,
        temperature=40 + i,
        sm_clock=1755 + 5 * i,
        mem_clock=2619,
        max_sm_clock=1980,
        max_mem_clock=2619,
        clock_event_reasons=_EVENT_REASONS[i % len(_EVENT_REASONS)],
        bar1_used=(16 + i) * MIB,
        nvlink_links=18,
        mig_capable=True,
    )


# Linux never gives a pid at or above 2**22 (PID_MAX_LIMIT): a fake process's pid is never a real
# process on the host running the tests, whatever it runs meanwhile.
NO_HOST_PID = 1 << 22


def _spread(gpus: list[FakeGpu], processes: int, pid_base: int = NO_HOST_PID + 4000) -> None:
    """Deal `processes` processes round-robin over the GPUs, each with its own pid, memory and
    sm util, and set each GPU's memory_used to its processes' sum plus 512 MiB of context."""
    for k in range(processes):
        gpu = gpus[k % len(gpus)]
        gpu.processes.append(
            FakeProcess(
                pid=pid_base + 7 * k,
                used_memory=(512 + 4 * k) * MIB,
                sm_util=(k * 37 + 5) % 101 if processes > 100 else 5 + 2 * k % 96,
                mem_util=(k * 13 + 3) % 101,
            )
        )
    for gpu in gpus:
        gpu.memory_used = 512 * MIB + sum(p.used_memory for p in gpu.processes)
        if gpu.memory_used > gpu.memory_total:
            raise ValueError("too many processes for the GPU memory; pass fewer")


def hopper8(processes: int = 40) -> FakeBox:
    """8 × H100 80GB HBM3 with GPM, PCIe counters and throughput, `processes` processes."""
    gpus = [h100(i) for i in range(8)]
    _spread(gpus, processes)
    return FakeBox(gpus=gpus)


def hopper(gpus: int = 2, processes: int = 6) -> FakeBox:
    """A smaller Hopper box, same figures as the first `gpus` GPUs of hopper8()."""
    devs = [h100(i) for i in range(gpus)]
    _spread(devs, processes)
    return FakeBox(gpus=devs)


def consumer(processes: int = 2) -> FakeBox:
    """One GeForce RTX 4090: no GPM, no PCIe counters, no nvmlDeviceGetPcieThroughput, a fan,
    no MIG; the first process is the X server (graphics)."""
    gpu = FakeGpu(
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-4090aaaa-bbbb-4ccc-8ddd-eeeeffff0001",
        serial="0",
        pci_bus_id="00000000:01:00.0",
        pci_device_id=0x268410DE,
        pci_subsystem_id=0x16F310DE,
        architecture="ada",
        cuda_cc=89,
        gpm=False,
        pcie_counters=False,
        pcie_throughput=False,
        gpu_util=87,
        mem_util=41,
        pcie_tx_bps=0,
        pcie_rx_bps=0,
        pcie_gen=4,
        pcie_gen_max=4,
        memory_total=24564 * MIB,
        bar1_total=256 * MIB,
        bar1_used=12 * MIB,
        power_mw=312_000,
        power_limit_mw=450_000,
        temperature=66,
        sm_clock=2520,
        mem_clock=10501,
        max_sm_clock=3105,
        max_mem_clock=10501,
        video_clock=1965,
        max_video_clock=2415,
        clock_event_reasons=SW_POWER_CAP,
        fan_speed=45,
        performance_state=2,
        persistence_mode=0,
        display_mode=1,
        display_active=1,
    )
    for k in range(processes):
        if k == 0:
            gpu.processes.append(FakeProcess(pid=1327, used_memory=312 * MIB, sm_util=3, mem_util=1, type="graphics"))
        else:
            gpu.processes.append(
                FakeProcess(pid=5200 + k, used_memory=(6000 + 1000 * k) * MIB, sm_util=80 + k, mem_util=35 + k)
            )
    gpu.memory_used = 256 * MIB + sum(p.used_memory for p in gpu.processes)
    return FakeBox(gpus=[gpu], driver_version="550.107.02", nvml_version="12.550.107.02", cuda_driver_version=12040)


def no_permission(processes: int = 6) -> FakeBox:
    """A 2-GPU Hopper box where nvmlDeviceGetProcessUtilization answers NO_PERMISSION."""
    box = hopper(2, processes)
    box.process_utilization = "no_permission"
    return box


def lost_gpu(processes: int = 4) -> FakeBox:
    """2 GPUs; GPU 1 falls off the bus on its third nvmlDeviceGetUtilizationRates call."""
    box = hopper(2, processes)
    box.gpus[1].lost_after = 2
    return box


def old_driver(processes: int = 4) -> FakeBox:
    """Two A100s on a 515 driver: for the "old_driver" build, which lacks the GPM functions,
    nvmlDeviceGetCurrentClocksEventReasons and nvmlDeviceGetFieldValues."""
    gpus = []
    for i in range(2):
        gpus.append(
            FakeGpu(
                name="NVIDIA A100-SXM4-80GB",
                uuid=f"GPU-a100{i:04x}-5555-4666-8777-{0x888800000000 + i:012x}",
                serial=f"14210000{i:05d}",
                pci_bus_id=f"00000000:{0x07 + 0x40 * i:02X}:00.0",
                pci_device_id=0x20B210DE,
                pci_subsystem_id=0x147F10DE,
                architecture="ampere",
                cuda_cc=80,
                gpm=False,
                pcie_counters=False,
                gpu_util=70 + i,
                mem_util=50 + i,
                pcie_tx_bps=(500 + 10 * i) * MIB,
                pcie_rx_bps=(700 + 10 * i) * MIB,
                pcie_gen=4,
                pcie_gen_max=4,
                memory_total=81920 * MIB,
                power_mw=250_000 + 1_000 * i,
                power_limit_mw=400_000,
                temperature=50 + i,
                sm_clock=1410,
                mem_clock=1593,
                max_sm_clock=1410,
                max_mem_clock=1593,
                video_clock=1275,
                max_video_clock=1275,
                clock_event_reasons=SW_POWER_CAP if i else 0,
                nvlink_links=12,
                mig_capable=True,
            )
        )
    _spread(gpus, processes, pid_base=NO_HOST_PID + 6000)
    return FakeBox(
        gpus=gpus,
        driver_version="515.105.01",
        nvml_version="11.515.105.01",
        cuda_driver_version=11070,
        library_variant="old_driver",
    )


def version_mismatch(processes: int = 4) -> FakeBox:
    """A Hopper box whose driver knows none of the versioned structs pynvml sends:
    nvmlDeviceGetMemoryInfo_v2, nvmlGpmQueryDeviceSupport and nvmlGpmMetricsGet fail with
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH."""
    box = hopper(2, processes)
    box.struct_version_mismatch = True
    return box


def mig(processes_per_instance: int = 2) -> FakeBox:
    """One H100 in MIG mode with two MIG devices (3g.40gb, gpu instance 1; 2g.20gb, gpu instance 5),
    each with its own processes."""
    gpu = h100(0)
    gpu.mig_mode = True
    gpu.gpu_util = 0  # not readable in MIG mode anyway
    gpu.migs = [
        FakeMig(
            gpu_instance_id=1,
            uuid="MIG-11111111-2222-5333-8444-555555555501",
            name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            memory_total=40192 * MIB,
            sm_active=61.5,
            sm_occupancy=33.25,
        ),
        FakeMig(
            gpu_instance_id=5,
            uuid="MIG-11111111-2222-5333-8444-555555555505",
            name="NVIDIA H100 80GB HBM3 MIG 2g.20gb",
            memory_total=19968 * MIB,
            sm_active=12.75,
            sm_occupancy=4.5,
        ),
    ]
    pid = 7100
    for m, instance in enumerate(gpu.migs):
        for k in range(processes_per_instance):
            gpu.processes.append(
                FakeProcess(
                    pid=pid,
                    used_memory=(2048 + 512 * k + 4096 * m) * MIB,
                    sm_util=10 + 10 * m + k,
                    gpu_instance_id=instance.gpu_instance_id,
                )
            )
            pid += 1
        instance.memory_used = 128 * MIB + sum(
            p.used_memory for p in gpu.processes if p.gpu_instance_id == instance.gpu_instance_id
        )
    gpu.memory_used = sum(m.memory_used for m in gpu.migs) + 512 * MIB
    return FakeBox(gpus=[gpu])


# -- the doctor's scenarios: a healthy box, and the same box with one thing wrong -------------


def rested_h100(i: int) -> FakeGpu:
    """GPU i of a healthy Hopper box as the doctor reads it. At the first read it rests: the link
    idles at Gen1 x16 to save power and the clocks say gpu_idle. From the second read on it is
    loaded: Gen5 x16, no clock event. ECC on without errors, default power limit, cool."""
    return dataclasses.replace(
        h100(i),
        pcie_gen=[1, 5],
        pcie_width=16,
        clock_event_reasons=[GPU_IDLE, 0],
        enforced_power_limit_mw=None,
        temperature=34 + i,
        gpu_util=100,
    )


def healthy(gpus: int = 2) -> FakeBox:
    """Nothing for the doctor to find."""
    devs = [rested_h100(i) for i in range(gpus)]
    _spread(devs, 2 * gpus)
    return FakeBox(gpus=devs)


def downtrained_link() -> FakeBox:
    """GPU 1 of two Gen5 x16 H100s idles at Gen1 and stays at Gen4 x8 under load (a link that trained
    down: a badly seated card or riser), and its PCIe replay counter grows 40 on every read."""
    box = healthy(2)
    gpu = box.gpus[1]
    gpu.pcie_gen, gpu.pcie_width = [1, 4], 8
    gpu.pcie_replays, gpu.pcie_replays_per_call = 7, 40
    return box


def slot_limited() -> FakeBox:
    """A Gen5 H100 in a Gen4 x16 slot: NVML's maximum with the system is Gen4, the GPU's own Gen5;
    the link idles at Gen1 and reaches Gen4 x16 under load."""
    box = healthy(1)
    gpu = box.gpus[0]
    gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_gen_gpu_max = [1, 4], 4, 5
    return box


def throttling() -> FakeBox:
    """Three H100s whose clocks are held back under load: GPU 0 by HW slowdown and HW thermal
    slowdown, GPU 1 by the power brake, GPU 2 by the software power cap (at 100% busy)."""
    box = healthy(3)
    loaded = (HW_SLOWDOWN | HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE_SLOWDOWN, SW_POWER_CAP)
    for gpu, reasons in zip(box.gpus, loaded, strict=True):
        gpu.clock_event_reasons = [GPU_IDLE, reasons]
    return box


def v100(i: int) -> FakeGpu:
    """A Volta GPU (before Ampere): retired pages instead of remapped rows, Gen3, no GPM."""
    return FakeGpu(
        name="Tesla V100-SXM2-32GB",
        uuid=f"GPU-0100{i:04x}-aaaa-4bbb-8ccc-{0xDDDD00000000 + i:012x}",
        serial=f"03231000{i:05d}",
        pci_bus_id=f"00000000:{0x86 + i:02X}:00.0",
        pci_device_id=0x1DB510DE,
        pci_subsystem_id=0x124A10DE,
        architecture="volta",
        cuda_cc=70,
        gpm=False,
        pcie_counters=False,
        pcie_gen=[1, 3],
        pcie_gen_max=3,
        memory_total=32768 * MIB,
        power_mw=45_000,
        power_limit_mw=300_000,
        temperature=41 + i,
        temperature_slowdown=87,
        sm_clock=1530,
        max_sm_clock=1530,
        mem_clock=877,
        max_mem_clock=877,
        video_clock=1372,
        max_video_clock=1372,
        clock_event_reasons=[GPU_IDLE, 0],
        gpu_util=100,
        nvlink_links=6,
    )


def ecc_errors() -> FakeBox:
    """GPU 0, an H100, hit 2 uncorrected ECC errors since the driver loaded and a row remap waits
    for a GPU reset; GPU 1, a V100, has 1500 corrected errors since the driver loaded and a page
    retirement waiting for a reboot."""
    gpus = [rested_h100(0), v100(1)]
    h, v = gpus
    h.ecc_uncorrected_volatile, h.ecc_corrected_volatile = 2, 5
    h.ecc_uncorrected_aggregate, h.ecc_corrected_aggregate = 2, 1200
    h.remapped_rows_uncorrected, h.remap_pending = 1, True
    v.ecc_corrected_volatile, v.ecc_uncorrected_volatile = 1500, 0
    v.ecc_corrected_aggregate, v.ecc_uncorrected_aggregate = 1500, 0
    v.retired_pages_pending = True
    _spread(gpus, 2)
    return FakeBox(gpus=gpus)


def persistence_off() -> FakeBox:
    """The healthy box with persistence mode off on every GPU."""
    box = healthy(2)
    for gpu in box.gpus:
        gpu.persistence_mode = 0
    return box


def low_power_limit() -> FakeBox:
    """GPU 0's power limit set to 350 W of its default 700 W (max 700 W)."""
    box = healthy(2)
    box.gpus[0].power_limit_mw, box.gpus[0].power_default_limit_mw = 350_000, 700_000
    return box


def hot_gpu() -> FakeBox:
    """GPU 0 at 85 C and GPU 1 at 90 C, both with the slowdown threshold at 89 C."""
    box = healthy(2)
    box.gpus[0].temperature, box.gpus[1].temperature = 85, 90
    return box


def with_pids(box: FakeBox, pids: list[int]) -> FakeBox:
    """A copy of `box` whose processes (in GPU order) take the given pids, e.g. real sleeping
    processes for benchmarks; there must be at least as many pids as processes."""
    out = dataclasses.replace(box, gpus=[], unsupported=list(box.unsupported), missing=list(box.missing))
    out.gpus = [
        dataclasses.replace(
            g, processes=[], migs=list(g.migs), unsupported=list(g.unsupported), missing=list(g.missing)
        )
        for g in box.gpus
    ]
    pid_iter = iter(pids)
    for src, dst in zip(box.gpus, out.gpus, strict=True):
        for p in src.processes:
            try:
                dst.processes.append(dataclasses.replace(p, pid=next(pid_iter)))
            except StopIteration:
                raise ValueError(f"{len(box.processes)} processes but only {len(pids)} pids") from None
    return out


SCENARIOS = {
    "hopper8": hopper8,
    "consumer": consumer,
    "no_permission": no_permission,
    "lost_gpu": lost_gpu,
    "old_driver": old_driver,
    "version_mismatch": version_mismatch,
    "mig": mig,
    "healthy": healthy,
    "downtrained_link": downtrained_link,
    "slot_limited": slot_limited,
    "throttling": throttling,
    "ecc_errors": ecc_errors,
    "persistence_off": persistence_off,
    "low_power_limit": low_power_limit,
    "hot_gpu": hot_gpu,
}
