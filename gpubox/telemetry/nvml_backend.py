"""The NVML backend: reads every GPU and GPU process through pynvml.

Rates (GPM metrics, PCIe counters, process utilization) are taken against the previous
refresh's sample, never by sleeping. A figure that fails is None with its reason; a GPU that is
lost stays in the snapshot, marked lost, and the sampler goes on with the others. Calls that a
driver does not support are not repeated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from types import ModuleType
from typing import Any

from gpubox.telemetry.backend import BackendUnavailable
from gpubox.telemetry.host_procs import PidInfo, PidTable, host_snapshot, signal_process
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, ProcessSnapshot, Reason
from gpubox.telemetry.nvml_errors import PERMANENT, nvml_errors, reason_for

MIB = 1024 * 1024

CLOCK_EVENT_NAMES = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

# GPM metric ids (nvmlGpmMetricId_t).
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_PCIE_TX, GPM_PCIE_RX = 2, 3, 20, 21
GPM_FIELDS = {GPM_SM_UTIL: "sm_active", GPM_SM_OCCUPANCY: "sm_occupancy"}


def decode_clock_events(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_EVENT_NAMES if mask & bit)


def load_nvml() -> ModuleType:
    """Import pynvml and initialise NVML, or raise BackendUnavailable with one clear line."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise BackendUnavailable("the nvidia-ml-py package (pynvml) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound as exc:
        raise BackendUnavailable("no NVIDIA driver found (libnvidia-ml.so.1 is not installed)") from exc
    except pynvml.NVMLError_DriverNotLoaded as exc:
        raise BackendUnavailable("the NVIDIA kernel driver is not loaded") from exc
    except pynvml.NVMLError_NoPermission as exc:
        raise BackendUnavailable("no permission to open the NVIDIA devices (/dev/nvidia*)") from exc
    except pynvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML failed to start: {exc}") from exc
    module: ModuleType = pynvml
    return module


@dataclass
class _Device:
    """What the backend remembers about one GPU (or MIG instance) between refreshes."""

    handle: Any
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None
    mig_instance: int | None
    static: dict[str, Any] = field(default_factory=dict)  # figures that never change
    dead: dict[str, Reason] = field(default_factory=dict)  # calls not to repeat, and why
    lost: bool = False
    mig_parent: bool = False
    gpm_supported: bool = False
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_filled: int = 0  # how many of gpm_samples hold data
    pcie_source: str | None = None
    pcie_prev: tuple[int, int, int] | None = None  # (timestamp µs, tx bytes, rx bytes)
    proc_util_ts: int = 0


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.time,
        pids: PidTable | None = None,
    ) -> None:
        self._nvml = nvml if nvml is not None else load_nvml()
        self._errors = nvml_errors(self._nvml)
        self._clock = clock
        self._pids = pids or PidTable()
        self._versions = self._read_versions()
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._errors as exc:
            raise BackendUnavailable(f"NVML cannot count the GPUs: {exc}") from exc
        self._devices: list[_Device] = []
        self._errors_seen: list[str] = []
        for index in range(count):
            self._devices.extend(self._open(index))

    # -- set-up ------------------------------------------------------------------------------

    def _read_versions(self) -> tuple[str | None, str | None, str | None]:
        n = self._nvml

        def text(fn: Callable[[], Any]) -> str | None:
            try:
                value = fn()
            except self._errors:
                return None
            return value.decode() if isinstance(value, bytes) else str(value)

        cuda = None
        try:
            raw = n.nvmlSystemGetCudaDriverVersion()
            cuda = f"{raw // 1000}.{raw % 1000 // 10}"
        except self._errors:
            pass
        return text(n.nvmlSystemGetDriverVersion), cuda, text(n.nvmlSystemGetNVMLVersion)

    def _open(self, index: int) -> list[_Device]:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            name = _text(n.nvmlDeviceGetName(handle))
        except self._errors as exc:
            self._errors_seen.append(f"GPU {index}: {exc}")
            lost = _Device(None, index, f"unknown-{index}", "unknown", None, None, lost=True)
            return [lost]
        bus_id = self._try(lambda: _text(n.nvmlDeviceGetPciInfo(handle).busId))
        parent = _Device(handle, index, uuid, name, bus_id, None)
        self._read_static(parent)
        migs = self._mig_devices(parent)
        # In MIG mode the parent keeps the whole-card figures (power, clocks, PCIe); memory and
        # processes belong to the instances, so the parent lists none to avoid counting twice.
        parent.mig_parent = bool(migs)
        return [parent, *migs]

    def _mig_devices(self, parent: _Device) -> list[_Device]:
        n = self._nvml
        try:
            current, _pending = n.nvmlDeviceGetMigMode(parent.handle)
        except self._errors:
            return []
        if current != 1:
            return []
        out: list[_Device] = []
        try:
            slots = n.nvmlDeviceGetMaxMigDeviceCount(parent.handle)
        except self._errors:
            return []
        for slot in range(slots):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
                gi = n.nvmlDeviceGetGpuInstanceId(mh)
                mig_uuid, mig_name = _text(n.nvmlDeviceGetUUID(mh)), _text(n.nvmlDeviceGetName(mh))
                mig = _Device(mh, parent.index, mig_uuid, mig_name, parent.pci_bus_id, gi)
            except self._errors:
                continue  # an empty slot raises NotFound
            # The link is the card's; memory is the instance's own.
            mig.static = {k: v for k, v in parent.static.items() if k.startswith("pcie_")}
            self._read_static(mig)
            out.append(mig)
        return out

    def _read_static(self, dev: _Device) -> None:
        n, h = self._nvml, dev.handle
        calls: dict[str, Callable[[], Any]] = {
            "pcie_link_gen_max": lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "pcie_link_width_max": lambda: n.nvmlDeviceGetMaxPcieLinkWidth(h),
            "mem_total_bytes": lambda: n.nvmlDeviceGetMemoryInfo(h).total,
        }
        for key, fn in calls.items():
            if key not in dev.static:
                dev.static[key] = self._call(dev, key, fn)
        try:
            dev.gpm_supported = bool(n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except self._errors as exc:
            dev.dead["gpm"] = reason_for(exc)
        else:
            if not dev.gpm_supported:
                dev.dead["gpm"] = Reason.NOT_SUPPORTED

    # -- calls -------------------------------------------------------------------------------

    def _try(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._errors:
            return None

    def _call(self, dev: _Device, key: str, fn: Callable[[], Any], reasons: dict[str, str] | None = None) -> Any:
        """Call fn; on failure record why under `key`, and mark lost GPUs and dead calls."""
        dead = dev.dead.get(key)
        if dead is not None:
            if reasons is not None:
                reasons[key] = dead.value
            return None
        try:
            return fn()
        except self._errors as exc:
            reason = reason_for(exc)
            if reason == Reason.GPU_LOST:
                dev.lost = True
            elif reason in PERMANENT:
                dev.dead[key] = reason
            elif reason == Reason.ERROR:
                self._errors_seen.append(f"GPU {dev.index} {key}: {exc}")
            if reasons is not None:
                reasons[key] = reason.value
            return None

    # -- sampling ----------------------------------------------------------------------------

    def sample(self) -> BoxSnapshot:
        self._errors_seen = []
        gpus: list[GpuSnapshot] = []
        procs: list[ProcessSnapshot] = []
        for dev in self._devices:
            gpu, raw_procs = self._sample_device(dev)
            gpus.append(gpu)
            procs.extend(raw_procs)
        info = self._pids.lookup({p.pid for p in procs})
        joined = tuple(_with_pid_info(p, info.get(p.pid)) for p in procs)
        driver, cuda, nvml_version = self._versions
        host = host_snapshot(driver, cuda, nvml_version)
        return BoxSnapshot(self._clock(), self.name, host, tuple(gpus), joined, tuple(self._errors_seen))

    def _sample_device(self, dev: _Device) -> tuple[GpuSnapshot, list[ProcessSnapshot]]:
        if dev.lost:
            return _lost(dev), []
        n, h = self._nvml, dev.handle
        reasons: dict[str, str] = {}
        values: dict[str, Any] = {}

        util = self._call(dev, "gpu_busy", lambda: n.nvmlDeviceGetUtilizationRates(h), reasons)
        if dev.lost:
            return _lost(dev), []
        if util is not None:
            values["gpu_busy"], values["mem_busy"] = float(util.gpu), float(util.memory)
        elif "gpu_busy" in reasons:
            reasons["mem_busy"] = reasons["gpu_busy"]
        mem = self._call(dev, "mem_used_bytes", lambda: n.nvmlDeviceGetMemoryInfo(h), reasons)
        if mem is not None:
            values["mem_used_bytes"] = int(mem.used)
        simple: dict[str, Callable[[], Any]] = {
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temperature_c": lambda: float(n.nvmlDeviceGetTemperature(h, 0)),
            "clock_sm_mhz": lambda: int(n.nvmlDeviceGetClockInfo(h, 1)),
            "clock_mem_mhz": lambda: int(n.nvmlDeviceGetClockInfo(h, 2)),
            "pcie_link_gen": lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "pcie_link_width": lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        }
        for key, fn in simple.items():
            values[key] = self._call(dev, key, fn, reasons)
        values["clock_event_reasons"] = self._clock_events(dev, reasons)
        gpm = self._gpm(dev, reasons)
        values.update({GPM_FIELDS[m]: v for m, v in gpm.items() if m in GPM_FIELDS})
        tx, rx = self._pcie(dev, gpm, reasons)
        for key, value in dev.static.items():
            values[key] = value
            if value is None and key in dev.dead:
                reasons[key] = dev.dead[key].value
        if dev.lost:
            return _lost(dev), []
        gpu = GpuSnapshot(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            pci_bus_id=dev.pci_bus_id,
            mig_instance=dev.mig_instance,
            pcie_tx_Bps=tx,
            pcie_rx_Bps=rx,
            pcie_source=dev.pcie_source,
            reasons=reasons,
            **values,
        )
        return gpu, [] if dev.mig_parent else self._processes(dev)

    def _clock_events(self, dev: _Device, reasons: dict[str, str]) -> tuple[str, ...] | None:
        n, h = self._nvml, dev.handle
        mask = self._call(dev, "clock_event_reasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if mask is None and dev.dead.get("clock_event_reasons") == Reason.FUNCTION_MISSING:
            # Drivers before 535 only have the older name of the same call.
            mask = self._call(dev, "clock_throttle_reasons", lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            reason = dev.dead.get("clock_throttle_reasons")
        else:
            reason = dev.dead.get("clock_event_reasons")
        if mask is None:
            reasons["clock_event_reasons"] = (reason or Reason.ERROR).value
            return None
        return decode_clock_events(int(mask))

    def _gpm(self, dev: _Device, reasons: dict[str, str]) -> dict[int, float]:
        """GPM metrics over the time since the previous refresh: two alternating samples."""
        dead = dev.dead.get("gpm")
        if dead is not None:
            for key in GPM_FIELDS.values():
                reasons[key] = dead.value
            return {}
        n = self._nvml
        try:
            if not dev.gpm_samples:
                dev.gpm_samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
            # The newest sample goes into the older buffer; the pair is (previous, newest).
            newest = dev.gpm_samples[dev.gpm_filled % 2]
            n.nvmlGpmSampleGet(dev.handle, newest)
            dev.gpm_filled += 1
            if dev.gpm_filled < 2:
                for key in GPM_FIELDS.values():
                    reasons[key] = Reason.WARMING_UP.value
                return {}
            previous = dev.gpm_samples[dev.gpm_filled % 2]
            req = n.c_nvmlGpmMetricsGet_t()
            req.version = n.NVML_GPM_METRICS_GET_VERSION
            req.sample1, req.sample2 = previous, newest
            wanted = (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_PCIE_TX, GPM_PCIE_RX)
            req.numMetrics = len(wanted)
            for i, metric in enumerate(wanted):
                req.metrics[i].metricId = metric
            n.nvmlGpmMetricsGet(req)
        except self._errors as exc:
            reason = reason_for(exc)
            if reason == Reason.GPU_LOST:
                dev.lost = True
            else:
                dev.dead["gpm"] = reason  # GPM works or it does not: do not retry each tick
            for key in GPM_FIELDS.values():
                reasons[key] = reason.value
            return {}
        out: dict[int, float] = {}
        for i, metric in enumerate(wanted):
            m = req.metrics[i]
            if m.nvmlReturn == 0:
                out[metric] = round(float(m.value), 2)
            elif metric in GPM_FIELDS:
                reasons[GPM_FIELDS[metric]] = reason_for(n.NVMLError(m.nvmlReturn)).value
        return out

    def _pcie(self, dev: _Device, gpm: dict[int, float], reasons: dict[str, str]) -> tuple[float | None, float | None]:
        """PCIe bytes/s from the cheapest source: GPM, then the byte counters, then the
        throughput call that blocks ~20 ms per direction."""
        if "gpm" not in dev.dead and dev.pcie_source in (None, "gpm"):
            if GPM_PCIE_TX in gpm and GPM_PCIE_RX in gpm:
                dev.pcie_source = "gpm"
                return gpm[GPM_PCIE_TX] * MIB, gpm[GPM_PCIE_RX] * MIB
            if dev.gpm_filled < 2:
                reasons["pcie_tx_Bps"] = reasons["pcie_rx_Bps"] = Reason.WARMING_UP.value
                return None, None
        if dev.pcie_source != "throughput" and "pcie_counters" not in dev.dead:
            rates = self._pcie_counters(dev, reasons)
            if rates is not None:
                return rates
        n, h = self._nvml, dev.handle
        why: dict[str, str] = {}
        tx = self._call(dev, "pcie_throughput", lambda: n.nvmlDeviceGetPcieThroughput(h, 0) * 1024.0, why)
        rx = None
        if tx is not None:
            rx = self._call(dev, "pcie_throughput", lambda: n.nvmlDeviceGetPcieThroughput(h, 1) * 1024.0, why)
        if tx is not None and rx is not None:
            dev.pcie_source = "throughput"
            return tx, rx
        reasons["pcie_tx_Bps"] = reasons["pcie_rx_Bps"] = why.get("pcie_throughput", Reason.ERROR.value)
        return None, None

    def _pcie_counters(self, dev: _Device, reasons: dict[str, str]) -> tuple[float | None, float | None] | None:
        n, h = self._nvml, dev.handle
        fields = (n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
        got = self._call(dev, "pcie_counters", lambda: n.nvmlDeviceGetFieldValues(h, list(fields)))
        if got is None:
            return None
        if got[0].nvmlReturn != 0 or got[1].nvmlReturn != 0:
            bad = got[0].nvmlReturn or got[1].nvmlReturn
            dev.dead["pcie_counters"] = reason_for(n.NVMLError(bad))
            return None
        dev.pcie_source = "counters"
        now = (int(got[0].timestamp), int(got[0].value.ullVal), int(got[1].value.ullVal))
        prev, dev.pcie_prev = dev.pcie_prev, now
        if prev is None or now[0] <= prev[0] or now[1] < prev[1] or now[2] < prev[2]:
            reasons["pcie_tx_Bps"] = reasons["pcie_rx_Bps"] = Reason.WARMING_UP.value
            return None, None
        seconds = (now[0] - prev[0]) / 1e6
        return (now[1] - prev[1]) / seconds, (now[2] - prev[2]) / seconds

    def _processes(self, dev: _Device) -> list[ProcessSnapshot]:
        n, h = self._nvml, dev.handle
        found: dict[int, tuple[str, int | None]] = {}
        for kind, fn in (
            ("graphics", n.nvmlDeviceGetGraphicsRunningProcesses),
            ("compute", n.nvmlDeviceGetComputeRunningProcesses),
        ):
            running = self._call(dev, f"{kind}_processes", partial(fn, h)) or []
            for p in running:
                mem = p.usedGpuMemory
                found[int(p.pid)] = (kind, int(mem) if mem is not None else None)
        if not found:
            return []
        util_reasons: dict[str, str] = {}
        sm: dict[int, float] | None = None
        if dev.mig_instance is not None:
            util_reasons["sm_util"] = Reason.NOT_SUPPORTED.value  # NVML has no per-process figures in MIG
        else:
            sm = self._process_util(dev, util_reasons)
        out = []
        for pid, (kind, mem) in found.items():
            reasons = dict(util_reasons)
            if mem is None:
                reasons["gpu_mem_bytes"] = Reason.NOT_SUPPORTED.value
            out.append(
                ProcessSnapshot(
                    pid=pid,
                    gpu_index=dev.index,
                    gpu_uuid=dev.uuid,
                    kind=kind,
                    sm_util=None if sm is None else sm.get(pid, 0.0),
                    gpu_mem_bytes=mem,
                    reasons=reasons,
                )
            )
        return out

    def _process_util(self, dev: _Device, reasons: dict[str, str]) -> dict[int, float] | None:
        n = self._nvml
        if "sm_util" in dev.dead:
            reasons["sm_util"] = dev.dead["sm_util"].value
            return None
        try:
            samples = n.nvmlDeviceGetProcessUtilization(dev.handle, dev.proc_util_ts)
        except n.NVMLError_NotFound:
            return {}  # no process ran a kernel since the last look
        except self._errors as exc:
            reason = reason_for(exc)
            if reason in PERMANENT:
                dev.dead["sm_util"] = reason
            reasons["sm_util"] = reason.value
            return None
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            ts = int(s.timeStamp)
            dev.proc_util_ts = max(dev.proc_util_ts, ts)
            if s.pid not in latest or ts > latest[s.pid][0]:
                latest[int(s.pid)] = (ts, float(s.smUtil))
        return {pid: util for pid, (_, util) in latest.items()}

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        signal_process(pid, sig, start_time)

    def close(self) -> None:
        for dev in self._devices:
            for s in dev.gpm_samples:
                self._try(partial(self._nvml.nvmlGpmSampleFree, s))
            dev.gpm_samples = []
        self._try(self._nvml.nvmlShutdown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_IDENTITY = frozenset({"index", "uuid", "name", "pci_bus_id", "mig_instance", "lost", "reasons"})


def _lost(dev: _Device) -> GpuSnapshot:
    names = [f for f in GpuSnapshot.__dataclass_fields__ if f not in _IDENTITY]
    return GpuSnapshot(
        index=dev.index,
        uuid=dev.uuid,
        name=dev.name,
        pci_bus_id=dev.pci_bus_id,
        mig_instance=dev.mig_instance,
        lost=True,
        reasons={name: Reason.GPU_LOST.value for name in names},
    )


def _with_pid_info(p: ProcessSnapshot, info: PidInfo | None) -> ProcessSnapshot:
    reasons = dict(p.reasons)
    reasons["loader_wait"] = Reason.NOT_MEASURED.value
    if info is None:
        return replace(p, reasons=reasons)
    reasons.update(info.reasons)
    return replace(
        p,
        user=info.user,
        command=info.command,
        cpu_percent=info.cpu_percent,
        rss_bytes=info.rss_bytes,
        start_time=info.start_time,
        reasons=reasons,
    )
