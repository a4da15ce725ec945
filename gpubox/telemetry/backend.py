"""What a telemetry backend is: something that turns the box into a BoxSnapshot, on demand."""

from __future__ import annotations

from typing import Protocol

from gpubox.telemetry.model import BoxSnapshot, GpuId


class BackendUnavailable(Exception):
    """The backend cannot start at all (no driver, no NVML library): exit code 3."""


class TelemetryBackend(Protocol):
    name: str

    def gpus(self) -> tuple[GpuId, ...]:
        """The GPUs and MIG instances that sample() reads, as opened: no figure is read, so a
        `--gpu` choice is checked against them at once, before any sampling."""
        ...

    def sample(self) -> BoxSnapshot:
        """Take one snapshot. Rates are over the time since the previous call; the first call
        returns them as None with reason `warming_up`. Must not sleep to take two samples."""
        ...

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        """Signal a GPU process. `start_time` (from its snapshot) guards against a recycled pid:
        ProcessLookupError if the pid is gone or is another process now, PermissionError if
        it is not ours to signal."""
        ...

    def close(self) -> None: ...
