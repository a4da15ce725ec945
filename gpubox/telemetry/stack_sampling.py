"""Loader wait without the probe: sample GPU processes' Python stacks with py-spy.

A sample counts as blocked when the thread that drives the training loop is inside the
DataLoader's fetch path: `_BaseDataLoaderIter.__next__` and what it calls (`_next_data`,
`_get_data`, `_try_get_data`, the dataset fetch under them), Lightning's fetchers
(`_fetch_next_batch`, `__next__` of `_DataFetcher` and `_PrefetchDataFetcher`), or Accelerate's
`DataLoaderShard.__iter__` while it waits on `next`. The share of blocked samples over the last
`window_s` seconds estimates the share of wall time blocked, the figure the probe measures
exactly.

Which thread counts: the main thread, once it has been seen in the fetch path; until then (and
in programs whose loop runs in another thread), the thread seen there most. DataLoader worker
loops and the pin-memory thread never count, so a worker process reads 0, not its own fetch.

How: per watched pid, one `py-spy record --nonblocking --idle --threads --format raw` child
samples `hz` times a second (py-spy takes whole rates, at least 1) for a chunk of a few seconds,
then the next chunk starts; the figure is the sum of the chunks that ended in the last
`window_s` seconds. The target is never paused, native frames stay off, and py-spy spaces its
samples at random intervals, so they cannot lock onto a periodic training loop. A record child
costs its start-up (about 9 ms of CPU) once per chunk and about 0.4 ms per sample after it. One
`py-spy dump` per sample would pay the start-up for every sample, and its single read, which
comes at the end of that start-up, read 4 to 13 points high against the loop's own measure on a
busy 2-core box, where record chunks read within a few points. At most `MAX_CHILDREN` run at
once; beyond that the pids take turns, the longest unsampled first.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpubox.telemetry.host_procs import read_proc_stat
from gpubox.telemetry.model import Reason

MAX_CHILDREN = 8  # py-spy children at once, one per pid
CHUNK_MAX_S = 5  # a record child's duration: window_s / 2 within [1, CHUNK_MAX_S]
START_TIMEOUT_S = 10.0  # added to a chunk's allowance before a py-spy is taken as hung
MIN_SAMPLES = 4  # fewer samples in the window read as warming up
POLL_S = 0.1  # how often the thread looks at its children
FAILURES_BEFORE_ERROR = 3  # consecutive failed chunks before a pid reads "error"
BACKOFF_S = {
    Reason.NO_PERMISSION: 60.0,
    Reason.NOT_SUPPORTED: 300.0,  # not a Python process, or a Python py-spy cannot read
    Reason.ERROR: 10.0,
}

_PERMISSION_MARKS = ("permission denied", "operation not permitted", "(os error 1)", "(os error 13)")
_NOT_PYTHON_MARKS = (
    "failed to find python version",
    "failed to find a python interpreter",
    "failed to find python interpreter",
    "unsupported version of python",
)

_TORCH_DATALOADER = "torch/utils/data/dataloader.py"
_TORCH_FETCH_FUNCS = frozenset({"__next__", "_next_data", "_get_data", "_try_get_data"})
_TORCH_FETCH_QUALNAMES = frozenset(
    {
        "_BaseDataLoaderIter.__next__",
        "_SingleProcessDataLoaderIter._next_data",
        "_MultiProcessingDataLoaderIter._next_data",
        "_MultiProcessingDataLoaderIter._get_data",
        "_MultiProcessingDataLoaderIter._try_get_data",
    }
)
_LIGHTNING_FILES = ("/loops/fetchers.py", "/utilities/fetching.py")
_LIGHTNING_FUNCS = frozenset({"__next__", "_fetch_next_batch", "fetching_function"})
_ACCELERATE_FILE = "accelerate/data_loader.py"
_ACCELERATE_ITER_CLASSES = frozenset({"", "DataLoaderShard", "DataLoaderDispatcher"})
# A thread inside one of these is a DataLoader helper, never the loop waiting for a batch.
_HELPER_LOOPS = (
    ("torch/utils/data/_utils/worker.py", "_worker_loop"),
    ("torch/utils/data/_utils/pin_memory.py", "_pin_memory_loop"),
)

_THREAD_RE = re.compile(r"thread \(([^)]*)\)(?::\s?(.*))?")
_FRAME_RE = re.compile(r"(.*) \((.*):(\d+)\)")


@dataclass(frozen=True)
class Frame:
    name: str  # py-spy's function name: "Class.method" from Python 3.11, "method" before
    path: str  # the file, full or from the package on, with forward slashes

    @property
    def func(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def cls(self) -> str:
        return self.name.rpartition(".")[0].rpartition(".")[2]


def find_pyspy() -> str | None:
    """The py-spy binary: next to the running interpreter (a venv's bin), then on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def sampling_available() -> bool:
    return find_pyspy() is not None


@dataclass(frozen=True)
class SampledWait:
    fraction: float | None  # share of samples blocked in the DataLoader fetch path; None when unknown
    samples: int  # samples in the window that produced it
    reason: str | None  # a model.Reason value when fraction is None


def permission_hint_for(binary: str) -> str:
    return (
        "stack sampling needs ptrace: run gpubox as root, or grant py-spy the capability with "
        f"`sudo setcap cap_sys_ptrace+ep {binary}`, or (for your own processes) "
        "`sudo sysctl kernel.yama.ptrace_scope=0`"
    )


def failure_reason(stderr: str) -> Reason:
    """What a failed py-spy run means, from its error text."""
    text = stderr.lower()
    if any(mark in text for mark in _PERMISSION_MARKS):
        return Reason.NO_PERMISSION
    if any(mark in text for mark in _NOT_PYTHON_MARKS):
        return Reason.NOT_SUPPORTED
    return Reason.ERROR


def in_fetch_path(frames: Sequence[Frame]) -> bool:
    """Whether a thread's stack (outermost frame first) is waiting for a batch."""
    for frame in frames:
        if frame.func in ("_worker_loop", "_pin_memory_loop") and any(
            frame.path.endswith(file) and frame.func == loop for file, loop in _HELPER_LOOPS
        ):
            return False
    for i, frame in enumerate(frames):
        func, path = frame.func, frame.path
        if frame.name in _TORCH_FETCH_QUALNAMES:
            return True
        if path.endswith(_TORCH_DATALOADER) and func in _TORCH_FETCH_FUNCS:
            return True
        if "lightning" in path and path.endswith(_LIGHTNING_FILES) and func in _LIGHTNING_FUNCS:
            return True
        if path.endswith(_ACCELERATE_FILE):
            if func == "_fetch_batches":
                return True
            # The generator's frame is on the stack only while it runs; it waits on `next`
            # when the frame it called is a `__next__`.
            callee = frames[i + 1].func if i + 1 < len(frames) else ""
            if func == "__iter__" and frame.cls in _ACCELERATE_ITER_CLASSES and callee == "__next__":
                return True
    return False


@dataclass
class _Thread:
    main: bool
    samples: int = 0
    blocked: int = 0


def parse_raw(text: str, pid: int) -> dict[str, _Thread]:
    """py-spy's raw output (`thread (TID): NAME;outer (file:line);...;inner (file:line) COUNT`
    per line) as each thread's samples and blocked samples."""
    threads: dict[str, _Thread] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *rest = stack.split(";")
        match = _THREAD_RE.fullmatch(head)
        if match is None:
            continue
        tid, name = match.group(1), match.group(2)
        frames = []
        for part in rest:
            frame = _FRAME_RE.fullmatch(part)
            frames.append(Frame(frame.group(1), frame.group(2)) if frame else Frame(part, ""))
        thread = threads.setdefault(tid, _Thread(main=tid == str(pid) or name == "MainThread"))
        thread.samples += int(count)
        if in_fetch_path(frames):
            thread.blocked += int(count)
    return threads


@dataclass
class _Pid:
    start_ticks: int | None = None
    chunks: deque[tuple[float, int, int]] = field(default_factory=deque)  # (ended, blocked, samples)
    main_fetches: bool = False  # the main thread has been seen waiting for a batch
    retry_at: float = 0.0
    last_end: float = 0.0  # when its last chunk ended: who goes first when the pids take turns
    reason: Reason | None = None  # why the last chunks failed; None after a good one
    failures: int = 0
    tried: bool = False


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    out: IO[bytes]  # unnamed files: nothing is left on disk, however the process ends
    err: IO[bytes]
    start_ticks: int
    deadline: float

    def read(self) -> tuple[str, str]:
        texts = []
        for fh in (self.out, self.err):
            try:
                fh.seek(0)
                texts.append(fh.read().decode("utf-8", "replace"))
            except OSError:
                texts.append("")
            finally:
                fh.close()
        return texts[0], texts[1]


class StackSampler:
    """Samples the watched pids from one daemon thread; `result` reads the latest figures."""

    def __init__(self, hz: float = 2.0, window_s: float = 10.0) -> None:
        if not (hz > 0 and window_s > 0):
            raise ValueError("hz and window_s must be positive")
        self.hz = hz
        self.window_s = window_s
        self.permission_hint: str | None = None
        self._binary = find_pyspy()
        self._rate = max(1, round(hz))
        self._chunk_s = max(1, min(CHUNK_MAX_S, math.floor(window_s / 2)))
        self._clock: Callable[[], float] = time.monotonic
        self._pids: dict[int, _Pid] = {}
        self._children: dict[int, _Child] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False  # the thread met an unexpected error and stopped

    def update(self, pids: Iterable[int]) -> None:
        wanted = set(pids)
        with self._lock:
            for gone in self._pids.keys() - wanted:
                del self._pids[gone]
            for pid in wanted - self._pids.keys():
                self._pids[pid] = _Pid()
            if wanted and self._binary is not None and self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="gpubox-stack-sampler", daemon=True)
                self._thread.start()

    def result(self, pid: int) -> SampledWait | None:
        with self._lock:
            state = self._pids.get(pid)
            if state is None:
                return None
            if self._binary is None:
                return SampledWait(None, 0, Reason.NOT_MEASURED.value)
            if self._broken:
                return SampledWait(None, 0, Reason.ERROR.value)
            self._prune(state, self._clock())
            n = sum(samples for _, _, samples in state.chunks)
            if state.reason in (Reason.NO_PERMISSION, Reason.NOT_SUPPORTED):
                return SampledWait(None, n, state.reason.value)
            if n >= MIN_SAMPLES:
                return SampledWait(sum(blocked for _, blocked, _ in state.chunks) / n, n, None)
            if state.reason is not None:
                return SampledWait(None, n, state.reason.value)
            if not state.tried:
                return None
            return SampledWait(None, n, Reason.WARMING_UP.value)

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
            for child in self._children.values():
                child.proc.kill()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # The sampling thread.

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._reap()
                self._launch()
                self._stop.wait(POLL_S)
        except Exception:
            # Sampling is a best-effort extra: stop and read "error" rather than take the caller down.
            self._broken = True
        finally:
            with self._lock:
                children, self._children = list(self._children.values()), {}
            for child in children:
                child.proc.kill()
                child.proc.wait()
                child.read()

    def _launch(self) -> None:
        assert self._binary is not None
        now = self._clock()
        with self._lock:
            due = [p for p, s in self._pids.items() if p not in self._children and s.retry_at <= now]
            due.sort(key=lambda p: self._pids[p].last_end)
            for pid in due[: MAX_CHILDREN - len(self._children)]:
                if self._stop.is_set():
                    return
                try:
                    start_ticks = read_proc_stat(pid)[1]
                except (OSError, IndexError, ValueError):
                    del self._pids[pid]  # exited
                    continue
                if not _runs_python(pid):
                    # py-spy would spawn only to fail: skip it (one spawn costs ~10 ms of CPU).
                    self._failed(self._pids[pid], Reason.NOT_SUPPORTED, now)
                    continue
                argv = [self._binary, "record", "--pid", str(pid), "--rate", str(self._rate)]
                argv += ["--duration", str(self._chunk_s), "--nonblocking", "--idle", "--threads", "--format", "raw"]
                try:
                    proc, out, err = _spawn(argv)
                except OSError:
                    self._failed(self._pids[pid], Reason.ERROR, now)
                    continue
                deadline = now + START_TIMEOUT_S + 3 * self._chunk_s
                self._children[pid] = _Child(proc, out, err, start_ticks, deadline)
                self._pids[pid].tried = True

    def _reap(self) -> None:
        now = self._clock()
        with self._lock:
            running = [(pid, child, pid in self._pids) for pid, child in self._children.items()]
        for pid, child, watched in running:
            rc = child.proc.poll()
            if rc is None:
                if now > child.deadline or not watched:
                    child.proc.kill()
                continue
            text, err = child.read()
            alive = _alive(pid, child.start_ticks)
            with self._lock:
                del self._children[pid]
                state = self._pids.get(pid)
                if state is None or self._stop.is_set():
                    continue
                if state.start_ticks != child.start_ticks:  # the first chunk, or a recycled pid
                    state = self._pids[pid] = _Pid(start_ticks=child.start_ticks, tried=True)
                state.last_end = now
                if not alive:  # exited: dropped, with what it had left
                    del self._pids[pid]
                elif rc == 0:
                    self._record(state, parse_raw(text, pid), now)
                else:
                    self._failed(state, failure_reason(err) if now <= child.deadline else Reason.ERROR, now)

    def _record(self, state: _Pid, threads: dict[str, _Thread], now: float) -> None:
        main = next((t for t in threads.values() if t.main), None)
        if main is not None and main.blocked:
            state.main_fetches = True
        if main is not None and state.main_fetches:
            blocked, samples = main.blocked, main.samples
        else:
            blocked = max((t.blocked for t in threads.values()), default=0)
            samples = max((t.samples for t in threads.values()), default=0)
        if samples:
            state.chunks.append((now, blocked, samples))
        self._prune(state, now)
        state.reason, state.failures = None, 0

    def _failed(self, state: _Pid, reason: Reason, now: float) -> None:
        state.failures += 1
        if reason is Reason.NO_PERMISSION and self._binary is not None and self.permission_hint is None:
            self.permission_hint = permission_hint_for(self._binary)
        if reason is not Reason.ERROR or state.failures >= FAILURES_BEFORE_ERROR:
            state.reason = reason
            state.retry_at = now + BACKOFF_S[reason]

    def _prune(self, state: _Pid, now: float) -> None:
        while state.chunks and state.chunks[0][0] < now - self.window_s:
            state.chunks.popleft()


def _runs_python(pid: int) -> bool:
    """Whether the process's executable is a Python interpreter; True when we may not look."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except PermissionError:
        return True
    except OSError:
        return False
    return exe.startswith("python") or exe.startswith("pypy")


def _alive(pid: int, start_ticks: int) -> bool:
    try:
        return read_proc_stat(pid)[1] == start_ticks
    except (OSError, IndexError, ValueError):
        return False


def _spawn(argv: list[str]) -> tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]:
    """Start py-spy writing its output and its errors to unnamed files."""
    with contextlib.ExitStack() as opened:
        out = opened.enter_context(tempfile.TemporaryFile())
        err = opened.enter_context(tempfile.TemporaryFile())
        proc = subprocess.Popen(
            [*argv, "--output", f"/dev/fd/{out.fileno()}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0"),
            pass_fds=(out.fileno(),),
        )
        opened.pop_all()
        return proc, out, err
