"""Fixtures for tests that run the real queue: a private state and runtime directory, the CLI
as a subprocess, and a teardown that kills every daemon, supervisor and job the test started."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpubox.paths import Paths, resolve_paths
from gpubox.queue import proctree
from gpubox.queue.store import JobStore
from tests.helpers import run_gpubox


@dataclass
class QueueBox:
    """One private queue: its environment, its paths, and the CLI bound to them."""

    home: Path
    env: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return Path(self.env["GPUBOX_STATE_DIR"])

    @property
    def runtime_dir(self) -> Path:
        return Path(self.env["GPUBOX_RUNTIME_DIR"])

    @property
    def socket(self) -> Path:
        from gpubox.paths import resolve_paths
        from gpubox.queue.layout import socket_path

        return socket_path(resolve_paths(self.env))

    @property
    def db(self) -> Path:
        return self.state_dir / "queue.db"

    def __call__(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60) -> Any:
        """Run `gpubox ARGS` with this queue's environment."""
        return run_gpubox(*args, env={**self.env, **self.extra_env, **(env or {})}, timeout=timeout)

    def add(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        """`gpubox queue add ARGS`; the new job's id (fails the test when the add fails)."""
        result = self("queue", "add", *args, env=env)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.strip())

    def processes(self) -> dict[int, str]:
        """pid -> name of each live process of this queue (its daemon, spawner, supervisors and
        jobs all carry its state directory); never another queue's, whose jobs have the same ids."""
        found = {}
        for pid in _marked(self.state_dir):
            with suppress(OSError):
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                if alive(pid):
                    found[pid] = name
        return found

    def rows(self, sql: str = "SELECT * FROM jobs ORDER BY id") -> list[tuple[Any, ...]]:
        """Rows straight from the database (read-only), to assert what is stored."""
        if not self.db.exists():
            return []
        db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return list(db.execute(sql).fetchall())
        finally:
            db.close()

    def job(self, job_id: int) -> dict[str, Any]:
        db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        db.row_factory = sqlite3.Row
        try:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return dict(row) if row else {}
        finally:
            db.close()

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 30.0) -> dict[str, Any]:
        """Poll the database until the job is in one of `states`; its row."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.job(job_id) if self.db.exists() else {}
            if row.get("state") in states:
                return row
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {row.get('state')!r}, not in {states} after {timeout}s: {row}")
            time.sleep(0.05)

    def daemon_pid(self) -> int | None:
        from gpubox.paths import resolve_paths
        from gpubox.queue.layout import lock_holder

        return lock_holder(resolve_paths(self.env))

    def start_daemon(self, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """`gpubox daemon` in the background (as systemd would run it); waits until it listens."""
        import sys

        log = open(self.home / "daemon-test.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpubox", "daemon"],
            env={**os.environ, **self.env, **self.extra_env, **(env or {})},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        sock = self.socket
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, (self.home / "daemon-test.log").read_text()
            assert time.monotonic() < deadline, "the daemon did not start listening"
            time.sleep(0.02)
        return proc


def _marked(state_dir: Path) -> set[int]:
    """Every process whose environment names this test's state directory: the daemons (also one
    still starting), spare supervisors, supervisors and jobs, which all inherit it."""
    marker = f"GPUBOX_STATE_DIR={state_dir}".encode()
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with suppress(OSError):
                if marker in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    found.add(int(name))
    return found


def kill_everything(box: QueueBox) -> None:
    """SIGKILL the daemon and every supervisor and job this test started, with their descendants."""
    for _ in range(3):  # a daemon that a client was just starting appears a moment later
        pids = _marked(box.state_dir)
        holder = box.daemon_pid()
        if holder and holder > 0:
            pids.add(holder)
        for pid in list(pids):
            pids |= proctree.descendants(pid)
        for pid in pids:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class Clock:
    """A clock the store tests set by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class NoGpus:
    """The daemon's GPU source on a box without GPUs, for a daemon run in the test's process."""

    def read(self) -> list[object]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    """Private folders for a daemon run in the test's process."""
    base = tmp_path / "box"
    return resolve_paths(
        {"HOME": str(base), "GPUBOX_STATE_DIR": str(base / "state"), "GPUBOX_RUNTIME_DIR": str(base / "run")}
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> JobStore:
    """An empty job store in a temporary folder, on the hand-set clock."""
    return JobStore(tmp_path / "state" / "queue.db", clock=clock)


def queue_env(home: Path) -> dict[str, str]:
    """The environment of a private queue under `home`."""
    return {
        "HOME": str(home),
        "GPUBOX_STATE_DIR": str(home / "state"),
        "GPUBOX_RUNTIME_DIR": str(home / "run"),
        "GPUBOX_SYSTEM_CONFIG": str(home / "etc-gpubox-config.toml"),
        # Quick tests: a short grace between SIGTERM and SIGKILL, and frequent polling.
        "GPUBOX_QUEUE_KILL_GRACE": "2",
        "GPUBOX_QUEUE_POLL_INTERVAL": "0.2",
    }


@pytest.fixture
def queue(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[QueueBox]:
    home = isolated_env
    env = queue_env(home)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # in-process calls see the same queue as the CLI
    box = QueueBox(home, env)
    try:
        yield box
    finally:
        kill_everything(box)


def alive(pid: int) -> bool:
    """Whether the process runs: a zombie (ended, not yet reaped) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def blocked_in(pid: int, where: str) -> bool:
    """Whether the process sleeps in the kernel in a function whose name holds `where` ("pipe" for
    a read of a pipe, "nanosleep" for time.sleep), from /proc/<pid>/wchan: a test sees that it
    has got to a wait rather than sleeping a guess of how long that takes."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        if wchan in ("", "0"):  # a kernel that hides it: any sleep then, less precise but near
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat[stat.rfind(")") + 2] == "S"
        return where in wchan
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
