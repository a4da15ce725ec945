"""Turning NVML errors into the reason a figure is missing."""

from __future__ import annotations

from types import ModuleType

from gpubox.telemetry.model import Reason

# Reasons that will not change while the process runs: the call is not made again.
PERMANENT = frozenset({Reason.NOT_SUPPORTED, Reason.FUNCTION_MISSING, Reason.LIBRARY_MISMATCH})

_BY_NAME = {
    "NVMLError_NotSupported": Reason.NOT_SUPPORTED,
    "NVMLError_NoPermission": Reason.NO_PERMISSION,
    "NVMLError_GpuIsLost": Reason.GPU_LOST,
    "NVMLError_ResetRequired": Reason.GPU_LOST,
    "NVMLError_FunctionNotFound": Reason.FUNCTION_MISSING,
    "NVMLError_ArgumentVersionMismatch": Reason.LIBRARY_MISMATCH,
    "NVMLError_LibRmVersionMismatch": Reason.LIBRARY_MISMATCH,
    "NVMLLibraryMismatchError": Reason.LIBRARY_MISMATCH,
}


def reason_for(exc: BaseException) -> Reason:
    for cls in type(exc).__mro__:
        found = _BY_NAME.get(cls.__name__)
        if found is not None:
            return found
    return Reason.ERROR


def nvml_errors(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    """The exception classes an NVML call may raise that mean "no figure", not "bug"."""
    return (nvml.NVMLError, nvml.NVMLLibraryMismatchError)
