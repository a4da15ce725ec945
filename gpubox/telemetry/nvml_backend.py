"""The NVML backend: reads every GPU and GPU process through pynvml.

A figure that fails is None with its reason; a GPU that is lost stays in the snapshot, marked
lost, and the sampler goes on with the others. Calls that a driver will never answer are not
repeated. Rates come from nvml_rates, against the previous refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import ModuleType
from typing import Any

from gpubox.telemetry.backend import BackendUnavailable
from gpubox.telemetry.host_procs import PidInfo, PidTable, host_snapshot, prime_host_cpu, signal_process
from gpubox.telemetry.loader_wait import LoaderWait, LoaderWaitReader
from gpubox.telemetry.model import BoxSnapshot, GpuId, GpuSnapshot, ProcessSnapshot, Reason
from gpubox.telemetry.nvml_device import Caller, Device
from gpubox.telemetry.nvml_errors import PERMANENT, reason_for
from gpubox.telemetry.nvml_load import load_nvml
from gpubox.telemetry.nvml_rates import GPM_FIELDS, read_gpm, read_pcie, read_process_util

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


def decode_clock_events(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in CLOCK_EVENT_NAMES if mask & bit)


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.time,
        pids: PidTable | None = None,
        loader_wait: LoaderWaitReader | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml if nvml is not None else load_nvml()
        self._call = Caller(self._nvml)
        self._clock = clock
        self._monotonic = monotonic  # how long NVML has had no new process sample
        self._pids = pids or PidTable()
        self._loader_wait = loader_wait or LoaderWaitReader()
        self._versions = self._read_versions()
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._call.errors as exc:
            raise BackendUnavailable(f"NVML cannot count the GPUs: {exc}") from exc
        self._open_errors: list[str] = []  # GPUs that could not be opened: said in every snapshot
        self._devices: list[Device] = []
        for index in range(count):
            self._devices.extend(self._open(index))
        prime_host_cpu()

    # -- set-up ------------------------------------------------------------------------------

    def _read_versions(self) -> tuple[str | None, str | None, str | None]:
        n, quiet = self._nvml, self._call.quiet
        raw = quiet(n.nvmlSystemGetCudaDriverVersion)
        cuda = None if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"
        driver, nvml_version = quiet(n.nvmlSystemGetDriverVersion), quiet(n.nvmlSystemGetNVMLVersion)
        return (
            (None if driver is None else _text(driver)),
            cuda,
            (None if nvml_version is None else _text(nvml_version)),
        )

    def _open(self, index: int) -> list[Device]:
        n = self._nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(n.nvmlDeviceGetUUID(handle))
            name = _text(n.nvmlDeviceGetName(handle))
        except self._call.errors as exc:
            self._open_errors.append(f"GPU {index} cannot be opened: {exc}")
            return [Device(None, index, f"unknown-{index}", "unknown", None, broken=reason_for(exc))]
        bus_id = self._call.quiet(lambda: _text(n.nvmlDeviceGetPciInfo(handle).busId))
        parent = Device(handle, index, uuid, name, bus_id)
        migs = self._mig_devices(parent)
        # In MIG mode the parent keeps the whole-card figures (power, clocks, PCIe); memory and
        # processes belong to the instances, so the parent lists none to avoid counting twice.
        parent.mig_parent = bool(migs)
        return [parent, *migs]

    def _mig_devices(self, parent: Device) -> list[Device]:
        n, quiet = self._nvml, self._call.quiet
        mode = quiet(lambda: n.nvmlDeviceGetMigMode(parent.handle))
        slots = quiet(lambda: n.nvmlDeviceGetMaxMigDeviceCount(parent.handle)) if mode and mode[0] == 1 else 0
        out: list[Device] = []
        for slot in range(slots or 0):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
                gi = n.nvmlDeviceGetGpuInstanceId(mh)
                mig_uuid, mig_name = _text(n.nvmlDeviceGetUUID(mh)), _text(n.nvmlDeviceGetName(mh))
            except self._call.errors:
                continue  # an empty slot raises NotFound
            out.append(Device(mh, parent.index, mig_uuid, mig_name, parent.pci_bus_id, gi, parent_handle=parent.handle))
        return out

    def gpus(self) -> tuple[GpuId, ...]:
        return tuple(GpuId(dev.index, dev.uuid) for dev in self._devices)

    # -- sampling ----------------------------------------------------------------------------

    def sample(self) -> BoxSnapshot:
        self._call.seen = []
        gpus: list[GpuSnapshot] = []
        procs: list[ProcessSnapshot] = []
        for dev in self._devices:
            gpu, raw_procs = self._sample_device(dev)
            gpus.append(gpu)
            procs.extend(raw_procs)
        info = self._pids.lookup({p.pid for p in procs})
        ticks = {pid: i.start_ticks for pid, i in info.items() if i.start_ticks is not None}
        waits = self._loader_wait.read(ticks)
        joined = tuple(_with_pid_info(p, info.get(p.pid), waits.by_pid.get(p.pid)) for p in procs)
        driver, cuda, nvml_version = self._versions
        host = host_snapshot(driver, cuda, nvml_version)
        errors = (*self._open_errors, *self._call.seen, *waits.errors)
        return BoxSnapshot(self._clock(), self.name, host, tuple(gpus), joined, errors, waits.notices)

    def _static(self, dev: Device, reasons: dict[str, str]) -> dict[str, Any]:
        """Figures read once; one that failed for a passing reason is tried again."""
        n, h = self._nvml, dev.handle
        calls: dict[str, Callable[[], Any]] = {
            "pcie_link_gen_max": lambda: int(n.nvmlDeviceGetMaxPcieLinkGeneration(dev.parent_handle or h)),
            "pcie_link_width_max": lambda: int(n.nvmlDeviceGetMaxPcieLinkWidth(dev.parent_handle or h)),
            "mem_total_bytes": lambda: int(n.nvmlDeviceGetMemoryInfo(h).total),
        }
        for key, fn in calls.items():
            if dev.static.get(key) is None:
                dev.static[key] = self._call(dev, key, fn, reasons)
        return dev.static

    def _memory_used(self, dev: Device, reasons: dict[str, str]) -> int | None:
        """Memory in use as nvidia-smi, nvtop and DCGM count it: without what the driver reserves
        for itself (NVML's v2 call; a few hundred MiB on an idle GPU). A driver or binding that
        cannot answer v2 (old, WSL, a struct it does not know) is asked the older way from then
        on, whose figure includes the reserved part; once v2 has answered, a failure that may pass
        gives no figure that time: the same GPU never switches between the two."""
        n, h = self._nvml, dev.handle
        if "mem_used_v2" not in dev.dead:
            try:
                used = int(n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2).used)
            except AttributeError:  # a binding without nvmlMemory_v2
                dev.dead["mem_used_v2"] = Reason.FUNCTION_MISSING
            except self._call.errors as exc:
                reason = reason_for(exc)
                # Once v2 has answered, a passing failure is no figure this time, not the older kind.
                if reason == Reason.GPU_LOST or (dev.mem_v2_answered and reason not in PERMANENT):
                    reasons["mem_used_bytes"] = self._call.failed(dev, "mem_used_bytes", exc).value
                    return None
                dev.dead["mem_used_v2"] = reason
            else:
                dev.mem_v2_answered = True
                return used
        mem = self._call(dev, "mem_used_bytes", lambda: n.nvmlDeviceGetMemoryInfo(h), reasons)
        return None if mem is None else int(mem.used)

    def _sample_device(self, dev: Device) -> tuple[GpuSnapshot, list[ProcessSnapshot]]:
        if dev.broken:
            return _unreadable(dev), []
        n, h, call = self._nvml, dev.handle, self._call
        reasons: dict[str, str] = {}
        values: dict[str, Any] = {}
        util = call(dev, "gpu_busy", lambda: n.nvmlDeviceGetUtilizationRates(h), reasons)
        if dev.broken:
            return _unreadable(dev), []
        if util is not None:
            values["gpu_busy"], values["mem_busy"] = float(util.gpu), float(util.memory)
        elif "gpu_busy" in reasons:
            reasons["mem_busy"] = reasons["gpu_busy"]
        values["mem_used_bytes"] = self._memory_used(dev, reasons)
        if dev.broken:
            return _unreadable(dev), []
        simple: dict[str, Callable[[], Any]] = {
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "energy_mj": lambda: int(n.nvmlDeviceGetTotalEnergyConsumption(h)),  # the whole GPU: not per MIG
            "power_limit_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temperature_c": lambda: float(n.nvmlDeviceGetTemperature(h, 0)),
            "clock_sm_mhz": lambda: int(n.nvmlDeviceGetClockInfo(h, 1)),
            "clock_mem_mhz": lambda: int(n.nvmlDeviceGetClockInfo(h, 2)),
            "pcie_link_gen": lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(dev.parent_handle or h)),
            "pcie_link_width": lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(dev.parent_handle or h)),
        }
        for key, fn in simple.items():
            values[key] = call(dev, key, fn, reasons)
        values["clock_event_reasons"] = self._clock_events(dev, reasons)
        values.update(self._static(dev, reasons))
        gpm = read_gpm(call, dev, reasons)
        values.update({GPM_FIELDS[m]: v for m, v in gpm.items() if m in GPM_FIELDS})
        tx, rx = read_pcie(call, dev, gpm, reasons)
        processes = [] if dev.mig_parent else self._processes(dev, reasons)
        if dev.broken:
            return _unreadable(dev), []
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
        return gpu, processes

    def _clock_events(self, dev: Device, reasons: dict[str, str]) -> tuple[str, ...] | None:
        n, h = self._nvml, dev.handle
        why: dict[str, str] = {}
        mask = self._call(dev, "clock_event_reasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h), why)
        if mask is None and dev.dead.get("clock_event_reasons") == Reason.FUNCTION_MISSING:
            # Drivers before 535 only have the older name of the same call.
            old = self._call(dev, "clock_throttle_reasons", lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h), why)
            mask, why = old, {"clock_event_reasons": why.get("clock_throttle_reasons", Reason.ERROR.value)}
        if mask is None:
            reasons["clock_event_reasons"] = why.get("clock_event_reasons", Reason.ERROR.value)
            return None
        return decode_clock_events(int(mask))

    def _processes(self, dev: Device, gpu_reasons: dict[str, str]) -> list[ProcessSnapshot]:
        """The GPU's processes; where a list cannot be read, `gpu_reasons["processes"]` says why (the
        processes are then unknown, not none)."""
        n, h = self._nvml, dev.handle
        found: dict[int, tuple[str, int | None]] = {}
        lists: list[tuple[str, Callable[..., Any]]] = [
            ("graphics", n.nvmlDeviceGetGraphicsRunningProcesses),
            ("compute", n.nvmlDeviceGetComputeRunningProcesses),
        ]
        # Under MPS the compute list holds only the MPS server; its clients, the work, are listed
        # apart (a binding or driver without the call has no MPS clients to show).
        mps = getattr(n, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if mps is not None:
            lists.append(("mps", mps))
        for kind, fn in lists:
            why: dict[str, str] = {}
            for p in self._call(dev, f"{kind}_processes", partial(fn, h), why) or []:
                mem = p.usedGpuMemory
                # In both the graphics and the compute list (a visualiser that also runs CUDA):
                # one process, as nvidia-smi's "C+G".
                seen = found.get(int(p.pid), ("", None))[0]
                both = {seen, kind} == {"graphics", "compute"}
                found[int(p.pid)] = ("compute+graphics" if both else kind, int(mem) if mem is not None else None)
            if why and kind != "mps":  # a box without MPS leaves no process unknown
                gpu_reasons["processes"] = why[f"{kind}_processes"]
        if not found:
            return []
        util_reasons: dict[str, str] = {}
        sm: dict[int, float] | None = None
        if dev.mig_instance is not None:
            util_reasons["sm_util"] = Reason.NOT_SUPPORTED.value  # NVML has no per-process figures in MIG
        else:
            sm = read_process_util(self._call, dev, set(found), util_reasons, self._monotonic())
        out = []
        for pid, (kind, mem) in found.items():
            reasons = dict(util_reasons)
            if mem is None:
                reasons["gpu_mem_bytes"] = Reason.NOT_SUPPORTED.value
            util = None if sm is None else sm[pid]
            out.append(
                ProcessSnapshot(pid, dev.index, dev.uuid, kind, sm_util=util, gpu_mem_bytes=mem, reasons=reasons)
            )
        return out

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        if not self._pids.host_pids_visible:
            raise ProcessLookupError(f"pid {pid} is a host pid, and gpubox runs in another PID namespace")
        signal_process(pid, sig, start_time)

    def close(self) -> None:
        for dev in self._devices:
            for s in dev.gpm_samples:
                self._call.quiet(partial(self._nvml.nvmlGpmSampleFree, s))
            dev.gpm_samples = []
        self._call.quiet(self._nvml.nvmlShutdown)
        self._loader_wait.close()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _maybe_text(value: Any) -> str | None:
    return None if value is None else _text(value)


_IDENTITY = frozenset({"index", "uuid", "name", "pci_bus_id", "mig_instance", "lost", "reasons"})


def _unreadable(dev: Device) -> GpuSnapshot:
    """A GPU that can no longer be read (lost) or never could be: every figure null, one reason."""
    reason = dev.broken or Reason.ERROR
    names = [f for f in GpuSnapshot.__dataclass_fields__ if f not in _IDENTITY]
    return GpuSnapshot(
        index=dev.index,
        uuid=dev.uuid,
        name=dev.name,
        pci_bus_id=dev.pci_bus_id,
        mig_instance=dev.mig_instance,
        lost=reason == Reason.GPU_LOST,
        reasons=dict.fromkeys(names, reason.value),
    )


def _with_pid_info(p: ProcessSnapshot, info: PidInfo | None, wait: LoaderWait | None) -> ProcessSnapshot:
    reasons = dict(p.reasons)
    if info is None:
        reasons["loader_wait"] = Reason.NOT_MEASURED.value
        return replace(p, reasons=reasons)
    reasons.update(info.reasons)
    if wait is None:  # no start ticks to name a probe file by: hidden, or not ours to read
        reasons["loader_wait"] = info.reasons.get("start_time", Reason.NOT_MEASURED.value)
    elif wait.reason is not None:
        reasons["loader_wait"] = wait.reason
    return replace(
        p,
        user=info.user,
        command=info.command,
        cpu_percent=info.cpu_percent,
        rss_bytes=info.rss_bytes,
        start_time=info.start_time,
        loader_wait=None if wait is None else wait.loader_wait,
        loader_wait_source=None if wait is None else wait.source,
        loader_wait_samples=None if wait is None else wait.samples,
        batches_per_s=None if wait is None else wait.batches_per_s,
        job_id=info.job_id,
        job_kind=info.job_kind,
        reasons=reasons,
    )
