"""The facts the GPU checks are made from: NVML read once per GPU (`read_facts`), cheap looks at
each link while a benchmark loads it (`LinkSampler`), and what the slot allows, from sysfs
(`read_slot_limit`).

A figure NVML does not give is None, and `missing[field]` names the reason (`not_supported`,
`no_permission`, `function_missing`, `gpu_lost`, ...). Nothing here raises on an NVML error.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from gpubox.doctor.model import GpuFacts, LinkSample, SystemFacts
from gpubox.telemetry.devices import nvidia_devices_present
from gpubox.telemetry.model import Reason
from gpubox.telemetry.nvml_device import Caller, Device
from gpubox.telemetry.nvml_errors import reason_for

# nvmlDeviceGetArchitecture codes (NVML_DEVICE_ARCH_*)
ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}
TEMPERATURE_THRESHOLD_SLOWDOWN = 1  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
ECC_VOLATILE, ECC_AGGREGATE = 0, 1  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC

# Every GpuFacts field read from NVML: a GPU that cannot be opened has them all missing.
FIELDS = tuple(name for name in GpuFacts.__dataclass_fields__ if name not in {"index", "missing"})


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" (or legacy "0000:18:00.0") as sysfs names it: "0000:18:00.0"."""
    domain, _, rest = nvml_bus_id.strip().partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


# -- reading every GPU once -------------------------------------------------------------------


def read_facts(nvml: Any | None = None, root: str | os.PathLike[str] = "/") -> SystemFacts:
    """The box as NVML describes it. `nvml`: an initialised pynvml module (tests pass the one on the
    fake library); None: import and initialise pynvml here, and shut it down after. A box where
    NVML cannot start gives `nvml_error` (one sentence) and `nvidia_devices` (read under `root`)."""
    owned = nvml is None
    if nvml is None:
        from gpubox.telemetry.backend import BackendUnavailable
        from gpubox.telemetry.nvml_load import load_nvml

        try:
            nvml = load_nvml()
        except BackendUnavailable as exc:
            return SystemFacts(
                None, None, nvml_error=f"NVML cannot start: {exc}.", nvidia_devices=nvidia_devices_present(root)
            )
    call = Caller(nvml)
    try:
        driver = call.quiet(nvml.nvmlSystemGetDriverVersion)
        cuda = call.quiet(nvml.nvmlSystemGetCudaDriverVersion)
        versions = (None if driver is None else _text(driver), None if cuda is None else int(cuda))
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except call.errors as exc:
            return SystemFacts(
                *versions, nvml_error=f"NVML cannot count the GPUs: {exc}.", nvidia_devices=nvidia_devices_present(root)
            )
        gpus = tuple(_read_gpu(call, index) for index in range(count))
        return SystemFacts(*versions, gpus=gpus, nvidia_devices=count > 0 or nvidia_devices_present(root))
    finally:
        if owned:
            call.quiet(nvml.nvmlShutdown)


def _unopened(index: int, reason: Reason) -> GpuFacts:
    """A GPU NVML lists but cannot open: every figure missing, for the same reason."""
    return GpuFacts(index, f"unknown-{index}", "unknown", None, missing=dict.fromkeys(FIELDS, reason.value))


class _Reader:
    """Reads one GPU's figures; a failed call leaves the figure None with its reason in `missing`,
    and once the GPU is lost the remaining figures are not asked for."""

    def __init__(self, call: Caller, dev: Device) -> None:
        self.call, self.dev = call, dev
        self.missing: dict[str, str] = {}

    def __call__(self, key: str, fn: Callable[[], Any]) -> Any:
        if self.dev.broken is not None:
            self.missing[key] = self.dev.broken.value
            return None
        return self.call(self.dev, key, fn, self.missing)

    def many(self, keys: tuple[str, ...], fn: Callable[[], Any]) -> tuple[Any, ...]:
        """One call that gives several figures; on failure each of them is missing."""
        value = self(keys[0], fn)
        if value is None:
            self.missing.update(dict.fromkeys(keys, self.missing.get(keys[0], Reason.ERROR.value)))
            return (None,) * len(keys)
        return tuple(value)


def _read_gpu(call: Caller, index: int) -> GpuFacts:
    n = call.nvml
    try:
        handle = n.nvmlDeviceGetHandleByIndex(index)
    except call.errors as exc:
        return _unopened(index, reason_for(exc))
    dev = Device(handle, index, f"unknown-{index}", "unknown", None)
    get = _Reader(call, dev)
    uuid, name = (
        get("uuid", lambda: _text(n.nvmlDeviceGetUUID(handle))),
        get("name", lambda: _text(n.nvmlDeviceGetName(handle))),
    )
    bus_id = get("pci_bus_id", lambda: sysfs_bus_id(_text(n.nvmlDeviceGetPciInfo(handle).busId)))
    arch = get("architecture", lambda: int(n.nvmlDeviceGetArchitecture(handle)))
    if arch is not None and arch not in ARCHITECTURES:
        get.missing["architecture"] = Reason.NOT_SUPPORTED.value  # NVML_DEVICE_ARCH_UNKNOWN, or newer than us
    cc = get("compute_capability", lambda: tuple(int(x) for x in n.nvmlDeviceGetCudaComputeCapability(handle)))
    ecc = get.many(("ecc_enabled", "ecc_pending"), lambda: [bool(x) for x in n.nvmlDeviceGetEccMode(handle)])
    rows = get.many(
        ("remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending", "remapped_rows_failed"),
        lambda: n.nvmlDeviceGetRemappedRows(handle),
    )
    return GpuFacts(
        index=index,
        uuid=uuid or f"unknown-{index}",
        name=name or "unknown",
        pci_bus_id=bus_id,
        architecture=ARCHITECTURES.get(arch) if arch is not None else None,
        compute_capability=(cc[0], cc[1]) if cc is not None else None,
        memory_total_bytes=get("memory_total_bytes", lambda: int(n.nvmlDeviceGetMemoryInfo(handle).total)),
        persistence_mode=get("persistence_mode", lambda: n.nvmlDeviceGetPersistenceMode(handle) == 1),
        ecc_enabled=ecc[0],
        ecc_pending=ecc[1],
        ecc_uncorrected_volatile=get("ecc_uncorrected_volatile", _ecc(n, handle, ECC_UNCORRECTED, ECC_VOLATILE)),
        ecc_corrected_volatile=get("ecc_corrected_volatile", _ecc(n, handle, ECC_CORRECTED, ECC_VOLATILE)),
        ecc_uncorrected_aggregate=get("ecc_uncorrected_aggregate", _ecc(n, handle, ECC_UNCORRECTED, ECC_AGGREGATE)),
        ecc_corrected_aggregate=get("ecc_corrected_aggregate", _ecc(n, handle, ECC_CORRECTED, ECC_AGGREGATE)),
        remapped_rows_corrected=None if rows[0] is None else int(rows[0]),
        remapped_rows_uncorrected=None if rows[1] is None else int(rows[1]),
        remapped_rows_pending=None if rows[2] is None else bool(rows[2]),
        remapped_rows_failed=None if rows[3] is None else bool(rows[3]),
        retired_pages_pending=get(
            "retired_pages_pending", lambda: bool(n.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        ),
        power_limit_w=get("power_limit_w", lambda: n.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0),
        power_default_limit_w=get(
            "power_default_limit_w", lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0
        ),
        power_max_limit_w=get(
            "power_max_limit_w", lambda: n.nvmlDeviceGetPowerManagementLimitConstraints(handle)[1] / 1000.0
        ),
        temperature_c=get("temperature_c", lambda: float(n.nvmlDeviceGetTemperature(handle, 0))),
        temperature_slowdown_c=get(
            "temperature_slowdown_c",
            lambda: float(n.nvmlDeviceGetTemperatureThreshold(handle, TEMPERATURE_THRESHOLD_SLOWDOWN)),
        ),
        clock_event_reasons=_clock_event_reasons(get),
        pcie_gen=get("pcie_gen", lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(handle))),
        pcie_width=get("pcie_width", lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(handle))),
        pcie_gen_max=get("pcie_gen_max", lambda: int(n.nvmlDeviceGetMaxPcieLinkGeneration(handle))),
        pcie_width_max=get("pcie_width_max", lambda: int(n.nvmlDeviceGetMaxPcieLinkWidth(handle))),
        pcie_gen_gpu_max=get("pcie_gen_gpu_max", lambda: int(n.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle))),
        pcie_replay_count=get("pcie_replay_count", lambda: int(n.nvmlDeviceGetPcieReplayCounter(handle))),
        missing=get.missing,
    )


def _ecc(n: ModuleType, handle: Any, error_type: int, counter: int) -> Callable[[], int]:
    return lambda: int(n.nvmlDeviceGetTotalEccErrors(handle, error_type, counter))


def _clock_event_reasons(get: _Reader) -> int | None:
    """The clock event reason mask; drivers before 535 only have the call's older name."""
    n, handle = get.call.nvml, get.dev.handle
    mask: int | None = get("clock_event_reasons", lambda: int(n.nvmlDeviceGetCurrentClocksEventReasons(handle)))
    if mask is None and get.missing.get("clock_event_reasons") == Reason.FUNCTION_MISSING.value:
        mask = get("clock_throttle_reasons", lambda: int(n.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
        why = get.missing.pop("clock_throttle_reasons", None)
        if mask is not None:
            del get.missing["clock_event_reasons"]
        elif why is not None:
            get.missing["clock_event_reasons"] = why
    return mask


# -- looking at the links under load ----------------------------------------------------------


class LinkSampler:
    """One `LinkSample` per GPU per `sample()`: the link's generation and width now, the clock
    event reasons, the PCIe replay counter and gpu_busy. Five non-blocking NVML calls per GPU, so
    a background thread can sample every ~100 ms while a transfer benchmark runs. A call the GPU
    or driver will never answer is not made again. `nvml`: an initialised pynvml module; None:
    initialise it here (BackendUnavailable when NVML cannot start) and shut it down in close()."""

    def __init__(
        self, nvml: Any | None = None, gpus: Iterable[int] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._owned = nvml is None
        if nvml is None:
            from gpubox.telemetry.nvml_load import load_nvml

            nvml = load_nvml()
        self._call = Caller(nvml)
        self._clock = clock
        self._devices: list[_Reader] = []
        indices = range(int(nvml.nvmlDeviceGetCount())) if gpus is None else gpus
        for index in indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                dev = Device(handle, index, "", "", None)
            except self._call.errors as exc:
                dev = Device(None, index, "", "", None, broken=reason_for(exc))
            self._devices.append(_Reader(self._call, dev))

    def sample(self) -> tuple[LinkSample, ...]:
        self._call.seen = []  # unexpected errors show as None figures; keep no history of them
        return tuple(self._sample(get) for get in self._devices)

    def _sample(self, get: _Reader) -> LinkSample:
        n, h = self._call.nvml, get.dev.handle
        get.missing = {}  # a sample carries None, not why: read_facts says why
        at = self._clock()
        util = get("gpu_busy", lambda: n.nvmlDeviceGetUtilizationRates(h))
        return LinkSample(
            at=at,
            gpu=get.dev.index,
            pcie_gen=get("pcie_gen", lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(h))),
            pcie_width=get("pcie_width", lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(h))),
            clock_event_reasons=_clock_event_reasons(get),
            pcie_replay_count=get("pcie_replay_count", lambda: int(n.nvmlDeviceGetPcieReplayCounter(h))),
            gpu_busy=None if util is None else float(util.gpu),
        )

    def close(self) -> None:
        if self._owned:
            self._call.quiet(self._call.nvml.nvmlShutdown)
            self._owned = False

    def __enter__(self) -> LinkSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- what the slot allows, from sysfs ---------------------------------------------------------

# Link speed per lane (GT/s, as sysfs writes it) -> PCIe generation
GENERATION_BY_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pcie_generation(speed: str) -> int | None:
    """ "32.0 GT/s PCIe" (or "32 GT/s") -> 5; None for "Unknown" and anything else."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s", speed)
    return GENERATION_BY_SPEED.get(float(match.group(1))) if match else None


@dataclass(frozen=True)
class SlotLimit:
    """What the GPU's PCIe function and the port above it (a root port or a switch port) can do,
    from sysfs. The link trains to the lower of the two; None: not readable, `missing` says why."""

    pci_bus_id: str
    gpu_gen_max: int | None = None
    gpu_width_max: int | None = None
    port: str | None = None  # the port's PCI address, "0000:17:01.0"; None: the GPU hangs off no port
    port_gen_max: int | None = None
    port_width_max: int | None = None
    missing: Mapping[str, str] = field(default_factory=dict)  # field -> why: no_device, no_port, unreadable


def _link_caps(path: Path, prefix: str, missing: dict[str, str]) -> tuple[int | None, int | None]:
    """(max generation, max width) of one PCI function's directory."""
    values: list[int | None] = []
    for key, name, parse in (
        ("gen_max", "max_link_speed", pcie_generation),
        ("width_max", "max_link_width", lambda text: int(text) if text.strip().isdigit() else None),
    ):
        try:
            value = parse((path / name).read_text())
        except OSError:
            value = None
        if value is None:
            missing[f"{prefix}_{key}"] = "unreadable"
        values.append(value)
    return values[0], values[1]


def read_slot_limit(pci_bus_id: str, sys_root: str | os.PathLike[str] = "/sys") -> SlotLimit:
    """The slot limit of the GPU at `pci_bus_id` (sysfs form): its own max link speed and width,
    and those of the port above it (the parent directory of the device's real path)."""
    missing: dict[str, str] = {}
    device = Path(sys_root, "bus/pci/devices", pci_bus_id)
    if not device.exists():
        keys = ("gpu_gen_max", "gpu_width_max", "port", "port_gen_max", "port_width_max")
        return SlotLimit(pci_bus_id, missing=dict.fromkeys(keys, "no_device"))
    real = Path(os.path.realpath(device))
    gpu_gen, gpu_width = _link_caps(real, "gpu", missing)
    port = real.parent.name if _BDF.match(real.parent.name) else None
    if port is None:  # straight under a host bridge ("pci0000:00"): no port to limit it
        missing.update(dict.fromkeys(("port", "port_gen_max", "port_width_max"), "no_port"))
        return SlotLimit(pci_bus_id, gpu_gen, gpu_width, missing=missing)
    port_gen, port_width = _link_caps(real.parent, "port", missing)
    return SlotLimit(pci_bus_id, gpu_gen, gpu_width, port, port_gen, port_width, missing)


def read_slot_limits(facts: SystemFacts, sys_root: str | os.PathLike[str] = "/sys") -> dict[int, SlotLimit]:
    """The slot limit of every GPU whose PCI address NVML gave, by GPU index."""
    return {g.index: read_slot_limit(g.pci_bus_id, sys_root) for g in facts.gpus if g.pci_bus_id}
