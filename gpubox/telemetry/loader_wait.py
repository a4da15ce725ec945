"""Dataloader wait per GPU process: read from its probe file, else sampled from its stacks.

A process's probe file lies under the runtime directory that the process itself resolved, which
depends on its environment and its uid, not on ours: so its /proc/<pid>/environ is parsed and
handed to resolve_paths with its uid (its owner's home when the environment cannot be read).
A process in another mount namespace (a container) is reached through /proc/<pid>/root, and one
in another PID namespace named its file with the pid it sees, read from NSpid.

Each refresh costs one open per GPU process (two more reads where a probe file exists); what a
process's path is gets resolved once per process. A file is used only when the pid and start
ticks it records are this process's, so a stale file or a recycled pid never reads as another.
"""

from __future__ import annotations

import importlib
import os
import pwd
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpubox.paths import resolve_paths
from gpubox.probe import layout
from gpubox.telemetry.model import Reason

DEFAULT_WINDOW_S = 10
MAX_WINDOW_S = layout.BUCKETS - 1


def wait_level(wait: float | None, threshold: float) -> str | None:
    """ "high" above the threshold, "severe" above twice it (where the loader holds the GPU
    back most), None otherwise or when unknown."""
    if wait is None or wait <= threshold:
        return None
    return "severe" if wait > min(2 * threshold, 1.0) or wait >= 1.0 else "high"


@dataclass(frozen=True)
class LoaderWait:
    """One process's figures; `reason` says why `loader_wait` is None."""

    loader_wait: float | None = None
    source: str | None = None  # "probe" or "sampled"
    batches_per_s: float | None = None
    samples: int | None = None  # stack samples behind a "sampled" figure
    reason: str | None = None


@dataclass(frozen=True)
class LoaderWaitReading:
    by_pid: dict[int, LoaderWait] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()  # advice for the operator, e.g. how to allow stack sampling


class SampledWaitLike(Protocol):
    @property
    def fraction(self) -> float | None: ...
    @property
    def samples(self) -> int: ...
    @property
    def reason(self) -> str | None: ...


class StackSamplerLike(Protocol):
    permission_hint: str | None

    def update(self, pids: Iterable[int]) -> None: ...
    def result(self, pid: int) -> SampledWaitLike | None: ...
    def close(self) -> None: ...


def open_stack_sampler(window_s: float) -> StackSamplerLike | None:
    """The py-spy sampler where it is installed; None otherwise (the figure stays unknown)."""
    try:
        # Imported by name: stack sampling is an optional part, and needs py-spy to work.
        module = importlib.import_module("gpubox.telemetry.stack_sampling")
        if not module.sampling_available():
            return None
        sampler: StackSamplerLike = module.StackSampler(hz=2.0, window_s=window_s)
    except (ImportError, AttributeError, OSError):
        return None
    return sampler


@dataclass(frozen=True)
class ProbeLocation:
    """Where one process (pid, start ticks) keeps its probe file, as seen from here."""

    candidates: tuple[Path, ...]  # tried in order; the process used one of them
    ns_pid: int  # the pid the process sees itself as, which names its file


class ProcView:
    """The few /proc facts about another process that locating its probe file needs. `root`
    is /proc; tests hand in a tree of their own."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root
        self._own_mnt = _readlink(root / "self" / "ns" / "mnt")

    def locate(self, pid: int, start_ticks: int) -> ProbeLocation:
        base = self.root / str(pid)
        status = _status(base / "status")
        uid = status.get("uid")
        if uid is None:
            try:
                uid = os.stat(base).st_uid
            except OSError:
                return ProbeLocation((), pid)
        ns_pid = status.get("ns_pid", pid)
        prefix: Path | None = None
        mnt = _readlink(base / "ns" / "mnt")
        if mnt is not None and self._own_mnt is not None and mnt != self._own_mnt:
            prefix = base / "root"
            uid = _inner_uid(base / "uid_map", uid)
        env = _environ(base / "environ")
        if env is None:
            env = {"HOME": _home_of(uid)}
        runtime = resolve_paths(env, uid).runtime_dir
        if not runtime.is_absolute():  # GPUBOX_RUNTIME_DIR relative to where the process started
            runtime = base / "cwd" / runtime
        name = layout.probe_file(Path("/"), ns_pid, start_ticks).relative_to("/")
        if prefix is None:
            return ProbeLocation((runtime / name,), ns_pid)
        dirs = [runtime]
        if not _explicit_runtime(env):
            # resolve_paths judged /run/user/<uid> in our mount namespace; the process judged
            # it in its own, so both of its fallbacks are tried there.
            dirs += [Path(f"/run/user/{uid}/gpubox"), Path(f"/tmp/gpubox-{uid}")]
        unique = dict.fromkeys((d if d.is_relative_to(base) else prefix / d.relative_to("/")) / name for d in dirs)
        return ProbeLocation(tuple(unique), ns_pid)


class _Located:
    """A process's probe location, cached with what each refresh checks as plain strings."""

    __slots__ = ("files", "location", "start_ticks")

    def __init__(self, start_ticks: int, location: ProbeLocation) -> None:
        self.start_ticks = start_ticks
        self.location = location
        self.files = tuple((str(p.parent), p.name, p) for p in location.candidates)


class LoaderWaitReader:
    """Reads the loader wait of the GPU processes of each refresh. Close it to stop sampling."""

    def __init__(
        self,
        window_s: int = DEFAULT_WINDOW_S,
        sampling: bool = True,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        proc: ProcView | None = None,
        sampler_factory: Callable[[float], StackSamplerLike | None] = open_stack_sampler,
    ) -> None:
        if not 1 <= window_s <= MAX_WINDOW_S:
            raise ValueError(f"the loader wait window is 1 to {MAX_WINDOW_S} seconds")
        self.window_s = window_s
        self._clock_ns = clock_ns
        self._proc = proc or ProcView()
        self._located: dict[int, _Located] = {}
        self._sampling = sampling
        self._sampler_factory = sampler_factory
        self._sampler: StackSamplerLike | None = None
        self._sampler_tried = False

    def read(self, start_ticks: Mapping[int, int]) -> LoaderWaitReading:
        """Figures for these pids (host pid -> start ticks from /proc/<pid>/stat)."""
        for gone in self._located.keys() - start_ticks.keys():
            del self._located[gone]
        by_pid: dict[int, LoaderWait] = {}
        errors: list[str] = []
        unprobed: dict[int, str] = {}  # pid -> the reason if nothing else measures it
        listed: dict[str, frozenset[str] | None] = {}  # probe directory -> its files, this refresh
        for pid, ticks in start_ticks.items():
            found = self._from_probe(pid, ticks, errors, listed)
            if isinstance(found, LoaderWait):
                by_pid[pid] = found
            else:
                unprobed[pid] = found
        sampler = self._stack_sampler(bool(unprobed))
        notices: tuple[str, ...] = ()
        if sampler is not None:
            sampler.update(sorted(unprobed))
            for pid in unprobed:
                by_pid[pid] = _from_sample(sampler.result(pid))
            if sampler.permission_hint:
                notices = (sampler.permission_hint,)
        else:
            for pid, reason in unprobed.items():
                by_pid[pid] = LoaderWait(reason=reason)
        return LoaderWaitReading(by_pid, tuple(errors), notices)

    def _from_probe(
        self,
        pid: int,
        ticks: int,
        errors: list[str],
        listed: dict[str, frozenset[str] | None],
    ) -> LoaderWait | str:
        """The probe's figures, a LoaderWait saying why they are missing, or (a str) the
        reason to give if no other tier measures this process."""
        located = self._located.get(pid)
        if located is None or located.start_ticks != ticks:
            located = self._located[pid] = _Located(ticks, self._proc.locate(pid, ticks))
        why = Reason.NOT_MEASURED.value
        for directory, name, path in located.files:
            # Most GPU processes run no probe and share a runtime directory: one listing of it
            # per refresh costs less than a failed open per process.
            if directory not in listed:
                listed[directory] = _listing(directory)
            names = listed[directory]
            if names is not None and name not in names:
                continue
            try:
                record = layout.read_consistent(path)
            except FileNotFoundError:
                continue
            except PermissionError:
                why = Reason.NO_PERMISSION.value  # its runtime directory is not ours to read
                continue
            except (OSError, layout.ProbeFileError) as exc:
                errors.append(f"pid {pid}: probe file {path} skipped: {exc}")
                return LoaderWait(reason=Reason.PROBE_UNREADABLE.value)
            if record.pid != located.location.ns_pid or record.start_ticks != ticks:
                continue  # left by an earlier process with this name: not this one's figures
            # The time after the copy: a window that ends before it would hold later waits.
            figures = record.window(self._clock_ns(), self.window_s)
            if figures is None:
                return LoaderWait(reason=Reason.NO_BATCHES_YET.value)
            wait, rate, _covered = figures
            return LoaderWait(loader_wait=wait, source="probe", batches_per_s=rate)
        return why

    def _stack_sampler(self, wanted: bool) -> StackSamplerLike | None:
        if self._sampler is None and wanted and self._sampling and not self._sampler_tried:
            self._sampler_tried = True  # py-spy missing is not retried every refresh
            self._sampler = self._sampler_factory(float(self.window_s))
        return self._sampler

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None


def _from_sample(result: SampledWaitLike | None) -> LoaderWait:
    if result is None:
        return LoaderWait(reason=Reason.WARMING_UP.value)
    if result.fraction is None:
        return LoaderWait(reason=result.reason or Reason.NOT_MEASURED.value)
    return LoaderWait(loader_wait=result.fraction, source="sampled", samples=result.samples)


def _listing(directory: str) -> frozenset[str] | None:
    """The names in a probe directory; empty when there is none, None when we may not look."""
    try:
        return frozenset(os.listdir(directory))
    except PermissionError:
        return None  # the open that follows says whether the file itself is readable
    except OSError:
        return frozenset()


def _readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _status(path: Path) -> dict[str, int]:
    """The real uid and the innermost-namespace pid from /proc/<pid>/status."""
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    out["uid"] = int(line.split()[1])  # real: what os.getuid() gives the process
                elif line.startswith(b"NSpid:"):
                    out["ns_pid"] = int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _environ(path: Path) -> dict[str, str] | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"  # a uid with no name here (a container's); the runtime directory needs no home


def _explicit_runtime(env: Mapping[str, str]) -> bool:
    return bool(env.get("GPUBOX_RUNTIME_DIR")) or os.path.isabs(env.get("XDG_RUNTIME_DIR", ""))


def _inner_uid(uid_map: Path, host_uid: int) -> int:
    """The uid a process in a user namespace sees itself as, from the host's view of it."""
    try:
        with open(uid_map) as fh:
            for line in fh:
                inner, outer, count = (int(x) for x in line.split())
                if outer <= host_uid < outer + count:
                    return inner + host_uid - outer
    except (OSError, ValueError):
        pass
    return host_uid
