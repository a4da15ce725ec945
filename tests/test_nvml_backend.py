"""The NVML backend over many refreshes, in this process, on the fake library."""

from __future__ import annotations

from typing import Any

from gpubox.telemetry.nvml_backend import NvmlBackend, decode_clock_events
from tests.fake_nvml import scenarios


class CountingNvml:
    """Wraps the pynvml module and counts calls by function name."""

    def __init__(self, module: Any) -> None:
        self._m = module
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._m, name)
        if name.startswith("nvml") and callable(value):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] = self.calls.get(name, 0) + 1
                return value(*args, **kwargs)

            return counted
        return value


def test_lost_gpu_does_not_stop_the_sampler(nvml: Any) -> None:
    box = scenarios.lost_gpu(processes=4)
    backend = NvmlBackend(nvml(box), clock=lambda: 1000.0)
    snaps = [backend.sample() for _ in range(5)]
    assert [s.gpus[1].lost for s in snaps] == [False, False, True, True, True]
    for s in snaps:
        assert s.gpus[0].lost is False and s.gpus[0].gpu_busy == box.gpus[0].gpu_util
        assert len(s.gpus) == 2
    assert {p.gpu_index for p in snaps[-1].processes} == {0}
    backend.close()


def test_first_refresh_warms_up_then_rates_come_from_the_previous_one(nvml: Any) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    backend = NvmlBackend(nvml(box), clock=lambda: 1000.0)
    first = backend.sample().gpus[0]
    assert first.sm_active is None and first.reasons["sm_active"] == "warming_up"
    assert first.pcie_rx_Bps is None and first.reasons["pcie_rx_Bps"] == "warming_up"
    for _ in range(3):
        g = backend.sample().gpus[0]
        assert g.sm_active == box.gpus[0].sm_active and g.pcie_rx_Bps == box.gpus[0].pcie_rx_bps
    backend.close()


def test_unsupported_calls_are_not_repeated_every_refresh(nvml: Any) -> None:
    box = scenarios.consumer(processes=1)
    counting = CountingNvml(nvml(box))
    backend = NvmlBackend(counting, clock=lambda: 1000.0)  # type: ignore[arg-type]
    for _ in range(5):
        backend.sample()
    assert counting.calls.get("nvmlGpmSampleGet", 0) == 0  # GPM query said unsupported
    assert counting.calls["nvmlDeviceGetFieldValues"] == 1
    assert counting.calls["nvmlDeviceGetPcieThroughput"] == 1
    assert counting.calls["nvmlDeviceGetUtilizationRates"] == 5
    backend.close()


def test_gpm_samples_are_freed_on_close(nvml: Any) -> None:
    box = scenarios.hopper(gpus=2, processes=0)
    counting = CountingNvml(nvml(box))
    backend = NvmlBackend(counting, clock=lambda: 1000.0)  # type: ignore[arg-type]
    backend.sample()
    backend.sample()
    backend.close()
    assert counting.calls["nvmlGpmSampleAlloc"] == counting.calls["nvmlGpmSampleFree"] == 4
    assert counting.calls["nvmlShutdown"] == 1


def test_clock_event_names() -> None:
    assert decode_clock_events(0) == ()
    assert decode_clock_events(0x4 | 0x20) == ("sw_power_cap", "sw_thermal_slowdown")


class FailingOnce(CountingNvml):
    """Raises NVML's 'unknown error' once, on the n-th call of one function with these arguments' count."""

    def __init__(self, module: Any, name: str, nargs: int, at: int) -> None:
        super().__init__(module)
        self._name, self._nargs, self._at = name, nargs, at

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        if name != self._name:
            return value

        def failing(*args: Any) -> Any:
            if len(args) == self._nargs:
                self._at -= 1
                if self._at == 0:
                    raise self._m.NVMLError(self._m.NVML_ERROR_UNKNOWN)
            return value(*args)

        return failing


def test_a_passing_error_of_the_v2_memory_call_does_not_switch_to_the_older_figure(nvml: Any) -> None:
    # The older call counts the driver's reserve too: once v2 has answered, a passing failure
    # must not make every later refresh read hundreds of MiB more than before.
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].memory_used, box.gpus[0].memory_reserved = 20_000 * 2**20, 512 * 2**20
    module = FailingOnce(nvml(box), "nvmlDeviceGetMemoryInfo", nargs=2, at=2)
    backend = NvmlBackend(module, clock=lambda: 1000.0)  # type: ignore[arg-type]
    used = [backend.sample().gpus[0].mem_used_bytes for _ in range(4)]
    backend.close()
    want = 20_000 * 2**20 - 512 * 2**20
    assert used[0] == used[3] == want
    assert used[1] is None  # the failed refresh: no figure, never the other kind


def test_a_passing_error_of_the_pcie_counters_does_not_switch_to_the_blocking_call(nvml: Any) -> None:
    # nvmlDeviceGetPcieThroughput blocks ~20 ms per direction per GPU: one failed counter read
    # must cost one refresh's figure, not that delay on every refresh from then on.
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].gpm = False
    module = FailingOnce(nvml(box), "nvmlDeviceGetFieldValues", nargs=2, at=3)
    backend = NvmlBackend(module, clock=lambda: 1000.0)  # type: ignore[arg-type]
    gpus = [backend.sample().gpus[0] for _ in range(5)]
    backend.close()
    assert gpus[2].pcie_rx_Bps is None and gpus[2].reasons["pcie_rx_Bps"] == "error"
    assert [g.pcie_source for g in gpus] == ["counters"] * 5
    assert [g.pcie_rx_Bps for g in gpus[3:]] == [box.gpus[0].pcie_rx_bps] * 2
    assert module.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0


def test_a_gpm_figure_that_is_not_a_number_is_unknown_with_a_reason(nvml: Any) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].sm_occupancy = float("nan")
    backend = NvmlBackend(nvml(box), clock=lambda: 1000.0)
    backend.sample()
    snap = backend.sample()
    backend.close()
    gpu = snap.gpus[0]
    assert gpu.sm_occupancy is None and gpu.reasons["sm_occupancy"] == "error"
    assert any("sm_occupancy" in e for e in snap.errors)
    assert gpu.sm_active == box.gpus[0].sm_active  # the other GPM figures stand


def test_counters_that_take_over_from_gpm_start_from_a_new_baseline() -> None:
    """Counters read once while GPM warmed up, hours ago, must not give the first rate after GPM
    stops giving PCIe: that would be an average over those hours, not the traffic of now."""
    from types import SimpleNamespace

    import pynvml

    from gpubox.telemetry.nvml_device import Caller, Device
    from gpubox.telemetry.nvml_rates import read_pcie

    counters = {"now_us": 0, "tx": 0, "rx": 0}

    def field_values(handle: object, fields: list[int]) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(nvmlReturn=0, timestamp=counters["now_us"], value=SimpleNamespace(ullVal=counters[k]))
            for k in ("tx", "rx")
        ]

    stub = SimpleNamespace(
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES=197,
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES=198,
        nvmlDeviceGetFieldValues=field_values,
        NVMLError=pynvml.NVMLError,
        NVMLLibraryMismatchError=pynvml.NVMLLibraryMismatchError,
    )
    call = Caller(stub)  # type: ignore[arg-type]
    dev = Device(handle=object(), index=0, uuid="GPU-0", name="GPU", pci_bus_id=None, gpm_supported=True)
    reasons: dict[str, str] = {}
    assert read_pcie(call, dev, {}, reasons) == (None, None)  # GPM warming up: the counters read too
    dev.gpm_filled = 2
    assert read_pcie(call, dev, {20: 1.0, 21: 2.0}, {}) == (1.0 * 2**20, 2.0 * 2**20)  # GPM, for hours
    # Three hours of idle link, then 10 s at 1 GB/s each way, and GPM stops giving PCIe.
    counters.update(now_us=3 * 3600 * 10**6, tx=0, rx=0)
    reasons = {}
    first = read_pcie(call, dev, {}, reasons)
    assert first == (None, None) and reasons["pcie_tx_Bps"] == "warming_up"
    counters.update(now_us=counters["now_us"] + 10 * 10**6, tx=10 * 10**9, rx=10 * 10**9)
    assert read_pcie(call, dev, {}, {}) == (1e9, 1e9)


def test_a_process_list_that_cannot_be_read_is_unknown_with_a_reason(nvml: Any) -> None:
    """An empty list from a call that failed must not pass for an idle GPU."""
    box = scenarios.hopper(gpus=2, processes=4)
    box.gpus[1].unsupported = ["nvmlDeviceGetComputeRunningProcesses_v3"]
    backend = NvmlBackend(nvml(box), clock=lambda: 1000.0)
    snap = backend.sample()
    backend.close()
    assert snap.gpus[1].reasons["processes"] == "not_supported"
    assert "processes" not in snap.gpus[0].reasons
    assert {p.gpu_index for p in snap.processes} == {0}
