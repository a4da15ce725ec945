"""Host figures and per-pid details (user, command, CPU, RSS) through /proc and psutil.

GPU pids from NVML are host pids. When gpubox runs in a container that cannot see them, they
show with reason `no_process` rather than as zeros.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from gpubox.telemetry.job_tags import JobTag, read_job_tag
from gpubox.telemetry.model import HostSnapshot, Reason


@dataclass(frozen=True)
class PidInfo:
    user: str | None
    command: str | None
    cpu_percent: float | None
    rss_bytes: int | None
    start_time: float | None
    reasons: dict[str, str]
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: names the pid's probe file
    job_id: int | None = None  # the gpubox queue job that started it, if any
    job_kind: str | None = None


_NOT_VISIBLE = PidInfo(
    None,
    None,
    None,
    None,
    None,
    dict.fromkeys(
        ("user", "command", "cpu_percent", "rss_bytes", "start_time", "job_id", "job_kind"), Reason.NO_PROCESS.value
    ),
)
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def read_proc_stat(pid: int) -> tuple[float, int, int]:
    """(CPU seconds used, start time in clock ticks since boot, RSS bytes) from one read of
    /proc/<pid>/stat. Raises OSError when the pid is gone or hidden."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[19]), int(fields[21]) * _PAGE


@dataclass
class _Seen:
    start_ticks: int
    user: str | None
    command: str | None
    job: JobTag
    cpu_seconds: float
    at: float  # monotonic time of the last read


class PidTable:
    """Per-pid details across refreshes: user, command line and queue job are read once per
    process, CPU % is the rate since the previous refresh, and each refresh costs one read of
    /proc/<pid>/stat per GPU process (psutil would make several)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, host_pids_visible: bool | None = None) -> None:
        self._seen: dict[int, _Seen] = {}
        self._clock = clock
        self._boot = psutil.boot_time()
        # In a container with its own PID namespace, /proc/<host pid> is some other process.
        self.host_pids_visible = not in_child_pid_namespace() if host_pids_visible is None else host_pids_visible

    def lookup(self, pids: Iterable[int]) -> dict[int, PidInfo]:
        wanted = set(pids)
        for gone in set(self._seen) - wanted:
            del self._seen[gone]
        return {pid: self._one(pid) for pid in wanted}

    def _one(self, pid: int) -> PidInfo:
        if not self.host_pids_visible:
            return _NOT_VISIBLE
        now = self._clock()
        try:
            cpu_s, start_ticks, rss = read_proc_stat(pid)
        except PermissionError:
            denied = dict.fromkeys(
                ("cpu_percent", "rss_bytes", "start_time", "job_id", "job_kind"), Reason.NO_PERMISSION.value
            )
            return PidInfo(None, None, None, None, None, denied)
        except (OSError, IndexError, ValueError):
            self._seen.pop(pid, None)
            return _NOT_VISIBLE
        seen = self._seen.get(pid)
        cpu: float | None = None
        if seen is None or seen.start_ticks != start_ticks:  # new, or a recycled pid
            user, command = _identity(pid)
            seen = self._seen[pid] = _Seen(start_ticks, user, command, read_job_tag(pid), cpu_s, now)
        else:
            elapsed = now - seen.at
            if elapsed > 0:
                cpu = round(100.0 * (cpu_s - seen.cpu_seconds) / elapsed, 1)
            seen.cpu_seconds, seen.at = cpu_s, now
        reasons = {"cpu_percent": Reason.WARMING_UP.value} if cpu is None else {}
        if seen.command is None:
            reasons["command"] = Reason.NO_PERMISSION.value
        job = seen.job
        if job.reason is not None:  # unknown, unlike a readable process that no job started
            reasons["job_id"] = reasons["job_kind"] = job.reason
        started = self._boot + start_ticks / _CLK_TCK
        return PidInfo(seen.user, seen.command, cpu, rss, started, reasons, start_ticks, job.job_id, job.job_kind)


def _identity(pid: int) -> tuple[str | None, str | None]:
    try:
        proc = psutil.Process(pid)
        return _user(proc), _command(proc)
    except psutil.Error:
        return None, None


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
        text = " ".join(argv) if argv else f"[{proc.name()}]"
    except psutil.AccessDenied:
        return None
    # Arguments that are not UTF-8 arrive as lone surrogates, which JSON parsers reject.
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def prime_host_cpu() -> None:
    """psutil's first host CPU reading is 0.0 by definition; start its window now."""
    psutil.cpu_percent(None)


# The kernel's initial PID namespace has this inode number (PROC_PID_INIT_INO), on every kernel
# since 3.8.
INIT_PID_NAMESPACE = "pid:[4026531836]"


def in_child_pid_namespace(status_path: str = "/proc/self/status", ns_path: str = "/proc/self/ns/pid") -> bool:
    """True inside a container with its own PID namespace, where NVML's host pids name other
    processes (or none) in /proc. Read from this process's namespace link: a container mounts its
    own /proc, whose NSpid line then lists one pid only, as on the host. Where the link cannot be
    read, from NSpid (more than one pid: this process is in a namespace below /proc's)."""
    try:
        return os.readlink(ns_path) != INIT_PID_NAMESPACE
    except OSError:
        pass
    try:
        with open(status_path) as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return len(line.split()) > 2  # one pid per namespace level
    except OSError:
        pass
    return False


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
