"""Running real training programs (torch on the CPU) in subprocesses, and reading their probe files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpubox.probe import layout

# Prepended to every program: a dataset that sleeps a known time per item, a busy-waiting
# training step, and pause(), which lets the test read the probe file while the program lives.
PRELUDE = '''
import os, sys, time

def pause(tag):
    print(tag, flush=True)
    sys.stdin.readline()

def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

def sleepy(n, seconds):
    from torch.utils.data import Dataset

    class Sleepy(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            time.sleep(seconds)
            return i

    return Sleepy()

def timed_next(it):
    """next(it) and how long it took, measured outside the probe."""
    t0 = time.monotonic_ns()
    batch = next(it)
    return batch, time.monotonic_ns() - t0
'''


# -I: gpubox's own interpreter ignores PYTHONPATH, so what a test sets there reaches only the program.
GPUBOX_RUN = [sys.executable, "-I", "-m", "gpubox", "run"]


def write_program(tmp_path: Path, body: str, name: str = "program.py") -> Path:
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def python_cmd(script: Path, *args: str, via_run: bool = False, python: str = sys.executable) -> list[str]:
    cmd = [python, "-W", "ignore", str(script), *args]
    return [*GPUBOX_RUN, *cmd] if via_run else cmd


def run(
    cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


class Running:
    """A program that calls pause(tag): wait for the tag, look, then let it go on."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []

    def wait_for(self, tag: str) -> str:
        """The line that starts with `tag` (the rest of it is the program's report)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(tag):
                return line[len(tag) :].strip()
        self.proc.wait(30)
        raise AssertionError(f"exited {self.proc.returncode} before {tag!r}: {self.finish_output()}")

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out, err

    def finish_output(self) -> str:
        try:
            out, err = self.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError):
            return "".join(self.lines)
        return "".join(self.lines) + out + err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def probe_files(runtime: Path) -> list[Path]:
    directory = layout.probe_dir(runtime)
    return sorted(directory.glob("*.probe")) if directory.is_dir() else []


def only_record(runtime: Path, pid: int) -> layout.ProbeRecord:
    files = probe_files(runtime)
    assert [f.name.partition("-")[0] for f in files] == [str(pid)], files
    return layout.read_consistent(files[0])


def wait_for_file(runtime: Path, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = probe_files(runtime)
        if files:
            return files[0]
        time.sleep(0.01)
    raise AssertionError("no probe file appeared")


def torn(record: layout.ProbeRecord) -> list[str]:
    """What cannot be true of a record written whole; each update writes all of these together."""
    problems = []
    bucket_batches = sum(b for _, _, b in record.buckets)
    bucket_wait = sum(w for _, w, _ in record.buckets)
    if bucket_batches > record.batches or bucket_wait > record.wait_ns:
        problems.append("buckets ahead of the totals")
    # Until a bucket is reused the buckets hold every batch and wait: then the sums are exact.
    young = record.last_ns - record.first_ns < (layout.BUCKETS - 2) * layout.BUCKET_NS
    if young and (bucket_batches, bucket_wait) != (record.batches, record.wait_ns):
        problems.append("buckets behind the totals")
    if record.batches:
        last = record.last_ns // layout.BUCKET_NS
        if not any(s == last and b > 0 for s, _, b in record.buckets):
            problems.append("no bucket for the last batch's second")
        if not record.first_ns <= record.last_ns or record.last_wait_ns > record.last_ns - record.first_ns:
            problems.append("last batch outside the first-to-last span")
    if record.waiting_since_ns and record.waiting_since_ns < record.first_ns:
        problems.append("waiting since before the first batch")
    return problems


# Looked up, not imported: the test process itself never loads torch.
requires_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
