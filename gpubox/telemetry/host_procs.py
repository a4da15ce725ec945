"""Host figures and per-pid details (user, command, CPU, RSS) through psutil and /proc.

GPU pids from NVML are host pids. When gpubox runs in a container that cannot see them, they
show with reason `no_process` rather than as zeros.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from gpubox.telemetry.model import HostSnapshot, Reason


@dataclass(frozen=True)
class PidInfo:
    user: str | None
    command: str | None
    cpu_percent: float | None
    rss_bytes: int | None
    start_time: float | None
    reasons: dict[str, str]


class PidTable:
    """Caches psutil.Process objects across refreshes, so cpu_percent is a rate over the last
    refresh and command lines are read once per process, not once per tick."""

    def __init__(self) -> None:
        self._procs: dict[int, tuple[psutil.Process, str | None, str | None, bool]] = {}

    def lookup(self, pids: Iterable[int]) -> dict[int, PidInfo]:
        wanted = set(pids)
        for gone in set(self._procs) - wanted:
            del self._procs[gone]
        return {pid: self._one(pid) for pid in wanted}

    def _one(self, pid: int) -> PidInfo:
        cached = self._procs.get(pid)
        try:
            if cached is None:
                proc = psutil.Process(pid)
                user, command = _user(proc), _command(proc)
                proc.cpu_percent(None)  # starts the CPU-time window
                self._procs[pid] = (proc, user, command, False)
                first = True
            else:
                proc, user, command, _ = cached
                first = False
                # A recycled pid is a different process: start over.
                if not proc.is_running():
                    del self._procs[pid]
                    return self._one(pid)
            with proc.oneshot():
                cpu = None if first else proc.cpu_percent(None)
                rss = proc.memory_info().rss
                started = proc.create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            gone = {k: Reason.NO_PROCESS.value for k in ("user", "command", "cpu_percent", "rss_bytes", "start_time")}
            return PidInfo(None, None, None, None, None, gone)
        except psutil.AccessDenied:
            denied = {k: Reason.NO_PERMISSION.value for k in ("cpu_percent", "rss_bytes", "start_time")}
            return PidInfo(user, command, None, None, None, denied)
        reasons = {"cpu_percent": Reason.WARMING_UP.value} if cpu is None else {}
        if command is None:
            reasons["command"] = Reason.NO_PERMISSION.value
        return PidInfo(user, command, cpu, rss, started, reasons)


def signal_process(pid: int, sig: int, start_time: float | None) -> None:
    """Send `sig` to pid only if it is still the process that started at `start_time`."""
    try:
        proc = psutil.Process(pid)
        if start_time is not None and abs(proc.create_time() - start_time) > 0.01:
            raise ProcessLookupError(f"pid {pid} is now another process")
        proc.send_signal(sig)
    except psutil.NoSuchProcess as exc:
        raise ProcessLookupError(f"pid {pid} has exited") from exc
    except psutil.AccessDenied as exc:
        raise PermissionError(f"not allowed to signal pid {pid}") from exc


def _user(proc: psutil.Process) -> str | None:
    try:
        return proc.username()
    except (psutil.AccessDenied, KeyError):
        # A container's uid may have no name on this host: show the number.
        try:
            return str(proc.uids().real)
        except psutil.Error:
            return None


def _command(proc: psutil.Process) -> str | None:
    try:
        argv = proc.cmdline()
        return " ".join(argv) if argv else f"[{proc.name()}]"
    except psutil.AccessDenied:
        return None


def host_snapshot(
    driver_version: str | None = None,
    cuda_driver_version: str | None = None,
    nvml_version: str | None = None,
    hostname: Callable[[], str] = socket.gethostname,
) -> HostSnapshot:
    mem = psutil.virtual_memory()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return HostSnapshot(
        hostname=hostname(),
        cpu_percent=psutil.cpu_percent(None),
        cpu_count=psutil.cpu_count(),
        load_1m=load,
        mem_total_bytes=mem.total,
        mem_used_bytes=mem.total - mem.available,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        nvml_version=nvml_version,
    )
