"""Why a figure is missing, in a few words for a narrow panel."""

from __future__ import annotations

from gpubox.telemetry.model import Reason

_SHORT = {
    Reason.NOT_SUPPORTED.value: "n/a",
    Reason.NO_PERMISSION.value: "no permission",
    Reason.GPU_LOST.value: "GPU lost",
    Reason.FUNCTION_MISSING.value: "driver too old",
    Reason.LIBRARY_MISMATCH.value: "NVML mismatch",
    Reason.WARMING_UP.value: "warming up",
    Reason.NO_PROCESS.value: "process hidden",
    Reason.NOT_MEASURED.value: "not measured",
    Reason.PROBE_UNREADABLE.value: "probe file unreadable",
    Reason.NO_BATCHES_YET.value: "no batch yet",
    Reason.ERROR.value: "error",
}

# GPM figures are the ones a reader most needs explained: they exist on Hopper and newer only.
_GPM_FIELDS = frozenset({"sm_active", "sm_occupancy"})


def why_missing(reasons: dict[str, str], field: str) -> str:
    reason = reasons.get(field)
    if reason is None:
        return "n/a"
    if reason == Reason.NOT_SUPPORTED.value and field in _GPM_FIELDS:
        return "n/a: no GPM"
    return _SHORT.get(reason, reason)
