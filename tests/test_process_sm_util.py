"""Per-process SM use from NVML's process-utilization samples, over many refreshes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpubox.telemetry.nvml_device import Caller, Device
from gpubox.telemetry.nvml_rates import PROCESS_UTIL_HOLD_US, read_process_util


class _Nvml:
    """Just enough of pynvml for read_process_util: a queue of answers."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    NVMLLibraryMismatchError = RuntimeError

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> Any:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [SimpleNamespace(pid=pid, timeStamp=ts, smUtil=util) for pid, ts, util in answer]


def test_a_process_that_stops_running_kernels_drops_to_zero() -> None:
    # NVML has no sample newer than the last one seen once the GPU's processes stop running
    # kernels (a job stuck on its input, or between epochs): the last figure must not stand forever.
    nvml = _Nvml([[(10, 50_000_000, 80)]] + [nvml_not_found() for _ in range(3)])
    call = Caller(nvml)  # type: ignore[arg-type]
    dev = Device("h", 0, "GPU-x", "x", None)
    reasons: dict[str, str] = {}
    hold_s = PROCESS_UTIL_HOLD_US / 1e6
    assert read_process_util(call, dev, {10}, reasons, now=100.0) == {10: 80.0}
    assert read_process_util(call, dev, {10}, reasons, now=100.0 + hold_s / 2) == {10: 80.0}  # held briefly
    assert read_process_util(call, dev, {10}, reasons, now=100.0 + hold_s + 1) == {10: 0.0}
    assert read_process_util(call, dev, {10}, reasons, now=100.0 + 10 * hold_s) == {10: 0.0}
    assert reasons == {}


def test_a_fresh_sample_after_silence_counts_again() -> None:
    nvml = _Nvml([[(10, 1_000_000, 60)], nvml_not_found(), [(10, 90_000_000, 40)]])
    call = Caller(nvml)  # type: ignore[arg-type]
    dev = Device("h", 0, "GPU-x", "x", None)
    reasons: dict[str, str] = {}
    assert read_process_util(call, dev, {10}, reasons, now=0.0) == {10: 60.0}
    assert read_process_util(call, dev, {10}, reasons, now=60.0) == {10: 0.0}
    assert read_process_util(call, dev, {10}, reasons, now=61.0) == {10: 40.0}


def nvml_not_found() -> Exception:
    return _Nvml.NVMLError_NotFound()


def test_process_sm_use_is_held_briefly_then_reads_zero() -> None:
    nvml = _Nvml([[(10, 1_000_000, 70)], nvml_not_found(), [(11, 2_500_000, 5)], [(11, 9_000_000, 6)]])
    call = Caller(nvml)  # type: ignore[arg-type]
    dev = Device("h", 0, "GPU-x", "x", None)
    reasons: dict[str, str] = {}
    assert read_process_util(call, dev, {10, 11}, reasons, now=0.0) == {10: 70.0, 11: 0.0}
    # No new sample at all: the last ones stand.
    assert read_process_util(call, dev, {10, 11}, reasons, now=0.0) == {10: 70.0, 11: 0.0}
    # A newer sample for another pid, within the hold: 10 keeps its figure.
    assert read_process_util(call, dev, {10, 11}, reasons, now=0.0) == {10: 70.0, 11: 5.0}
    # Past the hold, 10 ran no kernel lately.
    assert PROCESS_UTIL_HOLD_US < 9_000_000 - 1_000_000
    assert read_process_util(call, dev, {10, 11}, reasons, now=0.0) == {10: 0.0, 11: 6.0}
    assert reasons == {}
