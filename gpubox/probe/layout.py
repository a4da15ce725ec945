"""The probe file: a fixed layout shared by the probe (writer, in the training process) and the
telemetry reader. Standard library only: the probe runs inside other people's programs.

One file per process: <runtime_dir>/probe/<pid>-<start_ticks>.probe, where start_ticks is field
22 of /proc/<pid>/stat (the process start in clock ticks since boot), so a recycled pid never
reads another process's figures. The file is FILE_SIZE bytes of little-endian unsigned 64-bit
words (slot numbers below; byte offset = 8 * slot), except the 8-byte magic in slot 0.

A seqlock guards the figures: the writer makes SEQ odd, writes, makes it even again. A reader
copies the file, and keeps the copy only if SEQ was even and unchanged around the copy.
All times are CLOCK_MONOTONIC nanoseconds (time.monotonic_ns()), comparable across processes.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GPBXPRB\x01"
VERSION = 1
FILE_SIZE = 512
WORDS = FILE_SIZE // 8

# Slots (index into the file viewed as an array of uint64).
S_MAGIC = 0
S_VERSION = 1
S_PID = 2
S_START_TICKS = 3
S_SEQ = 4  # odd while the writer is in the middle of an update
S_BATCHES = 5  # batches returned by DataLoader iterators, in total
S_WAIT_NS = 6  # time blocked in __next__, in total
S_FIRST_NS = 7  # when the first batch was asked for
S_LAST_NS = 8  # when the last batch was returned
S_LAST_WAIT_NS = 9  # how long the last batch took to arrive
S_WAITING_SINCE_NS = 10  # non-zero while blocked in __next__ right now: when it started
S_BUCKET_COUNT = 11  # BUCKETS
S_BUCKETS = 12  # BUCKETS x (second, wait_ns, batches): waits by the second in which they ended
BUCKETS = 16
BUCKET_NS = 1_000_000_000
assert S_BUCKETS + 3 * BUCKETS <= WORDS


def probe_dir(runtime_dir: Path) -> Path:
    return runtime_dir / "probe"


def probe_file(runtime_dir: Path, pid: int, start_ticks: int) -> Path:
    return probe_dir(runtime_dir) / f"{pid}-{start_ticks}.probe"


@dataclass(frozen=True)
class ProbeRecord:
    pid: int
    start_ticks: int
    batches: int
    wait_ns: int
    first_ns: int
    last_ns: int
    last_wait_ns: int
    waiting_since_ns: int
    buckets: tuple[tuple[int, int, int], ...]  # (second, wait_ns, batches), the live ones

    def window(self, now_ns: int, seconds: int) -> tuple[float, float, float] | None:
        """(loader_wait fraction, batches per second, seconds covered) over the last `seconds`
        (at most BUCKETS - 1) up to now_ns, counting a wait still in progress; None before the
        first batch was asked for."""
        if self.first_ns == 0 or now_ns <= self.first_ns:
            return None
        seconds = max(1, min(seconds, BUCKETS - 1))
        now_s = now_ns // BUCKET_NS
        oldest = now_s - seconds + 1
        wait = sum(w for s, w, _ in self.buckets if oldest <= s <= now_s)
        batches = sum(b for s, _, b in self.buckets if oldest <= s <= now_s)
        start = max(oldest * BUCKET_NS, self.first_ns)
        if self.waiting_since_ns:
            # A wait that began after now_ns (the reader took the time before it read the file)
            # has no part in the window: never a negative share.
            wait += max(0, now_ns - max(self.waiting_since_ns, start))
        covered = (now_ns - start) / 1e9
        if covered <= 0:
            return None
        return min(1.0, wait / 1e9 / covered), batches / covered, covered


class ProbeFileError(ValueError):
    """A file that is not a probe file of this version, or was torn or cut short."""


_WORDS = struct.Struct(f"<{WORDS}Q")


def parse(data: bytes) -> ProbeRecord:
    """A consistent record from one copy of the file; ProbeFileError when it is not one."""
    if len(data) < FILE_SIZE:
        raise ProbeFileError(f"truncated ({len(data)} of {FILE_SIZE} bytes)")
    if data[:8] != MAGIC:
        raise ProbeFileError("not a gpubox probe file")
    w = _WORDS.unpack_from(data)
    if w[S_VERSION] != VERSION:
        raise ProbeFileError(f"probe layout version {w[S_VERSION]}, expected {VERSION}")
    if w[S_SEQ] % 2:
        raise ProbeFileError("in the middle of an update")
    if w[S_BUCKET_COUNT] != BUCKETS:
        raise ProbeFileError("bad bucket count")
    buckets = tuple(
        (w[S_BUCKETS + 3 * i], w[S_BUCKETS + 3 * i + 1], w[S_BUCKETS + 3 * i + 2])
        for i in range(BUCKETS)
        if w[S_BUCKETS + 3 * i + 2] or w[S_BUCKETS + 3 * i + 1]
    )
    return ProbeRecord(
        pid=w[S_PID],
        start_ticks=w[S_START_TICKS],
        batches=w[S_BATCHES],
        wait_ns=w[S_WAIT_NS],
        first_ns=w[S_FIRST_NS],
        last_ns=w[S_LAST_NS],
        last_wait_ns=w[S_LAST_WAIT_NS],
        waiting_since_ns=w[S_WAITING_SINCE_NS],
        buckets=buckets,
    )


def read_consistent(path: Path, tries: int = 5) -> ProbeRecord:
    """Read the file under its seqlock: retry a copy taken while the writer was updating.
    Raises OSError (gone, no permission) or ProbeFileError (corrupt, truncated, always torn,
    or not a regular file: a FIFO or a link planted at this name must not hang or redirect a
    reader that may run as root)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProbeFileError("not a regular file")
        last: ProbeFileError | None = None
        for _ in range(tries):
            # The sequence before the copy, the copy, the sequence after: equal and even, or the
            # writer was at work (a copy may read its bytes in any order).
            before = _seq(fd)
            data = os.pread(fd, FILE_SIZE, 0)
            try:
                record = parse(data)
            except ProbeFileError as exc:
                last = exc
                continue
            if before % 2 == 0 and before == _WORDS.unpack_from(data)[S_SEQ] == _seq(fd):
                return record
            last = ProbeFileError("changed while read")
        raise last or ProbeFileError("unreadable")
    finally:
        os.close(fd)


def _seq(fd: int) -> int:
    """The sequence word, or -1 when the file is too short to hold it (parse says why)."""
    raw = os.pread(fd, 8, 8 * S_SEQ)
    return int.from_bytes(raw, "little") if len(raw) == 8 else -1
