"""The fake NVML library, driven through the real pynvml: every scenario behaves as specified."""

from __future__ import annotations

import ctypes
import itertools
import json
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.fake_nvml import build, scenarios
from tests.fake_nvml.build import build_fake_nvml, fake_nvml_env, library_path
from tests.fake_nvml.scenarios import MIB, FakeBox, FakeGpu, FakeProcess

VIRTUAL_EPOCH_US = 1_700_000_000_000_000
NOT_AVAILABLE = 0xFFFFFFFF

OLD_DRIVER_MISSING = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetFieldValues",
)
BACKEND_FUNCTIONS = (
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
)


# -- harness --------------------------------------------------------------------------------


def run_python(tmp_path: Path, box: FakeBox, code: str, timeout: float = 120) -> Any:
    """Run `code` in a child process that finds the fake through LD_LIBRARY_PATH, as pynvml's
    CDLL("libnvidia-ml.so.1") does on a real box; the code prints one JSON line last."""
    path = box.write(tmp_path / "scenario.txt")
    env = fake_nvml_env(path, box.library_variant)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpm_metrics(n: Any, handle: Any, metric_ids: list[int]) -> list[tuple[int, int, float]]:
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
    try:
        n.nvmlGpmSampleGet(handle, s1)
        n.nvmlGpmSampleGet(handle, s2)
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.sample1, req.sample2 = s1, s2
        req.numMetrics = len(metric_ids)
        for i, metric in enumerate(metric_ids):
            req.metrics[i].metricId = metric
        n.nvmlGpmMetricsGet(req)
        return [
            (req.metrics[i].metricId, req.metrics[i].nvmlReturn, req.metrics[i].value) for i in range(len(metric_ids))
        ]
    finally:
        n.nvmlGpmSampleFree(s1)
        n.nvmlGpmSampleFree(s2)


# -- the library itself ---------------------------------------------------------------------


def test_struct_layouts_match_the_c_side() -> None:
    # fake_nvml.c asserts the same sizes; a pynvml that changed a layout fails here first.
    assert ctypes.sizeof(pynvml.nvmlPciInfo_t) == 68
    assert ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) == 40 == pynvml.nvmlMemory_v2 & 0xFFFFFF
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t) == 24
    assert ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == 40
    assert ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlGpmMetric_t) == 40
    assert pynvml.c_nvmlGpmMetricsGet_t.metrics.offset == 24
    assert pynvml.NVML_GPM_METRIC_MAX == 477


def test_build_is_reused_and_exports_the_backend_functions() -> None:
    out = build_fake_nvml()
    assert out == build_fake_nvml()
    lib = ctypes.CDLL(str(out / "libnvidia-ml.so.1"))
    missing = [name for name in BACKEND_FUNCTIONS if not hasattr(lib, name)]
    assert missing == []
    assert not hasattr(lib, "load_scenario")  # helpers stay private


def test_old_driver_build_lacks_exactly_the_newer_functions() -> None:
    lib = ctypes.CDLL(str(library_path("old_driver")))
    for name in BACKEND_FUNCTIONS:
        assert hasattr(lib, name) == (name not in OLD_DRIVER_MISSING), name


def test_concurrent_builds_all_get_a_complete_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "build")
    results: list[Path] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(build_fake_nvml("full"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(results)) == 1
    assert [p.name for p in results[0].iterdir()] == ["libnvidia-ml.so.1"]  # no temp files left
    assert hasattr(ctypes.CDLL(str(results[0] / "libnvidia-ml.so.1")), "nvmlInit_v2")


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fake NVML variant"):
        build_fake_nvml("newest")


# -- hopper8: values round-trip exactly -----------------------------------------------------


def test_hopper8_system_and_identity(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8()
    n = nvml(box)
    assert n.nvmlSystemGetDriverVersion() == "550.54.15"
    assert n.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert n.nvmlSystemGetCudaDriverVersion() == 12040
    assert n.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert n.nvmlDeviceGetCount() == 8
    for i, gpu in enumerate(box.gpus):
        h = n.nvmlDeviceGetHandleByIndex(i)
        assert n.nvmlDeviceGetIndex(h) == i
        assert n.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert n.nvmlDeviceGetUUID(h) == gpu.uuid
        pci = n.nvmlDeviceGetPciInfo(h)
        bus = int(scenarios.H100_BUS_IDS[i], 16)
        assert (pci.busId, pci.domain, pci.bus, pci.device) == (gpu.pci_bus_id, 0, bus, 0)
        assert pci.busIdLegacy == f"0000:{bus:02X}:00.0"
        assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x233010DE, 0x16C110DE)
        assert n.nvmlDeviceGetArchitecture(h) == n.NVML_DEVICE_ARCH_HOPPER
        assert n.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert len({g.uuid for g in box.gpus}) == 8


def test_hopper8_figures(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8()
    n = nvml(box)
    for i, gpu in enumerate(box.gpus):
        h = n.nvmlDeviceGetHandleByIndex(i)
        util = n.nvmlDeviceGetUtilizationRates(h)
        assert (util.gpu, util.memory) == (60 + i, 30 + i)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        assert (mem.total, mem.used, mem.free) == (
            gpu.memory_total,
            gpu.memory_used,
            gpu.memory_total - gpu.memory_used,
        )
        mem2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
        assert (mem2.total, mem2.reserved, mem2.used) == (gpu.memory_total, 0, gpu.memory_used)
        assert n.nvmlDeviceGetPowerUsage(h) == 300_000 + 1_000 * i
        assert n.nvmlDeviceGetPowerManagementLimit(h) == 700_000
        assert n.nvmlDeviceGetEnforcedPowerLimit(h) == 690_000 - 1_000 * i
        assert n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU) == 40 + i
        assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == 1755 + 5 * i
        assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS) == 1755 + 5 * i
        assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM) == 2619
        assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_VIDEO) == 1545
        assert n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM) == 1980
        assert n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM) == 2619
        assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == gpu.clock_event_reasons
        assert n.nvmlDeviceGetCurrentClocksThrottleReasons(h) == gpu.clock_event_reasons
        link = (4, 8) if i == 7 else (5, 16)
        assert (n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h)) == link
        assert (n.nvmlDeviceGetMaxPcieLinkGeneration(h), n.nvmlDeviceGetMaxPcieLinkWidth(h)) == (5, 16)
        # KB/s, 1 KB = 1024 bytes
        assert n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) * 1024 == (1000 + 100 * i) * MIB
        assert n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) * 1024 == (2000 + 100 * i) * MIB
        assert n.nvmlDeviceGetMigMode(h) == [0, 0]
        assert n.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        assert n.nvmlDeviceIsMigDeviceHandle(h).value == 0
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetGpuInstanceId(h)
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetFanSpeed(h)  # passively cooled
    assert len({g.clock_event_reasons for g in box.gpus}) == 8


def test_hopper8_processes(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8()
    assert len(box.processes) == 40
    assert len({p.pid for p in box.processes}) == 40
    assert len({p.used_memory for p in box.processes}) == 40
    assert len({p.sm_util for p in box.processes}) == 40
    n = nvml(box)
    for i, gpu in enumerate(box.gpus):
        h = n.nvmlDeviceGetHandleByIndex(i)
        running = n.nvmlDeviceGetComputeRunningProcesses(h)
        assert [(p.pid, p.usedGpuMemory) for p in running] == [(p.pid, p.used_memory) for p in gpu.processes]
        assert {(p.gpuInstanceId, p.computeInstanceId) for p in running} == {(NOT_AVAILABLE, NOT_AVAILABLE)}
        assert n.nvmlDeviceGetGraphicsRunningProcesses(h) == []
        samples = n.nvmlDeviceGetProcessUtilization(h, 0)
        assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [
            (p.pid, p.sm_util, p.mem_util) for p in gpu.processes
        ]


def test_hopper8_scales_to_300_processes(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8(processes=300)
    n = nvml(box)
    pids = []
    for i in range(8):
        h = n.nvmlDeviceGetHandleByIndex(i)
        pids += [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        assert len(n.nvmlDeviceGetProcessUtilization(h, 0)) in (37, 38)
    assert sorted(pids) == sorted(p.pid for p in box.processes)
    assert len(set(pids)) == 300


def test_pcie_counters_give_the_exact_rate(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    fields = [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
    for i in (0, 5):
        h = n.nvmlDeviceGetHandleByIndex(i)
        reads = [n.nvmlDeviceGetFieldValues(h, fields) for _ in range(3)]
        for k, got in enumerate(reads, start=1):
            assert [v.nvmlReturn for v in got] == [0, 0]
            assert [v.timestamp for v in got] == [VIRTUAL_EPOCH_US + k * 1_000_000] * 2
            assert [v.valueType for v in got] == [n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG] * 2
        for a, b in itertools.pairwise(reads):
            seconds = (b[0].timestamp - a[0].timestamp) / 1e6
            assert (b[0].value.ullVal - a[0].value.ullVal) / seconds == (1000 + 100 * i) * MIB
            assert (b[1].value.ullVal - a[1].value.ullVal) / seconds == (2000 + 100 * i) * MIB
    # each device keeps its own clock: GPU 3 starts at its first virtual second
    h3 = n.nvmlDeviceGetHandleByIndex(3)
    assert n.nvmlDeviceGetFieldValues(h3, fields)[0].timestamp == VIRTUAL_EPOCH_US + 1_000_000


def test_unknown_field_is_not_supported_per_field(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    h = n.nvmlDeviceGetHandleByIndex(0)
    got = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_ECC_CURRENT, n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
    assert [v.nvmlReturn for v in got] == [n.NVML_ERROR_NOT_SUPPORTED, 0]
    nvlink = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert (nvlink[0].nvmlReturn, nvlink[0].value.uiVal) == (0, 18)


def test_gpm_metrics(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    for i in (0, 7):
        h = n.nvmlDeviceGetHandleByIndex(i)
        assert n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
        got = gpm_metrics(
            n,
            h,
            [
                n.NVML_GPM_METRIC_SM_UTIL,
                n.NVML_GPM_METRIC_SM_OCCUPANCY,
                n.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
                n.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
                n.NVML_GPM_METRIC_FP64_UTIL,
            ],
        )
        assert got == [
            (2, 0, 45.25 + i),
            (3, 0, 20.5 + i),
            (20, 0, 1000.0 + 100 * i),  # MiB/s
            (21, 0, 2000.0 + 100 * i),
            (11, n.NVML_ERROR_NOT_SUPPORTED, 0.0),
        ]


def test_gpm_needs_two_filled_samples_of_one_gpu_in_order(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()

    def metrics_get(a: Any, b: Any) -> None:
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.sample1, req.sample2 = a, b
        req.numMetrics = 1
        req.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
        n.nvmlGpmMetricsGet(req)

    n.nvmlGpmSampleGet(h0, s1)
    with pytest.raises(n.NVMLError_InvalidArgument):
        metrics_get(s1, s2)  # s2 never filled
    n.nvmlGpmSampleGet(h1, s2)
    with pytest.raises(n.NVMLError_InvalidArgument):
        metrics_get(s1, s2)  # two different GPUs
    n.nvmlGpmSampleGet(h0, s2)
    with pytest.raises(n.NVMLError_InvalidArgument):
        metrics_get(s2, s1)  # sample2 older than sample1
    metrics_get(s1, s2)
    n.nvmlGpmSampleFree(s1)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlGpmSampleFree(s1)
    n.nvmlGpmSampleFree(s2)


def test_process_utilization_timestamps(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8()
    n = nvml(box)
    h = n.nvmlDeviceGetHandleByIndex(2)
    first = n.nvmlDeviceGetProcessUtilization(h, 0)
    last_seen = max(s.timeStamp for s in first)
    second = n.nvmlDeviceGetProcessUtilization(h, last_seen)
    assert len(second) == 5
    assert all(s.timeStamp > last_seen for s in second)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetProcessUtilization(h, last_seen + 3_600_000_000)  # nothing newer than an hour ahead


def test_unsampled_processes_have_no_sample(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper(gpus=2, processes=4)
    for p in box.gpus[0].processes[:1] + box.gpus[1].processes:
        p.sampled = False
    n = nvml(box)
    samples = n.nvmlDeviceGetProcessUtilization(n.nvmlDeviceGetHandleByIndex(0), 0)
    assert [s.pid for s in samples] == [box.gpus[0].processes[1].pid]
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetProcessUtilization(n.nvmlDeviceGetHandleByIndex(1), 0)


# -- the C calling conventions, straight through ctypes -------------------------------------


def test_two_call_patterns_and_bad_arguments(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper8()
    n = nvml(box)
    lib = n.nvmlLib
    h = n.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), None) == n.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 5
    small = (n.c_nvmlProcessInfo_v3_t * 2)()
    count.value = 2
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), small) == n.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 5
    count.value = 0
    assert lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, ctypes.byref(count), None) == n.NVML_SUCCESS
    assert count.value == 0
    count.value = 0
    assert lib.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == 7
    assert count.value == 5

    name = ctypes.create_string_buffer(8)
    assert lib.nvmlDeviceGetName(h, name, ctypes.c_uint(8)) == n.NVML_ERROR_INSUFFICIENT_SIZE
    version = ctypes.create_string_buffer(9)  # "550.54.15" needs 10 with its NUL
    assert lib.nvmlSystemGetDriverVersion(version, ctypes.c_uint(9)) == n.NVML_ERROR_INSUFFICIENT_SIZE

    bogus = ctypes.cast(ctypes.c_void_p(0x1234), n.c_nvmlDevice_t)
    for handle in (n.c_nvmlDevice_t(), bogus):
        with pytest.raises(n.NVMLError_InvalidArgument):
            n.nvmlDeviceGetName(handle)
        with pytest.raises(n.NVMLError_InvalidArgument):
            n.nvmlDeviceGetUtilizationRates(handle)
    assert lib.nvmlDeviceGetPowerUsage(h, None) == n.NVML_ERROR_INVALID_ARGUMENT
    assert lib.nvmlDeviceGetCount_v2(None) == n.NVML_ERROR_INVALID_ARGUMENT
    assert lib.nvmlDeviceGetFieldValues(h, ctypes.c_int32(0), (n.c_nvmlFieldValue_t * 1)()) == 2
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetTemperature(h, 1)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetClockInfo(h, 9)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetPcieThroughput(h, 2)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)  # not a MIG handle
    assert n.nvmlErrorString(n.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert n.nvmlErrorString(n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH) == "Argument version mismatch"


def test_versioned_struct_with_an_unknown_version_is_refused(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    h = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError_ArgumentVersionMismatch):
        n.nvmlDeviceGetMemoryInfo(h, version=(3 << 24) | 40)


def test_uninitialised_and_refcounted_init(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8(), init=False)
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlShutdown()
    assert n.nvmlLib.nvmlInit_v2() == 0
    n.nvmlInit()
    n.nvmlShutdown()
    assert n.nvmlDeviceGetCount() == 8  # one init still holds
    n.nvmlShutdown()
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()


def test_scenario_is_read_again_at_each_first_init(nvml: Callable[..., Any], tmp_path: Path) -> None:
    n = nvml(scenarios.hopper8())
    assert n.nvmlDeviceGetCount() == 8
    n.nvmlShutdown()
    scenarios.consumer().write(tmp_path / "scenario.txt")
    n.nvmlInit()
    assert n.nvmlDeviceGetCount() == 1
    assert n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA GeForce RTX 4090"


def test_init_errors(nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    n = nvml(scenarios.hopper8(), init=False)
    monkeypatch.delenv("FAKE_NVML_SCENARIO")
    with pytest.raises(n.NVMLError_DriverNotLoaded):
        n.nvmlInit()
    for name, exc in (
        ("no_permission", n.NVMLError_NoPermission),
        ("driver_not_loaded", n.NVMLError_DriverNotLoaded),
        ("lib_rm_version_mismatch", n.NVMLError_LibRmVersionMismatch),
    ):
        box = scenarios.hopper8()
        box.init_error = name
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(box.write(tmp_path / f"{name}.txt")))
        with pytest.raises(exc):
            n.nvmlInit()


def test_a_bad_scenario_fails_init_with_a_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("[gpu]\nname=x\ntemprature=40\n")
    env = fake_nvml_env(bad)
    code = "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError_Unknown:\n    print('unknown')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.strip() == "unknown"
    assert "line 3: unknown key 'temprature'" in proc.stderr


def test_unsupported_functions(nvml: Callable[..., Any]) -> None:
    box = scenarios.hopper(gpus=2, processes=2)
    box.unsupported = ["nvmlDeviceGetPowerUsage", "nvmlSystemGetNVMLVersion"]
    box.gpus[1].unsupported = ["nvmlDeviceGetTemperature"]
    n = nvml(box)
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    for h in (h0, h1):
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlSystemGetNVMLVersion()
    assert n.nvmlDeviceGetTemperature(h0, 0) == 40
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetTemperature(h1, 0)
    assert n.nvmlDeviceGetEnforcedPowerLimit(h0) == 690_000  # a prefix of another name is no match


def test_threads_can_share_the_library(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.hopper8())
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
            for _ in range(200):
                n.nvmlDeviceGetUtilizationRates(h)
                n.nvmlDeviceGetComputeRunningProcesses(h)
                n.nvmlDeviceGetProcessUtilization(h, 0)
                n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(8):
        # 200 field reads per device, each one virtual second
        got = n.nvmlDeviceGetFieldValues(n.nvmlDeviceGetHandleByIndex(i), [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
        assert got[0].timestamp == VIRTUAL_EPOCH_US + 201 * 1_000_000


# -- the other named scenarios --------------------------------------------------------------


def test_consumer(nvml: Callable[..., Any]) -> None:
    box = scenarios.consumer()
    n = nvml(box)
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetName(h) == "NVIDIA GeForce RTX 4090"
    assert n.nvmlDeviceGetArchitecture(h) == n.NVML_DEVICE_ARCH_ADA
    assert n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    sample = n.nvmlGpmSampleAlloc()
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlGpmSampleGet(h, sample)
    n.nvmlGpmSampleFree(sample)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)
    got = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
    assert [v.nvmlReturn for v in got] == [n.NVML_ERROR_NOT_SUPPORTED] * 2
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetMigMode(h)
    assert n.nvmlDeviceGetFanSpeed(h) == 45
    assert n.nvmlDeviceGetUtilizationRates(h).gpu == 87
    graphics = n.nvmlDeviceGetGraphicsRunningProcesses(h)
    compute = n.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(1327, 312 * MIB)]
    assert [(p.pid, p.usedGpuMemory) for p in compute] == [(5201, 7000 * MIB)]
    assert {s.pid: s.smUtil for s in n.nvmlDeviceGetProcessUtilization(h, 0)} == {1327: 3, 5201: 81}


def test_no_permission(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.no_permission())
    h = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError_NoPermission):
        n.nvmlDeviceGetProcessUtilization(h, 0)
    assert len(n.nvmlDeviceGetComputeRunningProcesses(h)) == 3
    assert n.nvmlDeviceGetUtilizationRates(h).gpu == 60


def test_lost_gpu(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.lost_gpu())
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetUtilizationRates(h1).gpu == 61
    assert n.nvmlDeviceGetUtilizationRates(h1).gpu == 61
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetUtilizationRates(h1)
    calls: list[Callable[[], Any]] = [
        lambda: n.nvmlDeviceGetName(h1),
        lambda: n.nvmlDeviceGetMemoryInfo(h1),
        lambda: n.nvmlDeviceGetComputeRunningProcesses(h1),
        lambda: n.nvmlDeviceGetFieldValues(h1, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]),
        lambda: n.nvmlGpmSampleGet(h1, n.nvmlGpmSampleAlloc()),
        lambda: n.nvmlDeviceGetUtilizationRates(h1),
        lambda: n.nvmlDeviceGetHandleByIndex(1),
    ]
    for call in calls:
        with pytest.raises(n.NVMLError_GpuIsLost):
            call()
    for _ in range(5):
        assert n.nvmlDeviceGetUtilizationRates(h0).gpu == 60  # the other GPU carries on
    n.nvmlShutdown()
    n.nvmlInit()  # a new init reads the scenario again: the countdown restarts
    assert n.nvmlDeviceGetUtilizationRates(n.nvmlDeviceGetHandleByIndex(1)).gpu == 61


def test_old_driver_in_a_child_process(tmp_path: Path) -> None:
    box = scenarios.old_driver()
    assert box.library_variant == "old_driver"
    got = run_python(
        tmp_path,
        box,
        """
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(1)
        out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
               "name": n.nvmlDeviceGetName(h),
               "throttle": n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
               "tx": n.nvmlDeviceGetPcieThroughput(h, 0), "missing": {}}
        calls = {
            "events": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
            "fields": lambda: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]),
            "gpm_support": lambda: n.nvmlGpmQueryDeviceSupport(h),
            "gpm_alloc": n.nvmlGpmSampleAlloc,
            "gpm_metrics": lambda: n.nvmlGpmMetricsGet(n.c_nvmlGpmMetricsGet_t()),
        }
        for key, call in calls.items():
            try:
                call()
                out["missing"][key] = "no error"
            except n.NVMLError as exc:
                out["missing"][key] = type(exc).__name__
        print(json.dumps(out))
        """,
    )
    assert got["driver"] == "515.105.01"
    assert got["cuda"] == 11070
    assert got["name"] == "NVIDIA A100-SXM4-80GB"
    assert got["throttle"] == scenarios.SW_POWER_CAP
    assert got["tx"] * 1024 == 510 * MIB
    assert got["missing"] == dict.fromkeys(
        ("events", "fields", "gpm_support", "gpm_alloc", "gpm_metrics"), "NVMLError_FunctionNotFound"
    )


def test_version_mismatch(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.version_mismatch())
    h = n.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(n.NVMLError_ArgumentVersionMismatch):
        n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    with pytest.raises(n.NVMLError_ArgumentVersionMismatch):
        n.nvmlGpmQueryDeviceSupport(h)
    with pytest.raises(n.NVMLError_ArgumentVersionMismatch):
        gpm_metrics(n, h, [n.NVML_GPM_METRIC_SM_UTIL])
    # calls without a versioned struct are unaffected
    assert n.nvmlDeviceGetMemoryInfo(h).total == scenarios.H100_MEMORY
    assert len(n.nvmlDeviceGetComputeRunningProcesses(h)) == 2


def test_mig(nvml: Callable[..., Any]) -> None:
    box = scenarios.mig()
    n = nvml(box)
    assert n.nvmlDeviceGetCount() == 1
    parent = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert n.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    migs = [n.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot) for slot in range(2)]
    for slot in range(2, 7):
        with pytest.raises(n.NVMLError_NotFound):
            n.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
    parent_addr = ctypes.cast(parent, ctypes.c_void_p).value
    for handle, spec in zip(migs, box.gpus[0].migs, strict=True):
        assert n.nvmlDeviceIsMigDeviceHandle(handle).value == 1
        assert n.nvmlDeviceGetGpuInstanceId(handle) == spec.gpu_instance_id
        assert n.nvmlDeviceGetComputeInstanceId(handle) == 0
        assert n.nvmlDeviceGetUUID(handle) == spec.uuid
        assert n.nvmlDeviceGetName(handle) == spec.name
        mem = n.nvmlDeviceGetMemoryInfo(handle)
        assert (mem.total, mem.used) == (spec.memory_total, spec.memory_used)
        back = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        assert ctypes.cast(back, ctypes.c_void_p).value == parent_addr
        procs = n.nvmlDeviceGetComputeRunningProcesses(handle)
        expected = [p for p in box.processes if p.gpu_instance_id == spec.gpu_instance_id]
        assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
            (p.pid, p.used_memory, spec.gpu_instance_id, 0) for p in expected
        ]
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetUtilizationRates(handle)
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetProcessUtilization(handle, 0)
        with pytest.raises(n.NVMLError_InvalidArgument):
            n.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert [n.nvmlDeviceGetGpuInstanceId(h) for h in migs] == [1, 5]
    assert len(n.nvmlDeviceGetComputeRunningProcesses(parent)) == 4
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetUtilizationRates(parent)  # no whole-GPU busy figure in MIG mode
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetGpuInstanceId(parent)
    assert n.nvmlDeviceGetPowerUsage(parent) == 300_000


def test_with_pids_replaces_pids_in_order() -> None:
    box = scenarios.hopper(gpus=2, processes=4)
    out = scenarios.with_pids(box, [101, 102, 103, 104, 105])
    assert [p.pid for p in out.processes] == [101, 102, 103, 104]
    assert [p.used_memory for p in out.processes] == [p.used_memory for p in box.processes]
    assert [p.pid - scenarios.NO_HOST_PID for p in box.processes] == [
        4000,
        4014,
        4007,
        4021,
    ]  # the original is untouched
    with pytest.raises(ValueError, match="4 processes but only 3 pids"):
        scenarios.with_pids(box, [1, 2, 3])


def test_scenario_file_round_trips_custom_boxes(nvml: Callable[..., Any]) -> None:
    gpu = FakeGpu(
        name="NVIDIA L4",
        uuid="GPU-l4",
        architecture="ada",
        gpm=False,
        memory_total=23034 * MIB,
        memory_used=1000 * MIB,
        memory_reserved=300 * MIB,
        processes=[FakeProcess(pid=77, type="both", used_memory=500 * MIB, sm_util=12)],
    )
    n = nvml(FakeBox(gpus=[gpu], driver_version="560.28.03"))
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlSystemGetDriverVersion() == "560.28.03"
    mem2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    assert (mem2.reserved, mem2.used, mem2.free) == (300 * MIB, 700 * MIB, 22034 * MIB)
    assert [p.pid for p in n.nvmlDeviceGetGraphicsRunningProcesses(h)] == [77]
    assert [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)] == [77]


def test_every_named_scenario_starts(nvml: Callable[..., Any]) -> None:
    for name, factory in scenarios.SCENARIOS.items():
        box = factory()
        n = nvml(box)
        assert n.nvmlDeviceGetCount() == len(box.gpus), name
        n.nvmlShutdown()


def test_real_loader_path_through_ld_library_path(tmp_path: Path) -> None:
    got = run_python(
        tmp_path,
        scenarios.hopper8(),
        """
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(7)
        print(json.dumps([n.nvmlDeviceGetCount(), n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetTemperature(h, 0)]))
        """,
    )
    assert got == [8, scenarios.hopper8().gpus[7].uuid, 47]


# -- nvitop against the fake ----------------------------------------------------------------

nvitop_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("nvitop") is None, reason="nvitop is not installed in this environment"
)


@nvitop_missing
def test_nvitop_api_on_hopper8(tmp_path: Path) -> None:
    box = scenarios.hopper8()
    got = run_python(
        tmp_path,
        box,
        """
        import json
        from nvitop import Device, GpuProcess
        devices = Device.all()
        out = {"devices": [], "snapshots": []}
        procs = []
        for d in devices:
            out["devices"].append([d.index, d.name(), d.uuid(), d.memory_used(), d.gpu_utilization(),
                                   d.temperature(), d.power_usage(), d.pcie_tx_throughput()])
            procs.extend(d.processes().values())
        for s in GpuProcess.take_snapshots(procs, failsafe=True):
            out["snapshots"].append([s.pid, s.device.index, s.gpu_memory, s.gpu_sm_utilization])
        print(json.dumps(out))
        """,
    )
    assert got["devices"] == [
        [i, g.name, g.uuid, g.memory_used, g.gpu_util, g.temperature, g.power_mw, g.pcie_tx_bps // 1024]
        for i, g in enumerate(box.gpus)
    ]
    expected = sorted([p.pid, i, p.used_memory, p.sm_util] for i, g in enumerate(box.gpus) for p in g.processes)
    assert sorted(got["snapshots"]) == expected


@nvitop_missing
@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_nvitop_once_runs_on_every_scenario(tmp_path: Path, name: str) -> None:
    box = scenarios.SCENARIOS[name]()
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"), box.library_variant)
    env.update(COLUMNS="160", LINES="60")
    code = "import sys\nfrom nvitop.cli import main\nsys.argv = ['nvitop', '--once']\nsys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"Driver Version: {box.driver_version}" in proc.stdout
    for p in box.processes:
        assert f" {p.pid} " in proc.stdout


@nvitop_missing
@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` is needed for a pseudo-terminal")
def test_nvitop_live_monitor_refreshes_without_crashing(tmp_path: Path) -> None:
    box = scenarios.hopper8()
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"))
    env.update(TERM="xterm-256color")
    nvitop = f"{sys.executable} -m nvitop -m full --interval 0.25"
    proc = subprocess.run(
        ["timeout", "-s", "INT", "4", "script", "-qec", f"stty cols 200 rows 80; {nvitop}", "/dev/null"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    screen = proc.stdout.decode(errors="replace")
    assert "Traceback" not in screen
    assert "H100 80GB HBM3" in screen
    assert str(box.processes[0].pid) in screen  # the top of the process list


# -- what the doctor reads: health figures, sequences, missing functions --------------------

DOCTOR_FUNCTIONS = (
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetPcieReplayCounter",
)


@pytest.mark.parametrize("variant", ["full", "old_driver"])
def test_both_builds_export_what_the_doctor_reads(variant: str) -> None:
    lib = ctypes.CDLL(str(library_path(variant)))
    assert [name for name in DOCTOR_FUNCTIONS if not hasattr(lib, name)] == []


def ecc_counts(n: Any, h: Any) -> dict[tuple[str, str], int]:
    kinds = {"corrected": n.NVML_MEMORY_ERROR_TYPE_CORRECTED, "uncorrected": n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
    counters = {"volatile": n.NVML_VOLATILE_ECC, "aggregate": n.NVML_AGGREGATE_ECC}
    return {
        (kind, counter): n.nvmlDeviceGetTotalEccErrors(h, k, c)
        for kind, k in kinds.items()
        for counter, c in counters.items()
    }


def test_health_figures_round_trip(nvml: Callable[..., Any]) -> None:
    gpu = FakeGpu(
        ecc_mode=True,
        ecc_mode_pending=False,
        ecc_corrected_volatile=11,
        ecc_uncorrected_volatile=3,
        ecc_corrected_aggregate=1234,
        ecc_uncorrected_aggregate=5,
        remapped_rows_corrected=6,
        remapped_rows_uncorrected=2,
        remap_pending=True,
        remap_failure=False,
        power_limit_mw=400_000,
        power_default_limit_mw=700_000,
        power_min_limit_mw=200_000,
        power_max_limit_mw=750_000,
        temperature_shutdown=93,
        temperature_slowdown=88,
        temperature_mem_max=96,
        temperature_gpu_max=86,
        pcie_gen_max=4,
        pcie_gen_gpu_max=5,
        persistence_mode=0,
    )
    n = nvml(FakeBox(gpus=[gpu]))
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetPersistenceMode(h) == 0
    assert n.nvmlDeviceGetEccMode(h) == [1, 0]
    assert ecc_counts(n, h) == {
        ("corrected", "volatile"): 11,
        ("corrected", "aggregate"): 1234,
        ("uncorrected", "volatile"): 3,
        ("uncorrected", "aggregate"): 5,
    }
    assert n.nvmlDeviceGetRemappedRows(h) == (6, 2, 1, 0)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetRetiredPagesPendingStatus(h)  # Hopper remaps rows instead
    assert n.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    assert n.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    assert n.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700_000
    assert n.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 750_000]
    thresholds = {
        n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 93,
        n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 88,
        n.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 96,
        n.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 86,
    }
    for kind, value in thresholds.items():
        assert n.nvmlDeviceGetTemperatureThreshold(h, kind) == value
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_COUNT)
    assert n.nvmlDeviceGetMaxPcieLinkGeneration(h) == 4  # the GPU and the slot together
    assert n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5  # the GPU alone
    assert n.nvmlDeviceGetPcieReplayCounter(h) == 0


def test_health_defaults(nvml: Callable[..., Any]) -> None:
    n = nvml(FakeBox(gpus=[FakeGpu(ecc_errors=4, power_limit_mw=600_000)]))
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetEccMode(h) == [1, 1]
    assert set(ecc_counts(n, h).values()) == {4}  # the older key still sets every count
    assert n.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert n.nvmlDeviceGetPowerManagementDefaultLimit(h) == 600_000
    assert n.nvmlDeviceGetPowerManagementLimitConstraints(h) == [150_000, 600_000]
    assert n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
    assert n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == n.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5


def test_ecc_off_has_no_counts(nvml: Callable[..., Any]) -> None:
    n = nvml(FakeBox(gpus=[FakeGpu(ecc_mode=False, ecc_mode_pending=True)]))
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetEccMode(h) == [0, 1]
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)


def test_pages_are_retired_before_ampere_and_rows_remapped_after(nvml: Callable[..., Any]) -> None:
    box = FakeBox(gpus=[FakeGpu(architecture="volta", retired_pages_pending=True), FakeGpu(architecture="ampere")])
    n = nvml(box)
    volta, ampere = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetRetiredPagesPendingStatus(volta) == 1
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetRemappedRows(volta)
    assert n.nvmlDeviceGetRemappedRows(ampere) == (0, 0, 0, 0)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetRetiredPagesPendingStatus(ampere)


def test_sequences_advance_per_call_and_the_last_value_repeats(nvml: Callable[..., Any]) -> None:
    gpu = FakeGpu(
        pcie_gen=[1, 4, 5],
        pcie_width=[16, 8],
        clock_event_reasons=[scenarios.GPU_IDLE, scenarios.HW_SLOWDOWN, 0],
        pcie_replays=[0, 10],
        pcie_replays_per_call=3,
    )
    n = nvml(FakeBox(gpus=[gpu]))
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert [n.nvmlDeviceGetCurrPcieLinkGeneration(h) for _ in range(5)] == [1, 4, 5, 5, 5]
    assert [n.nvmlDeviceGetCurrPcieLinkWidth(h) for _ in range(3)] == [16, 8, 8]  # its own count
    # both names of the clock event call read one sequence
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == scenarios.GPU_IDLE
    assert n.nvmlDeviceGetCurrentClocksThrottleReasons(h) == scenarios.HW_SLOWDOWN
    assert [n.nvmlDeviceGetCurrentClocksEventReasons(h) for _ in range(2)] == [0, 0]
    # value for this call, plus 3 for each earlier call
    assert [n.nvmlDeviceGetPcieReplayCounter(h) for _ in range(4)] == [0, 13, 16, 19]
    assert n.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5  # plain figures do not move
    n.nvmlShutdown()
    n.nvmlInit()  # a new init starts every sequence again
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h) == 1
    assert n.nvmlDeviceGetPcieReplayCounter(h) == 0


def test_sequences_are_per_gpu(nvml: Callable[..., Any]) -> None:
    n = nvml(scenarios.downtrained_link())
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h0) == 1
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h1) == 1
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h0) == 5
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h1) == 4


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("pcie_gen=1,,5", "bad value list for pcie_gen"),
        ("pcie_gen=1;5", "bad value list for pcie_gen"),
        ("clock_event_reasons=0x1,-2", "bad value list for clock_event_reasons"),
        ("pcie_width=" + ",".join(["16"] * 65), "more than 64 values for pcie_width"),
    ],
)
def test_a_bad_sequence_fails_init_with_a_message(tmp_path: Path, line: str, message: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(f"[gpu]\nname=x\n{line}\n")
    code = "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError_Unknown:\n    print('unknown')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=fake_nvml_env(bad), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.stdout.strip() == "unknown"
    assert f"line 3: {message}" in proc.stderr


def test_missing_functions_answer_function_not_found(nvml: Callable[..., Any]) -> None:
    box = scenarios.healthy(2)
    box.missing = ["nvmlDeviceGetRemappedRows", "nvmlSystemGetCudaDriverVersion"]
    box.gpus[1].missing = ["nvmlDeviceGetGpuMaxPcieLinkGeneration"]
    box.gpus[1].unsupported = ["nvmlDeviceGetGpuMaxPcieLinkGeneration"]  # missing wins
    n = nvml(box)
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlSystemGetCudaDriverVersion()
    for h in (h0, h1):
        with pytest.raises(n.NVMLError_FunctionNotFound):
            n.nvmlDeviceGetRemappedRows(h)
    assert n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h0) == 5
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h1)
    assert n.nvmlSystemGetDriverVersion() == "550.54.15"


def first_then_loaded(n: Any, h: Any) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(gen, width, clock event reasons) at the first read, then at the second."""

    def read() -> tuple[int, int, int]:
        gen, width = n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h)
        return gen, width, n.nvmlDeviceGetCurrentClocksEventReasons(h)

    return read(), read()


def test_doctor_scenarios(nvml: Callable[..., Any]) -> None:
    rest = (1, 16, scenarios.GPU_IDLE)
    n = nvml(scenarios.healthy(2))
    for i in range(2):
        h = n.nvmlDeviceGetHandleByIndex(i)
        assert first_then_loaded(n, h) == (rest, (5, 16, 0))
        assert n.nvmlDeviceGetPersistenceMode(h) == 1
        assert n.nvmlDeviceGetEccMode(h) == [1, 1]
        assert n.nvmlDeviceGetPcieReplayCounter(h) == n.nvmlDeviceGetPcieReplayCounter(h) == 0
    n.nvmlShutdown()

    n = nvml(scenarios.downtrained_link())
    h = n.nvmlDeviceGetHandleByIndex(1)
    assert first_then_loaded(n, h) == ((1, 8, scenarios.GPU_IDLE), (4, 8, 0))
    assert [n.nvmlDeviceGetPcieReplayCounter(h) for _ in range(3)] == [7, 47, 87]
    n.nvmlShutdown()

    n = nvml(scenarios.slot_limited())
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert first_then_loaded(n, h) == (rest, (4, 16, 0))
    assert (n.nvmlDeviceGetMaxPcieLinkGeneration(h), n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)) == (4, 5)
    n.nvmlShutdown()

    n = nvml(scenarios.throttling())
    loaded = [first_then_loaded(n, n.nvmlDeviceGetHandleByIndex(i))[1][2] for i in range(3)]
    assert loaded == [
        scenarios.HW_SLOWDOWN | scenarios.HW_THERMAL_SLOWDOWN,
        scenarios.HW_POWER_BRAKE_SLOWDOWN,
        scenarios.SW_POWER_CAP,
    ]
    n.nvmlShutdown()

    n = nvml(scenarios.ecc_errors())
    h100, v100 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert ecc_counts(n, h100)[("uncorrected", "volatile")] == 2
    assert n.nvmlDeviceGetRemappedRows(h100) == (0, 1, 1, 0)
    assert ecc_counts(n, v100)[("corrected", "volatile")] == 1500
    assert n.nvmlDeviceGetRetiredPagesPendingStatus(v100) == 1
    n.nvmlShutdown()

    n = nvml(scenarios.persistence_off())
    assert [n.nvmlDeviceGetPersistenceMode(n.nvmlDeviceGetHandleByIndex(i)) for i in range(2)] == [0, 0]
    n.nvmlShutdown()

    n = nvml(scenarios.low_power_limit())
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert (n.nvmlDeviceGetEnforcedPowerLimit(h), n.nvmlDeviceGetPowerManagementDefaultLimit(h)) == (350_000, 700_000)
    n.nvmlShutdown()

    n = nvml(scenarios.hot_gpu())
    temps = [n.nvmlDeviceGetTemperature(n.nvmlDeviceGetHandleByIndex(i), 0) for i in range(2)]
    assert temps == [85, 90]
    assert n.nvmlDeviceGetTemperatureThreshold(n.nvmlDeviceGetHandleByIndex(0), 1) == 89
