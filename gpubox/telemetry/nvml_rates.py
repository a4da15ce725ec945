"""Figures that are rates over the time since the previous refresh: GPM metrics, PCIe bytes per
second and per-process SM use. None of them sleeps to take a second sample."""

from __future__ import annotations

import math

from gpubox.telemetry.model import Reason
from gpubox.telemetry.nvml_device import Caller, Device
from gpubox.telemetry.nvml_errors import PERMANENT, reason_for

MIB = 1024 * 1024

# GPM metric ids (nvmlGpmMetricId_t).
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_PCIE_TX, GPM_PCIE_RX = 2, 3, 20, 21
GPM_FIELDS = {GPM_SM_UTIL: "sm_active", GPM_SM_OCCUPANCY: "sm_occupancy"}
GPM_WANTED = (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_PCIE_TX, GPM_PCIE_RX)

# A process with no new utilization sample keeps its last one this long; after that it ran no
# kernel lately, and NVML's silence means 0%.
PROCESS_UTIL_HOLD_US = 3_000_000


def _gpm_supported(call: Caller, dev: Device) -> bool:
    if dev.gpm_supported is None:
        support = call(dev, "gpm", lambda: call.nvml.nvmlGpmQueryDeviceSupport(dev.parent_handle or dev.handle))
        if support is not None:
            dev.gpm_supported = bool(support.isSupportedDevice)
            if not dev.gpm_supported:
                dev.dead["gpm"] = Reason.NOT_SUPPORTED
    return bool(dev.gpm_supported)


def read_gpm(call: Caller, dev: Device, reasons: dict[str, str]) -> dict[int, float]:
    """GPM metrics between the previous refresh's sample and a new one (two buffers, alternating)."""

    def missing(reason: str) -> dict[int, float]:
        for key in GPM_FIELDS.values():
            reasons[key] = reason
        return {}

    if "gpm" in dev.dead:
        return missing(dev.dead["gpm"].value)
    if not _gpm_supported(call, dev):
        return missing(dev.dead.get("gpm", Reason.ERROR).value)
    n = call.nvml
    try:
        if not dev.gpm_samples:
            dev.gpm_samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
        newest = dev.gpm_samples[dev.gpm_filled % 2]
        if dev.mig_instance is not None:
            n.nvmlGpmMigSampleGet(dev.parent_handle, dev.mig_instance, newest)
        else:
            n.nvmlGpmSampleGet(dev.handle, newest)
        dev.gpm_filled += 1
        if dev.gpm_filled < 2:
            return missing(Reason.WARMING_UP.value)
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.sample1, req.sample2 = dev.gpm_samples[dev.gpm_filled % 2], newest
        req.numMetrics = len(GPM_WANTED)
        for i, metric in enumerate(GPM_WANTED):
            req.metrics[i].metricId = metric
        n.nvmlGpmMetricsGet(req)
    except call.errors as exc:
        reason = call.failed(dev, "gpm", exc)
        dev.gpm_filled = 0  # start the pair again after a failure that may pass
        return missing(reason.value)
    out: dict[int, float] = {}
    for i, metric in enumerate(GPM_WANTED):
        m = req.metrics[i]
        if m.nvmlReturn == 0 and math.isfinite(m.value):
            out[metric] = round(float(m.value), 2)
        elif m.nvmlReturn == 0 and metric in GPM_FIELDS:
            # A NaN or infinite figure is no figure: never "nan%" on screen, nor a null without a reason.
            reasons[GPM_FIELDS[metric]] = Reason.ERROR.value
            call.seen.append(f"GPU {dev.index} {GPM_FIELDS[metric]}: GPM gave {m.value}")
        elif metric in GPM_FIELDS:
            reasons[GPM_FIELDS[metric]] = reason_for(n.NVMLError(m.nvmlReturn)).value
    return out


Rates = tuple[float | None, float | None]


def read_pcie(call: Caller, dev: Device, gpm: dict[int, float], reasons: dict[str, str]) -> Rates:
    """PCIe bytes/s from the cheapest source: GPM, then the byte counters, then the throughput
    call that blocks ~20 ms per direction."""

    def missing(reason: str) -> tuple[None, None]:
        reasons["pcie_tx_Bps"] = reasons["pcie_rx_Bps"] = reason
        return None, None

    if dev.mig_instance is not None:
        # PCIe traffic is the card's, shown on the GPU's own row; an instance's GPM sample has no
        # share of it to give (it reads 0, which would pass for a starved input pipeline).
        return missing(Reason.NOT_SUPPORTED.value)
    if dev.pcie_source in (None, "gpm") and "gpm" not in dev.dead and dev.gpm_supported:
        if GPM_PCIE_TX in gpm and GPM_PCIE_RX in gpm:
            dev.pcie_source = "gpm"
            return gpm[GPM_PCIE_TX] * MIB, gpm[GPM_PCIE_RX] * MIB
        if dev.gpm_filled < 2:
            # GPM is not proven yet: read the counters too, so they have a baseline if GPM fails.
            if dev.pcie_source is None and "pcie_counters" not in dev.dead:
                _counter_rates(call, dev, {})
            return missing(Reason.WARMING_UP.value)
    if dev.pcie_source in (None, "gpm", "counters") and "pcie_counters" not in dev.dead:
        if dev.pcie_source == "gpm":
            # Taking over from GPM: the counters' reading from its warm-up may be hours old, and a
            # rate over those hours is not the traffic of now.
            dev.pcie_prev = None
        failed: dict[str, str] = {}
        rates = _counter_rates(call, dev, failed)
        if rates is not None:
            dev.pcie_source = "counters"
            return rates if rates[0] is not None else missing(Reason.WARMING_UP.value)
        if dev.pcie_source == "counters" and "pcie_counters" not in dev.dead:
            # Counters that have worked and failed in a way that may pass: no figure this time,
            # not a switch for good to the call that blocks ~20 ms per direction.
            return missing(failed.get("pcie_counters", Reason.ERROR.value))
    n, h = call.nvml, dev.handle
    why: dict[str, str] = {}
    tx = call(dev, "pcie_throughput", lambda: n.nvmlDeviceGetPcieThroughput(h, 0) * 1024.0, why)
    rx = None if tx is None else call(dev, "pcie_throughput", lambda: n.nvmlDeviceGetPcieThroughput(h, 1) * 1024.0, why)
    if tx is not None and rx is not None:
        dev.pcie_source = "throughput"
        return tx, rx
    return missing(why.get("pcie_throughput", Reason.ERROR.value))


def _counter_rates(call: Caller, dev: Device, failed: dict[str, str]) -> Rates | None:
    """Rates from NVML's PCIe byte counters against the previous reading: None when the
    counters cannot be read (why in `failed`), (None, None) on the first reading."""
    n, h = call.nvml, dev.handle
    fields = [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
    got = call(dev, "pcie_counters", lambda: n.nvmlDeviceGetFieldValues(h, fields), failed)
    if got is None:
        return None
    if got[0].nvmlReturn != 0 or got[1].nvmlReturn != 0:
        reason = reason_for(n.NVMLError(got[0].nvmlReturn or got[1].nvmlReturn))
        if reason in PERMANENT:
            dev.dead["pcie_counters"] = reason
        failed["pcie_counters"] = reason.value
        return None
    # The field's own timestamp (µs) is when the driver read it: exact, whatever our clock did.
    now = (int(got[0].timestamp), int(got[0].value.ullVal), int(got[1].value.ullVal))
    prev, dev.pcie_prev = dev.pcie_prev, now
    if prev is None or now[0] <= prev[0] or now[1] < prev[1] or now[2] < prev[2]:
        return None, None
    seconds = (now[0] - prev[0]) / 1e6
    return (now[1] - prev[1]) / seconds, (now[2] - prev[2]) / seconds


def read_process_util(
    call: Caller, dev: Device, pids: set[int], reasons: dict[str, str], now: float
) -> dict[int, float] | None:
    """SM % per pid from the samples NVML took since the previous refresh. A pid without a new
    sample keeps its last one for a few seconds (the driver samples processes less often than
    a fast refresh); with none at all lately it ran no kernel: 0. `now` is the refresh's time
    in seconds: NVML gives no new sample while no process runs kernels, so the age of the last
    ones counts the time since they came as well."""
    n = call.nvml
    if "sm_util" in dev.dead:
        reasons["sm_util"] = dev.dead["sm_util"].value
        return None
    try:
        samples = n.nvmlDeviceGetProcessUtilization(dev.handle, dev.proc_util_ts)
    except n.NVMLError_NotFound:
        samples = []  # nothing new since the last look
    except call.errors as exc:
        reasons["sm_util"] = call.failed(dev, "sm_util", exc).value
        return None
    newest = dev.proc_util_ts
    for s in samples:
        ts, pid = int(s.timeStamp), int(s.pid)
        dev.proc_util_ts = max(dev.proc_util_ts, ts)
        if pid not in dev.proc_util or ts >= dev.proc_util[pid][0]:
            dev.proc_util[pid] = (ts, float(s.smUtil))
    if dev.proc_util_ts > newest or dev.proc_util_at is None:
        dev.proc_util_at = now
    for gone in set(dev.proc_util) - pids:
        del dev.proc_util[gone]
    silent_us = max(0.0, now - dev.proc_util_at) * 1e6  # since NVML last had a new sample
    out: dict[int, float] = {}
    for pid in pids:
        ts, util = dev.proc_util.get(pid, (0, 0.0))
        out[pid] = util if dev.proc_util_ts - ts + silent_us <= PROCESS_UTIL_HOLD_US else 0.0
    return out
