"""A job's stdout and stderr, each through a pipe that its supervisor copies to the attempt's log
(`<prefix>.out`, `<prefix>.err`), made at the first byte.

A file made for each stream of each job costs a new inode, and most jobs leave at least one of
the two empty: on a stream of short jobs that was the most expensive thing a supervisor did
(ext4 without a journal scans past every inode freed in the last minutes). A log is made only
when there is something to put in it, or a note of gpubox's own.

The pipes add no way for a job to die: a supervisor that dies is noticed by the daemon, which
stops what it ran anyway. The supervisor stops whatever the job left running before it closes
the pipes, and whatever the job wrote before it ended is still in them then, copied before the
supervisor reports the end. A write to a log that fails (a full disk) loses that output, as the
job's own write would have failed; the job is never held back by it, and does not see it fail:
the log says where output was lost, and how much, once it takes writes again.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

# O_NONBLOCK: a FIFO put where a log goes would block the open until something reads it, and the
# supervisor with it; now the open fails (or a write would block), and the output is lost, said
# as any other. A regular file's writes are the same either way.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK
_CHUNK = 1 << 16


class LogRelay:
    """One stream of a job: the pipe's write end goes to the job, the read end is copied to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.read_end, False)
        self._file = -1
        self._lost = 0  # bytes dropped since the log last took a write
        self._why = ""
        self.open = True  # False once every writer closed the pipe (EOF) or the relay is closed

    def started(self) -> None:
        """The job has its own copy of the write end: the supervisor's goes, so that EOF comes
        once the job's processes are done with it."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1

    def pump(self, most: int = 16) -> None:
        """Copy what the pipe holds now to the log, without blocking. At most `most` reads a call,
        by default 1 MiB, what the largest pipe a job may ask for without privileges holds: a job
        that refills it as fast as it is read must not keep its supervisor from its other duties
        (a time limit, a cancel)."""
        for _ in range(most):
            if not self.open:
                return
            try:
                chunk = os.read(self.read_end, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.open = False  # EOF: no writer is left
                return
            self._append(chunk)

    def note(self, message: str) -> None:
        """A line of gpubox's own, after what the job wrote before it."""
        self.pump()
        self._append(f"gpubox: {message}\n".encode(errors="replace"))

    def _append(self, data: bytes) -> None:
        if self._lost:  # a gap the job never saw: marked where it is, once the log takes writes
            gap = f"gpubox: {self._lost} byte(s) of output lost here: {self._why}\n".encode()
            if self._write(gap) < len(gap):
                self._lost += len(data)
                return
            self._lost = 0
        self._lost += len(data) - self._write(data)

    def _write(self, data: bytes) -> int:
        """How much of `data` reached the log (all, unless a write failed: a full disk, say)."""
        done = 0
        try:
            if self._file >= 0 and os.fstat(self._file).st_nlink == 0:
                # Removed (the logs folder, to free space, say): holding it would keep that space
                # taken and the rest unseen. What follows goes to a new log.
                os.close(self._file)
                self._file = -1
            if self._file < 0:
                self._file = self._open()
            view = memoryview(data)
            while done < len(view):
                done += os.write(self._file, view[done:])
        except OSError as exc:
            self._why = exc.strerror or str(exc)
        return done

    def _open(self) -> int:
        try:
            return os.open(self.path, _FLAGS, 0o600)
        except FileNotFoundError:  # the logs folder was removed (to free space, say): made
            with suppress(FileExistsError):  # again (maybe by another job's relay just now),
                os.mkdir(self.path.parent, 0o700)  # but not a whole state folder
            return os.open(self.path, _FLAGS, 0o600)

    def close(self) -> None:
        """Copy what is left, then close every end: the job and what it left are gone, so nothing
        refills the pipe (a larger one than usual, which a job may ask for as root, is read whole)."""
        self.pump(most=1 << 12)
        if self._lost:
            self._append(b"")  # the last chance to say that the end was lost
        for fd in (self.read_end, self.write_end, self._file):
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)
        self.read_end = self.write_end = self._file = -1
        self.open = False


def readable(relays: Sequence[LogRelay]) -> list[int]:
    """The read ends still worth waiting on."""
    return [r.read_end for r in relays if r.open]


def pump_all(relays: Sequence[LogRelay]) -> None:
    for relay in relays:
        relay.pump()


def copy_while_waiting(relays: Sequence[LogRelay], timeout_s: float) -> None:
    """Sleep up to `timeout_s`, copying what the job writes meanwhile (a job that writes much as
    it stops must not block on a full pipe while its supervisor waits for it)."""
    deadline = time.monotonic() + timeout_s
    while fds := readable(relays):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if select.select(fds, [], [], left)[0]:  # (a call a signal cuts short is retried)
            pump_all(relays)
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)
