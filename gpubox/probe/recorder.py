"""Time spent waiting for batches, published into this process's probe file (see layout.py).

The file is created on the first batch and written through a shared mapping, so a batch costs
no system call. Several threads may iterate loaders at once: the time counted as waiting is
the union of their waits, so it never exceeds wall time. Each update is a run of plain stores
with no call among them, so under the GIL no other thread and no signal handler can run in its
middle; where the GIL is off, a lock takes its place.
Standard library only: this runs inside other people's training processes.
"""

from __future__ import annotations

import atexit
import mmap
import os
import sys
import threading
from contextlib import suppress
from time import monotonic_ns

from ..paths import ensure_private_dir, resolve_paths
from .layout import (
    BUCKET_NS,
    BUCKETS,
    FILE_SIZE,
    MAGIC,
    S_BATCHES,
    S_BUCKET_COUNT,
    S_BUCKETS,
    S_FIRST_NS,
    S_LAST_NS,
    S_LAST_WAIT_NS,
    S_PID,
    S_SEQ,
    S_START_TICKS,
    S_VERSION,
    S_WAIT_NS,
    S_WAITING_SINCE_NS,
    VERSION,
    probe_dir,
    probe_file,
)

_words: memoryview | None = None  # the file as uint64 words, once created
_bytes: memoryview | None = None  # the same mapping, as bytes
_path: str | None = None
_owner = 0  # the pid that created _path: only it removes the file
_inflight = 0  # waits in progress, across threads and nested loaders
_since = 0  # when the current union of waits began
_epoch = 0  # a wait begun before this (a fork) is not this process's to count
_lock: threading.Lock | None = None  # only where the GIL is off
_create_lock = threading.Lock()
_off = False


def begin() -> int:
    """A batch was asked for: mark the wait, creating the file on the first one. Returns when
    the wait began, or 0 when there is nothing to record."""
    global _inflight, _since
    if _words is None:
        if _off:
            return 0
        with _create_lock:
            if _words is None and not _off:
                _create()
    lock = _lock
    if lock is not None:
        lock.acquire()
    t0 = monotonic_ns()
    w = _words
    if w is None:  # closed by another thread meanwhile
        t0 = 0
    elif _inflight:
        _inflight += 1
    else:
        _inflight = 1
        _since = t0
        seq = w[S_SEQ]
        w[S_SEQ] = seq + 1
        w[S_WAITING_SINCE_NS] = t0
        w[S_SEQ] = seq + 2
    if lock is not None:
        lock.release()
    return t0


def end(t0: int, returned: bool) -> None:
    """The wait begun at t0 ended: with a batch when `returned`, else with an exception."""
    global _inflight
    lock = _lock
    if lock is not None:
        lock.acquire()
    t1 = monotonic_ns()
    w = _words
    if w is not None and _inflight and t0 and t0 >= _epoch:
        _inflight -= 1
        wait = 0 if _inflight else t1 - _since
        second = t1 // BUCKET_NS
        b = S_BUCKETS + 3 * (second % BUCKETS)
        seq = w[S_SEQ]
        w[S_SEQ] = seq + 1
        if returned:
            w[S_BATCHES] += 1
            w[S_LAST_NS] = t1
            w[S_LAST_WAIT_NS] = t1 - t0
        if not _inflight:  # not `if wait`: on a coarse clock a batch may come within one tick
            w[S_WAIT_NS] += wait
            w[S_WAITING_SINCE_NS] = 0
        if w[b] != second:
            w[b] = second
            w[b + 1] = 0
            w[b + 2] = 0
        if wait and t1 - wait < second * BUCKET_NS:
            # A wait that began in an earlier second (slow worker start, a new epoch): each
            # second gets its own part, or one long wait would read as 100% for a window.
            _spread(w, t1 - wait, second * BUCKET_NS)
            wait = t1 - second * BUCKET_NS
        w[b + 1] += wait
        w[b + 2] += returned
        w[S_SEQ] = seq + 2
    if lock is not None:
        lock.release()


def _spread(w: memoryview, start_ns: int, end_ns: int) -> None:
    """Add the part of a wait from start_ns to end_ns (a second boundary) to the buckets of the
    seconds it covers; only the last BUCKETS seconds are kept, so older parts are dropped."""
    first = max(start_ns // BUCKET_NS, end_ns // BUCKET_NS - BUCKETS + 1)
    for second in range(first, end_ns // BUCKET_NS):
        b = S_BUCKETS + 3 * (second % BUCKETS)
        if w[b] != second:
            w[b], w[b + 1], w[b + 2] = second, 0, 0
        w[b + 1] += min(end_ns, (second + 1) * BUCKET_NS) - max(start_ns, second * BUCKET_NS)


def _sweep(directory: str) -> None:
    """Remove probe files of processes that are gone (killed, or left through os._exit, so
    their atexit never ran): a pid with other start ticks now is another process."""
    with suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            pid, _, rest = entry.name.partition("-")
            ticks = rest[: -len(".probe")]  # not removesuffix: the probe runs in jobs' Pythons from 3.8 on
            if not (pid.isdigit() and ticks.isdigit() and rest.endswith(".probe")):
                continue
            try:
                alive = start_ticks(int(pid)) == int(ticks)
            except (OSError, ValueError, IndexError):
                alive = False
            if not alive:
                with suppress(OSError):
                    os.unlink(entry.path)


def start_ticks(pid: int | str = "self") -> int:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    # The command name (field 2) may hold spaces and parentheses; the fields after it do not.
    return int(stat.rpartition(b")")[2].split()[19])


def _create() -> None:
    global _words, _bytes, _path, _owner
    if sys.byteorder != "little":
        raise OSError("the probe file is little-endian and this machine is not")
    pid = os.getpid()
    runtime = resolve_paths().runtime_dir
    ensure_private_dir(runtime)
    ensure_private_dir(probe_dir(runtime))
    ticks = start_ticks()
    _sweep(str(probe_dir(runtime)))
    path = probe_file(runtime, pid, ticks)
    image = bytearray(FILE_SIZE)
    words = memoryview(image).cast("Q")
    words[S_VERSION], words[S_PID], words[S_START_TICKS] = VERSION, pid, ticks
    words[S_BUCKET_COUNT] = BUCKETS
    words[S_FIRST_NS] = monotonic_ns()  # the first batch is being asked for now
    words.release()
    image[:8] = MAGIC
    # Written whole under another name, then renamed: a reader never sees half a header.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, image)
        view = _map_shared(fd)
        os.rename(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    _bytes, _words = view, view.cast("Q")
    _path, _owner = str(path), pid
    _remove_in_multiprocessing_child()


def _remove_in_multiprocessing_child() -> None:
    """multiprocessing ends its fork and forkserver children with os._exit, past atexit, but
    runs its own finalizers first: a training rank started that way removes its file too."""
    util = sys.modules.get("multiprocessing.util")  # loaded wherever torch is; never imported here
    if util is not None:
        util.Finalize(None, close, exitpriority=0)


def _map_shared(fd: int) -> memoryview:
    """The file's bytes, mapped shared, keeping no file descriptor. Python's mmap keeps a copy of
    the descriptor and closes it when unmapped; a program that closed every descriptor it did not
    open (as daemons and launchers do) may have that number in use again by then, and gpubox
    would close the program's own file, or in a forked DataLoader worker a pipe it needs.
    Never unmapped: 512 bytes, gone at exit or exec, and a thread still writing is harmless."""
    import ctypes  # loaded already wherever a DataLoader runs: torch imports it

    libc = ctypes.CDLL(None, use_errno=True)
    map_file = libc.mmap  # this CDLL's own function object: setting its types touches no one else's
    map_file.restype = ctypes.c_void_p
    map_file.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    address = map_file(None, FILE_SIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == ctypes.c_void_p(-1).value:
        code = ctypes.get_errno()
        raise OSError(code, f"mmap: {os.strerror(code)}")
    return memoryview((ctypes.c_char * FILE_SIZE).from_address(address)).cast("B")


def _drop_mapping() -> None:
    global _words, _bytes, _inflight
    words, view = _words, _bytes
    _words = _bytes = None
    _inflight = 0
    with suppress(BufferError, ValueError):  # a view still held: it goes when collected
        if words is not None:
            words.release()
        if view is not None:
            view.release()


def close() -> None:
    """Unmap the file and remove it, if this process created it; no file after this."""
    global _path, _off
    _off = True
    lock = _lock
    locked = lock is not None and lock.acquire(timeout=1.0)  # let an update in progress finish
    try:
        path, owner = _path, _owner
        _path = None
        _drop_mapping()
    finally:
        if lock is not None and locked:
            lock.release()
    if path is not None and owner == os.getpid():
        with suppress(OSError):
            os.unlink(path)


def _after_fork_in_child() -> None:
    """The child keeps none of the parent's figures and never writes the parent's file."""
    global _path, _epoch, _lock, _create_lock
    _path = None
    _epoch = monotonic_ns()
    _create_lock = threading.Lock()
    if _lock is not None:
        _lock = threading.Lock()  # another thread may have held it at the fork
    _drop_mapping()


_process_hooks = False


def prepare() -> None:
    """Once per process, before the first batch: exit and fork handlers, and a lock where
    the GIL is off."""
    global _process_hooks, _lock
    if _process_hooks:
        return
    _process_hooks = True
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    if is_gil_enabled is not None and not is_gil_enabled():
        _lock = threading.Lock()
    atexit.register(close)
    os.register_at_fork(after_in_child=_after_fork_in_child)
