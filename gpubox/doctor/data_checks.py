"""`gpubox doctor --data PATH`: how fast the dataset's files can be read, cold and warm, and what
filesystem holds them. A bounded, deterministic sample of files is read twice: first after asking
the kernel to drop their cached pages (posix_fadvise DONTNEED, no root needed), then again from
the page cache."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpubox.doctor.data_fs import Mount, filesystem_check, mount_of
from gpubox.doctor.host_view import HostView
from gpubox.doctor.model import Check
from gpubox.doctor.thresholds import Thresholds
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.format import size

MAX_FILES = 64
MAX_BYTES = 256 * 1024 * 1024
MAX_LISTED = 20_000  # files listed before choosing: bounds the walk of a huge tree
MAX_SECONDS = 20.0  # of cold reading; a very slow mount is measured on what was read by then
CHUNK = 1024 * 1024

__all__ = ["DataPathError", "Mount", "ReadMeasurement", "data_checks", "measure_reads", "read_check", "sample_files"]


class DataPathError(GpuboxError):
    """The --data path cannot be measured: it does not exist, or holds no readable files."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


def sample_files(root: Path, max_files: int = MAX_FILES, max_listed: int = MAX_LISTED) -> tuple[Path, ...]:
    """Up to `max_files` non-empty readable files under `root`, spread evenly over the sorted list
    of the first `max_listed` found in sorted order: the same choice at every run."""
    if not os.path.exists(root):
        raise DataPathError(f"--data: {root} does not exist")
    if os.path.isfile(root):
        if not _readable(root):
            raise DataPathError(f"--data: {root} is empty or cannot be read")
        return (root,)
    listed: list[Path] = []
    for folder, dirs, files in os.walk(root, onerror=None):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .git, .cache: not the dataset
        listed += (Path(folder) / f for f in sorted(files) if not f.startswith("."))
        if len(listed) >= max_listed:
            break
    chosen: list[Path] = []
    candidates = sorted(listed[:max_listed])
    step = max(1, len(candidates) // max_files)
    for path in candidates[::step]:
        if _readable(path):
            chosen.append(path)
        if len(chosen) >= max_files:
            break
    if not chosen:
        raise DataPathError(f"--data: no readable, non-empty files under {root}")
    return tuple(chosen)


def _readable(path: Path) -> bool:
    """A regular, non-empty file that gives a first byte. A FIFO or a device would block the read
    (or never end), so anything else is left out, and the open does not wait for a writer."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.fstat(fd).st_size > 0 and os.read(fd, 1) != b""
    except OSError:
        return False
    finally:
        os.close(fd)


def drop_cached(path: Path, length: int) -> tuple[int, int] | None:
    """Ask the kernel to drop the file's cached pages over its first `length` bytes; then (pages
    still cached, pages), or None where that cannot be told."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        span = min(os.fstat(fd).st_size, length)
        with contextlib.suppress(OSError):
            os.fsync(fd)  # dirty pages are never dropped: write them out first
        if not hasattr(os, "posix_fadvise") or span <= 0:
            return None
        os.posix_fadvise(fd, 0, span, os.POSIX_FADV_DONTNEED)
        return _cached_pages(fd, span) if _may_see_cache(path, fd) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _may_see_cache(path: Path, fd: int) -> bool:
    # Since Linux 5.2 mincore() shows a file's page cache only to its owner, a writer, or root.
    return os.geteuid() == 0 or os.fstat(fd).st_uid == os.geteuid() or os.access(path, os.W_OK)


def _cached_pages(fd: int, span: int) -> tuple[int, int] | None:
    """(cached, total) pages of the file's first `span` bytes, by mincore() on a private mapping."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mapped = mmap.mmap(fd, span, access=mmap.ACCESS_COPY)  # private and writable: ctypes can address it
    except (OSError, ValueError, AttributeError):
        return None
    pages = (span + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(span), vec)
    finally:
        del anchor  # the mapping cannot close while ctypes points into it
        mapped.close()
    return (sum(v & 1 for v in vec), pages) if rc == 0 else None


@dataclass(frozen=True)
class ReadMeasurement:
    files: int  # files read (the time bound may stop before the sample's end)
    cold_bytes: int
    cold_seconds: float  # including each open: a loader pays it per file too
    warm_bytes: int
    warm_seconds: float
    cached_fraction: float | None  # share of the cold bytes the kernel kept cached despite the drop; None: unknown
    sampled: int  # files in the sample
    stopped_early: bool = False  # the time bound cut the cold pass short

    @property
    def cold_MBps(self) -> float | None:
        return self.cold_bytes / self.cold_seconds / 1e6 if self.cold_seconds > 0 else None

    @property
    def warm_MBps(self) -> float | None:
        return self.warm_bytes / self.warm_seconds / 1e6 if self.warm_seconds > 0 else None

    @property
    def files_per_s(self) -> float | None:
        return self.files / self.cold_seconds if self.cold_seconds > 0 else None


def _read(path: Path, limit: int, buf: bytearray) -> int:
    view, done = memoryview(buf), 0
    with open(path, "rb", buffering=0) as fh:
        while done < limit:
            n = fh.readinto(view[: min(len(buf), limit - done)])
            if not n:
                break
            done += n
    return done


def measure_reads(
    files: Sequence[Path],
    max_bytes: int = MAX_BYTES,
    max_seconds: float = MAX_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> ReadMeasurement:
    """Read each file's first max_bytes/len(files) bytes cold, then the same bytes warm."""
    per_file = max(CHUNK, max_bytes // max(1, len(files)))
    kept = [drop_cached(p, per_file) for p in files]
    known = [k for k in kept if k is not None]
    cached = sum(c for c, _ in known) / max(1, sum(t for _, t in known)) if known else None
    buf = bytearray(CHUNK)
    lengths: list[int] = []
    start = clock()
    for path in files:
        lengths.append(_read(path, per_file, buf))
        if clock() - start > max_seconds:
            break
    cold_seconds = clock() - start
    start = clock()
    warm = sum(_read(path, n, buf) for path, n in zip(files, lengths, strict=False))
    warm_seconds = clock() - start
    return ReadMeasurement(
        files=len(lengths),
        cold_bytes=sum(lengths),
        cold_seconds=cold_seconds,
        warm_bytes=warm,
        warm_seconds=warm_seconds,
        cached_fraction=cached,
        sampled=len(files),
        stopped_early=len(lengths) < len(files),
    )


def read_check(m: ReadMeasurement, t: Thresholds, mount: Mount | None = None) -> Check:
    """data.read: the cold rate against data_warn_MBps; the warm rate says whether caching helps."""
    id, title = "data.read", "Dataset read speed"
    cold, warm = m.cold_MBps, m.warm_MBps
    evidence = {
        "files": m.files,
        "sampled": m.sampled,
        "cold_bytes": m.cold_bytes,
        "cold_seconds": m.cold_seconds,
        "warm_bytes": m.warm_bytes,
        "warm_seconds": m.warm_seconds,
        "cold_MBps": cold,
        "warm_MBps": warm,
        "files_per_s": m.files_per_s,
        "cached_fraction": m.cached_fraction,
        "stopped_early": m.stopped_early,
        "warn_MBps": t.data_warn_MBps,
    }
    value = {"cold_MBps": cold, "warm_MBps": warm}
    detail = f"cold {_mbps(cold)}, warm {_mbps(warm)} over {m.files} files ({size(m.cold_bytes)})"
    notes = []
    if m.cached_fraction is None:
        notes.append("whether the kernel dropped the files' cached pages first is unknown, so 'cold' may be warm")
    elif m.cached_fraction > 0.5:
        where = f" ({mount.fstype})" if mount else ""
        notes.append(
            f"the kernel kept {m.cached_fraction:.0%} of the pages cached despite the drop{where}, so 'cold' is "
            "partly warm and the true cold rate is lower"
        )
    if m.stopped_early:
        notes.append(f"reading stopped after {m.cold_seconds:.0f} s, {m.files} of {m.sampled} files")
    if cold is None or cold >= t.data_warn_MBps:
        meaning = f"Reads from where the dataset lives keep up with {t.data_warn_MBps:g} MB/s or more."
        meaning += "".join(f" Note: {n}." for n in notes)
        return Check(id, title, "data", "ok", detail, value, "MB/s", meaning, None, None, 0.0, evidence)
    meaning = (
        f"Reading the dataset from where it lives runs at {cold:.0f} MB/s, under {t.data_warn_MBps:g} MB/s: "
        "a loader that reads each sample once per epoch waits on storage."
    )
    if warm is not None and warm >= t.data_warn_MBps:
        meaning += " From the page cache it is fast, so a dataset that fits in memory or on local disk is fed."
        fix = (
            "Copy or cache the dataset on local NVMe (`rsync -a DATA /local/nvme/`, or a local cache in front of the "
            "mount); pack small files into larger shards (WebDataset tar shards, LMDB, Parquet); raise "
            "DataLoader(num_workers=...) so reads overlap."
        )
    else:
        meaning += " Even cached reads are slow: the cost is per read call (a FUSE daemon, or many tiny files)."
        fix = (
            "Pack small files into larger shards (WebDataset tar shards, LMDB, Parquet) and read them sequentially; "
            "copy the dataset off the FUSE mount to local NVMe; raise DataLoader(num_workers=...)."
        )
    meaning += "".join(f" Note: {n}." for n in notes)
    impact = round(min(0.8, max(0.1, 0.8 * (1 - cold / t.data_warn_MBps))), 2)
    return Check(id, title, "data", "warn", detail, value, "MB/s", meaning, fix, None, impact, evidence)


def _mbps(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} MB/s"


def data_checks(
    path: Path,
    thresholds: Thresholds,
    view: HostView | None = None,
    *,
    max_files: int = MAX_FILES,
    max_bytes: int = MAX_BYTES,
    max_seconds: float = MAX_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Check]:
    """data.read and data.filesystem for the dataset at `path`; DataPathError when there is
    nothing to read there (the CLI turns it into one line and exit code 2)."""
    files = sample_files(path, max_files)
    mount = mount_of(path, (view or HostView()).proc / "self" / "mountinfo")
    measured = measure_reads(files, max_bytes, max_seconds, clock)
    read = read_check(measured, thresholds, mount)
    return [read, filesystem_check(path, mount, read_ok=read.status == "ok")]
