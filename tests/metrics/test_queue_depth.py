"""Queue depth, read from a real queue database that gpubox.queue.store built: by kind and state,
without a daemon, without writing to the database, and with no series at all when there is no queue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.metrics.exposition import BoxCollector, exposition_text
from gpubox.metrics.queue_depth import QueueUnreadable, read_queue_depth
from gpubox.paths import resolve_paths
from gpubox.queue.jobs import KINDS, JobSpec
from gpubox.queue.layout import db_path, lock_holder, socket_path
from gpubox.queue.store import JobStore
from gpubox.telemetry.simulated import SimulatedBackend
from tests.metrics.support import key, of, run_metrics, samples

# kind: (queued, running) once the queue below is built
EXPECTED = {"train": (2, 1), "infer": (1, 1), "batch": (0, 1), "quantize": (1, 0), "other": (0, 0)}


def build_queue(db: Path) -> None:
    """Jobs of several kinds, some running, and some that ended or were cancelled (not counted)."""
    with JobStore(db) as store:
        jobs = {
            kind: [store.add(JobSpec(argv=("python", f"{kind}.py"), kind=kind)) for _ in range(n)]
            for kind, n in {"train": 4, "infer": 2, "batch": 2, "quantize": 1}.items()
        }
        for kind in ("train", "infer", "batch"):
            assert store.mark_started(jobs[kind][0].id, 1000, ["GPU-a"], "boot-1")
        assert store.mark_started(jobs["train"][1].id, 1001, ["GPU-b"], "boot-1")
        store.mark_ended(jobs["train"][1].id, 0, "succeeded")
        store.cancel(jobs["batch"][1].id)


def expected_depth() -> dict[tuple[str, str], int]:
    depth = {}
    for kind, (queued, running) in EXPECTED.items():
        depth[(kind, "queued")], depth[(kind, "running")] = queued, running
    return depth


def test_depth_by_kind_and_state(tmp_path: Path) -> None:
    db = tmp_path / "state" / "queue.db"
    build_queue(db)
    assert read_queue_depth(db) == expected_depth()
    assert set(EXPECTED) == set(KINDS)


def test_reading_changes_nothing_in_the_database(tmp_path: Path) -> None:
    db = tmp_path / "state" / "queue.db"
    build_queue(db)
    with JobStore(db) as store:
        version = store.data_version()
        before = [(j.id, j.state) for j in store.list()]
        for _ in range(3):
            read_queue_depth(db)
        assert store.data_version() == version  # another connection's commit would change it
        assert [(j.id, j.state) for j in store.list()] == before


def test_a_write_in_progress_does_not_block_the_read(tmp_path: Path) -> None:
    db = tmp_path / "state" / "queue.db"
    build_queue(db)
    with JobStore(db) as store:
        store._db.execute("BEGIN IMMEDIATE")  # the daemon in the middle of a transition
        try:
            assert read_queue_depth(db) == expected_depth()
        finally:
            store._db.execute("ROLLBACK")


def test_no_database_is_no_queue_and_is_not_created(tmp_path: Path) -> None:
    db = tmp_path / "state" / "queue.db"
    assert read_queue_depth(db) is None
    text = exposition_text(BoxCollector(SimulatedBackend(gpus=1, processes=0), queue_db=db))
    assert "gpubox_queue_jobs" not in text
    assert not db.exists() and not db.parent.exists()


def test_a_file_that_is_not_the_queue_database_is_an_error_not_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    db.write_bytes(b"not a database, just bytes " * 100)
    with pytest.raises(QueueUnreadable, match="cannot be read"):
        read_queue_depth(db)
    collector = BoxCollector(SimulatedBackend(gpus=1, processes=0), queue_db=db)
    text = exposition_text(collector)
    assert "gpubox_gpu_busy_ratio" in text and "gpubox_queue_jobs" not in text
    assert len(collector.errors) == 1 and str(db) in collector.errors[0]


def test_a_database_that_cannot_be_looked_for_is_an_error_not_a_failed_scrape(tmp_path: Path) -> None:
    # A name too long stands for a state directory this user may not search: Path.exists() raises
    # there, and a scrape that raises is a 500 with none of the GPUs' figures.
    db = tmp_path / ("s" * 300) / "queue.db"
    with pytest.raises(QueueUnreadable, match="File name too long"):
        read_queue_depth(db)
    collector = BoxCollector(SimulatedBackend(gpus=1, processes=0), queue_db=db)
    text = exposition_text(collector)
    assert "gpubox_gpu_busy_ratio" in text and "gpubox_queue_jobs" not in text
    assert len(collector.errors) == 1 and "cannot be read" in collector.errors[0]


def test_the_collector_exports_the_depth(tmp_path: Path) -> None:
    db = tmp_path / "state" / "queue.db"
    build_queue(db)
    found = samples(exposition_text(BoxCollector(SimulatedBackend(gpus=1, processes=0), queue_db=db)))
    assert of(found, "gpubox_queue_jobs") == {
        frozenset({"kind": kind, "state": state}.items()): n for (kind, state), n in expected_depth().items()
    }


def test_dump_reads_the_queue_of_this_user_without_a_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"GPUBOX_STATE_DIR": str(state), "GPUBOX_RUNTIME_DIR": str(tmp_path / "run")}
    paths = resolve_paths({**os.environ, **env})
    build_queue(db_path(paths))
    res = run_metrics("dump", "--demo", "--interval", "0.01", env=env)
    assert res.returncode == 0, res.stderr
    found = samples(res.stdout)
    for (kind, state_name), n in expected_depth().items():
        assert found[key("gpubox_queue_jobs", {"kind": kind, "state": state_name})] == n
    assert lock_holder(paths) is None and not socket_path(paths).exists()  # no daemon was started
    assert not (state / "daemon.log").exists()
