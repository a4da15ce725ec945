"""The box's GPUs as the queue sees them: index, UUID and memory, straight from NVML.

The daemon asks once per scheduling pass, and only when a job waits for a GPU. Memory used
counts every process on the GPU, inside the queue or not, which is what placement needs.
pynvml is imported on first use, so clients that never name a GPU never pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass

from gpubox.digits import ascii_int

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    mem_total_bytes: int
    mem_used_bytes: int


class NoNvml(Exception):
    """NVML cannot be loaded or initialised: no driver, or no permission."""


class NvmlGpus:
    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[tuple[int, str, Any]] = []

    def _open(self) -> Any:
        if self._nvml is None:
            from gpubox.telemetry.backend import BackendUnavailable
            from gpubox.telemetry.nvml_load import load_nvml

            try:
                pynvml = load_nvml()  # says what is missing as `gpubox top` does: no driver, no permission
            except BackendUnavailable as exc:
                raise NoNvml(f"NVML cannot start: {exc}") from None
            try:
                handles = []
                for index in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = pynvml.nvmlDeviceGetUUID(handle)
                    handles.append((index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
            except Exception as exc:  # pynvml raises NVMLError subclasses, OSError or ImportError
                raise NoNvml(f"NVML cannot list the GPUs ({exc})") from None
            self._nvml, self._handles = pynvml, handles
        return self._nvml

    def read(self) -> list[GpuInfo]:
        """Every GPU with its memory now; NoNvml when there is no driver."""
        nvml = self._open()
        out: list[GpuInfo] = []
        for index, uuid, handle in self._handles:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                total, used = int(mem.total), int(mem.used)
            except Exception:
                # A GPU that cannot say how much memory is free looks full: nothing lands on it.
                total, used = 1, 1
            out.append(GpuInfo(index, uuid, total, used))
        return out

    def processes(self) -> dict[str, list[tuple[int, int | None]]]:
        """Per GPU UUID, (pid, GPU memory it uses) of every process on it, compute and graphics,
        each pid once (a process can be both); the memory None where NVML cannot say. A GPU
        whose processes cannot be read at all is left out."""
        nvml = self._open()
        out: dict[str, list[tuple[int, int | None]]] = {}
        for _, uuid, handle in self._handles:
            seen: dict[int, int | None] = {}
            read = False
            for listing in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    found = listing(handle)
                except Exception:  # graphics not supported, say: the other list still counts
                    continue
                read = True
                for proc in found:
                    pid, used = int(proc.pid), _memory(proc)
                    if pid not in seen or (used is not None and (seen[pid] or 0) < used):
                        seen[pid] = used
            if read:
                out[uuid] = list(seen.items())
        return out

    def close(self) -> None:
        if self._nvml is not None:
            with suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


def _memory(process: object) -> int | None:
    used = getattr(process, "usedGpuMemory", None)
    # NVML says "not available" (in a container, say) as None or as the largest 64-bit value.
    return int(used) if isinstance(used, int) and 0 <= used < 1 << 63 else None


def jobs_memory(
    processes: list[tuple[int, int | None]] | None,
    owner: Mapping[int, int],
    visible: Callable[[int], bool] = lambda pid: os.path.exists(f"/proc/{pid}"),
) -> tuple[tuple[int, int], ...] | None:
    """(job id, GPU memory its processes use) on one GPU, for every job in `owner` (pid -> job
    id) with a process there; None when that is not known: NVML cannot say what one uses, or
    it lists processes this one cannot see and none of the queue's. NVML names pids of another
    PID namespace when the queue runs in a container: the queue's own processes would pass for
    strangers' and no preemption would ever seem to free anything. (Where /proc hides other
    users' processes (hidepid), the queue's own still match, so theirs count as strangers'.)"""
    if processes is None:
        return None
    held: dict[int, int] = {}
    unseen = False
    for pid, used in processes:
        job = owner.get(pid)
        if job is None:
            unseen = unseen or not visible(pid)
            continue  # not the queue's: part of what stopping queue jobs does not free
        if used is None:
            return None
        held[job] = held.get(job, 0) + used
    if unseen and owner and not held:
        return None
    return tuple(sorted(held.items()))


def resolve_gpus(texts: Sequence[str], gpus: Sequence[GpuInfo]) -> tuple[str, ...]:
    """UUIDs for GPUs named by index, full UUID or a unique UUID prefix; ValueError otherwise."""
    out: list[str] = []
    for raw in texts:
        text = raw.strip()
        if not text:
            raise ValueError("an empty GPU in the --gpu list")
        index = ascii_int(text)  # an index as CUDA reads one; anything else is a UUID or a prefix
        if index is not None:
            match = [g for g in gpus if g.index == index]
            if not match:
                have = f"0-{len(gpus) - 1}" if gpus else "none"
                raise ValueError(f"no GPU {text} on this box (GPUs: {have})")
        else:
            match = [g for g in gpus if g.uuid.lower().startswith(text.lower())]
            if not match:
                raise ValueError(f"no GPU with UUID {text} on this box")
            if len(match) > 1:
                raise ValueError(f"GPU UUID prefix {text} matches {len(match)} GPUs; give more of it")
        if match[0].uuid in out:
            raise ValueError(f"GPU {text} is named twice")
        out.append(match[0].uuid)
    return tuple(out)
