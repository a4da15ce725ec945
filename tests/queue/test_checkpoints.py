"""The daemon's store leaves WAL checkpoints to a thread of its own (gpubox/queue/checkpoints.py):
its commits never copy the log into the database, and the log is still copied soon after."""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
from pathlib import Path

import pytest

from gpubox.paths import Paths
from gpubox.queue import checkpoints
from gpubox.queue.checkpoints import EVERY, SAFETY_NET_PAGES
from gpubox.queue.daemon import Daemon
from gpubox.queue.jobs import JobSpec
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import JobStore
from tests.queue.conftest import NoGpus, wait_until

SPEC = JobSpec(argv=("true",), cwd="/", env=dict(os.environ), gpus=0, probe=False)


def _log_frames(db: Path) -> tuple[int, int]:
    """(frames in the WAL, frames of it copied into the database), from the WAL index's header
    (SQLite's file format: mxFrame at byte 16, nBackfill at byte 96, in the machine's order)."""
    head = Path(f"{db}-shm").read_bytes()[:100]
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


def test_the_daemons_commits_are_checkpointed_by_a_thread_of_its_own(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    store = JobStore(db, durable=False)
    try:
        store.checkpoint_aside()
        assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 1000  # not in its commits
        for _ in range(3 * EVERY):  # far fewer pages than SQLite's own 1,000-page checkpoint needs
            store.add(SPEC)
        # The thread copies every frame written up to its last call, the 300th commit: all of them.
        wait_until(lambda: _log_frames(db)[0] == _log_frames(db)[1] > 0, 10, "a checkpoint of every commit")
        assert len(store.list()) == 3 * EVERY
    finally:
        store.close()
    assert [t for t in threading.enumerate() if t.name == "gpubox-checkpoint"] == []  # it ends with the store


def test_a_store_without_it_leaves_the_log_to_sqlite(tmp_path: Path) -> None:
    # What the test above tells apart: the same commits from a plain store are not copied yet.
    db = tmp_path / "queue.db"
    with JobStore(db, durable=False) as store:
        for _ in range(3 * EVERY):
            store.add(SPEC)
        frames, copied = _log_frames(db)
        assert frames > 0 and copied < frames


def _daemon_checkpoints(paths: Paths) -> tuple[int, bool, list[str]]:
    """What a daemon's store does at its first pass: the log size its commits checkpoint at,
    whether the thread runs; and the daemon's log."""
    log: list[str] = []
    daemon = Daemon(paths, QueueConfig(poll_interval_s=0.2), gpu_source=NoGpus(), log=log.append)
    seen: list[tuple[int, bool]] = []

    def one_pass(store: JobStore, full: bool = True) -> None:
        thread = any(t.name == "gpubox-checkpoint" for t in threading.enumerate())
        seen.append((store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0], thread))
        daemon._stop = True

    daemon._pass = one_pass  # type: ignore[method-assign]
    assert daemon.run() == 0
    return (*seen[0], log)


def test_the_daemon_checkpoints_aside(paths: Paths) -> None:
    pages, thread, _ = _daemon_checkpoints(paths)
    assert (pages, thread) == (SAFETY_NET_PAGES, True)


def test_a_daemon_without_a_thread_for_them_starts_and_checkpoints_in_its_commits(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Jobs that took the process limit: a thread is one more process, and the daemon is still needed.
    def no_thread(path: Path) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(checkpoints, "Checkpointer", no_thread)
    pages, thread, log = _daemon_checkpoints(paths)
    assert (pages, thread) == (1000, False)  # SQLite's own, not only its safety net
    assert "WAL checkpoints stay in the daemon's commits: can't start new thread" in log


def test_a_log_grown_past_what_sqlite_keeps_is_cut_back_when_it_restarts(tmp_path: Path) -> None:
    # Commits that outrun the thread (here: a reader holding an old snapshot, which no checkpoint
    # may pass) grow the log; once it restarts, the file gives the disk back.
    db = tmp_path / "queue.db"
    wal = Path(f"{db}-wal")
    store = JobStore(db, durable=False)
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        store.checkpoint_aside()
        store.add(SPEC)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobs").fetchone()  # its snapshot pins the log
        while wal.stat().st_size <= 2 * checkpoints.LOG_KEPT_BYTES:
            store.add(SPEC)
        reader.execute("COMMIT")
        reader.execute("PRAGMA wal_checkpoint(PASSIVE)")  # a quiet moment's checkpoint copies it all
        assert _log_frames(db)[0] == _log_frames(db)[1]
        store.add(SPEC)  # the log restarts from its beginning
        assert wal.stat().st_size <= checkpoints.LOG_KEPT_BYTES
    finally:
        reader.close()
        store.close()
