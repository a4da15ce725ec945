"""The job store against real SQLite files: round trips, validation, atomicity, concurrency."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from gpubox.queue.jobs import spec_to_json
from gpubox.queue.store import Job, JobSpec, JobStore, StoreError
from tests.queue.conftest import Clock


def count_rows(path: Path, table: str = "jobs") -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        db.close()


def full_spec(after: tuple[int, ...] = ()) -> JobSpec:
    return JobSpec(
        argv=("python", "train.py", "--lr", "3e-4", "a b"),
        cwd="/home/u/proj",
        env={"PATH": "/usr/bin", "HF_HOME": "/data/hf"},
        kind="train",
        name="nightly",
        gpus=2,
        gpu_ids=("GPU-aaaa", "GPU-bbbb"),
        gpu_mem_bytes=40 << 30,
        priority=5,
        after=after,
        time_limit_s=7200.0,
        retries=3,
        tags={"team": "nlp", "cost": "c-12"},
        shell=True,
        probe=False,
        share=True,
    )


def test_round_trip_of_every_field(store: JobStore, clock: Clock) -> None:
    first = store.add(JobSpec(argv=("true",)))
    spec = full_spec(after=(first.id,))
    job = store.add(spec)
    got = store.get(job.id)
    assert got == job
    assert got is not None and got.spec == spec and got.state == "queued"
    assert got.submitted_at == clock.now and got.attempt == 0 and got.started_at is None
    assert store.list() == [store.get(first.id), got]
    assert store.list(["queued"]) == store.list()
    assert store.list(["running"]) == []
    assert store.get(9999) is None


def test_reopen_keeps_jobs(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "q.db"
    with JobStore(path, clock=clock) as s:
        job = s.add(full_spec())
    with JobStore(path, clock=clock) as s:
        assert s.get(job.id) == job


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec(argv=()), "the command is empty"),
        (JobSpec(argv=("",)), "the command is empty"),
        (JobSpec(argv=("x",), kind="gaming"), "unknown kind 'gaming'"),
        (JobSpec(argv=("x",), gpus=-1), "GPU count"),
        (JobSpec(argv=("x",), gpu_mem_bytes=-3), "must be positive"),
        (JobSpec(argv=("x",), time_limit_s=0), "time limit"),
        (JobSpec(argv=("x",), retries=-1), "retries"),
        (JobSpec(argv=("x",), after=(42,)), "job 42 (named in --after) does not exist"),
    ],
)
def test_bad_input_changes_nothing(store: JobStore, spec: JobSpec, message: str) -> None:
    store.add(JobSpec(argv=("true",)))
    with pytest.raises(ValueError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        store.add(spec)
    assert count_rows(store.path) == 1


def test_add_many_is_all_or_nothing(store: JobStore) -> None:
    good = [JobSpec(argv=("echo", str(i))) for i in range(5)]
    with pytest.raises(ValueError, match="job 77"):
        store.add_many([*good, JobSpec(argv=("x",), after=(77,))])
    assert count_rows(store.path) == 0
    with pytest.raises(ValueError, match="unknown kind"):
        store.add_many([*good, JobSpec(argv=("x",), kind="nope")])
    assert count_rows(store.path) == 0
    jobs = store.add_many(good)
    assert [j.spec for j in jobs] == good
    assert len({j.id for j in jobs}) == 5
    assert store.list() == jobs


def _client(path: str, n: int, out: multiprocessing.Queue[list[int]]) -> None:
    s = JobStore(Path(path))
    out.put([s.add(JobSpec(argv=("echo", str(i)))).id for i in range(n)])
    s.close()


def test_concurrent_clients_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    JobStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(str(path), 50, out)) for _ in range(10)]
    for p in procs:
        p.start()
    ids = [i for _ in procs for i in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(ids) == 500 and len(set(ids)) == 500
    assert count_rows(path) == 500
    assert sorted(j.id for j in JobStore(path).list()) == sorted(ids)


def _first_open(path: str, start: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue[str]) -> None:
    start.wait()
    try:
        JobStore(Path(path)).close()
        out.put("ok")
    except StoreError as e:
        out.put(str(e))


def test_clients_creating_the_database_at_once_all_open_it(tmp_path: Path) -> None:
    # Seen as "an SQLite database, but not gpubox's" (the tables of one client's schema, read
    # before its version) and as "database is locked" (the switch to WAL mode).
    ctx = multiprocessing.get_context("spawn")
    for trial in range(4):
        path = tmp_path / f"{trial}" / "q.db"
        start = ctx.Barrier(10)
        out: multiprocessing.Queue[str] = ctx.Queue()
        procs = [ctx.Process(target=_first_open, args=(str(path), start, out)) for _ in range(10)]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert results == ["ok"] * 10


def test_concurrent_threads_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    JobStore(path).close()
    ids: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        s = JobStore(path)
        got = [s.add(JobSpec(argv=("true",))).id for _ in range(50)]
        s.close()
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=work) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 500 and len(set(ids)) == 500


def _start(path: Path, job_id: int, boot: str, barrier: threading.Barrier, results: list[bool]) -> None:
    s = JobStore(path)
    barrier.wait()
    results.append(s.mark_started(job_id, 123, ["GPU-a"], boot))
    s.close()


def test_a_job_starts_at_most_once(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    for _ in range(20):
        job = JobStore(path).add(JobSpec(argv=("true",)))
        barrier = threading.Barrier(2)
        results: list[bool] = []
        threads = [threading.Thread(target=_start, args=(path, job.id, b, barrier, results)) for b in ("b1", "b2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, True]
        assert len(JobStore(path).attempts(job.id)) == 1


def test_state_transitions(store: JobStore, clock: Clock) -> None:
    job = store.add(JobSpec(argv=("true",), retries=0))
    clock.now = 1010.0
    assert store.mark_started(job.id, 4242, ["GPU-a", "GPU-b"], "boot-1", log_path="/l/1.log")
    assert not store.mark_started(job.id, 4243, ["GPU-a"], "boot-1")
    running = store.get(job.id)
    assert isinstance(running, Job)
    assert (running.state, running.pid, running.gpu_uuids, running.boot_id) == (
        "running",
        4242,
        ("GPU-a", "GPU-b"),
        "boot-1",
    )
    assert running.started_at == 1010.0 and running.attempt == 1
    clock.now = 1020.0
    ended = store.mark_ended(job.id, 3, "failed", reason="exit code 3")
    assert (ended.state, ended.exit_code, ended.ended_at, ended.reason) == (
        "failed",
        3,
        1020.0,
        "exit code 3",
    )
    (attempt,) = store.attempts(job.id)
    assert (attempt.number, attempt.exit_code, attempt.ended_at, attempt.log_path) == (
        1,
        3,
        1020.0,
        "/l/1.log",
    )
    with pytest.raises(ValueError, match="is failed, not running"):
        store.mark_ended(job.id, 0, "succeeded")
    with pytest.raises(ValueError, match="not an end state"):
        store.mark_ended(job.id, 0, "queued")
    with pytest.raises(ValueError, match="does not exist"):
        store.mark_ended(999, 0, "failed")
    assert not store.mark_started(job.id, 1, [], "boot-1")
    with pytest.raises(ValueError, match="unknown state"):
        store.list(["done"])


def test_cancel(store: JobStore, clock: Clock) -> None:
    queued = store.add(JobSpec(argv=("true",)))
    running = store.add(JobSpec(argv=("sleep", "9")))
    assert store.mark_started(running.id, 77, [], "boot-1")
    clock.now = 1005.0
    cancelled = store.cancel(queued.id)
    assert cancelled.state == "cancelled" and cancelled.ended_at == 1005.0
    assert not store.mark_started(queued.id, 1, [], "boot-1")
    still = store.cancel(running.id)
    assert still.state == "running" and still.pid == 77
    assert store.mark_ended(running.id, -15, "cancelled").state == "cancelled"
    with pytest.raises(ValueError, match="job 404 does not exist"):
        store.cancel(404)


def test_lost_after_reboot(store: JobStore) -> None:
    old = store.add(JobSpec(argv=("a",)))
    new = store.add(JobSpec(argv=("b",)))
    queued = store.add(JobSpec(argv=("c",)))
    assert store.mark_started(old.id, 1, ["GPU-a"], "boot-1")
    assert store.mark_started(new.id, 2, ["GPU-b"], "boot-2")
    assert store.lost_after_reboot("boot-2") == [old.id]
    lost = store.get(old.id)
    assert lost is not None and lost.state == "lost" and lost.reason
    assert [j.state for j in store.list()] == ["lost", "running", "queued"]
    assert store.lost_after_reboot("boot-2") == []
    assert store.get(queued.id) == queued


def test_clean(store: JobStore, clock: Clock) -> None:
    a, b, c = store.add_many([JobSpec(argv=(x,)) for x in "abc"])
    assert store.mark_started(a.id, 1, [], "boot")
    store.mark_ended(a.id, 0, "succeeded")
    assert store.mark_started(b.id, 1, [], "boot")
    clock.now = 1000.0 + 7 * 86400
    store.cancel(c.id)
    assert store.clean(older_than_s=86400) == [a.id]
    assert [j.id for j in store.list()] == [b.id, c.id]
    assert count_rows(store.path, "attempts") == 1
    clock.now += 2 * 86400
    assert store.clean(older_than_s=86400) == [c.id]


def test_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"this is not a database, just some text" * 200)
    with pytest.raises(StoreError, match="corrupt or not a gpubox database"):
        JobStore(path)
    assert path.read_bytes().startswith(b"this is not a database")


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not gpubox's"):
        JobStore(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    JobStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="schema 99"):
        JobStore(path)


# The jobs table as gpubox wrote it at schema 1, word for word (before jobs.queued_at).
SCHEMA_1_JOBS = """CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, spec TEXT NOT NULL, kind TEXT NOT NULL, name TEXT,
    priority INTEGER NOT NULL, state TEXT NOT NULL, submitted_at REAL NOT NULL, started_at REAL,
    ended_at REAL, attempt INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER, gpu_uuids TEXT, pid INTEGER, pid_start INTEGER, boot_id TEXT, reason TEXT,
    request TEXT)"""


def test_a_schema_1_database_is_migrated_and_keeps_its_jobs(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "q.db"
    JobStore(path).close()  # the other tables, as schema 1 had them too
    db = sqlite3.connect(path)
    db.execute("DROP TABLE jobs")
    db.execute(SCHEMA_1_JOBS)
    spec = spec_to_json(JobSpec(argv=("true",), cwd="/", env={}))
    db.execute(
        "INSERT INTO jobs (spec, kind, priority, state, submitted_at, started_at, ended_at, attempt, exit_code)"
        " VALUES (?, 'other', 0, 'failed', 100.0, 110.0, 120.0, 1, 3)",
        (spec,),
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = JobStore(path, clock=clock)
    old = store.require(1)
    assert (old.state, old.exit_code, old.queued_at) == ("failed", 3, None)  # never queued again
    again = store.requeue(1)
    assert (again.state, again.started_at, again.queued_at) == ("queued", None, clock())
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()


def test_private_files_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "state" / "gpubox" / "queue.db"
    s = JobStore(path)
    s.add(JobSpec(argv=("true",)))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()
    s.close()


class _FullDisk:
    """The store's connection, whose COMMIT fails as on a full disk."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)


def test_a_commit_that_fails_is_one_store_error_and_keeps_nothing(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "q.db")
    real = store._db
    store._db = _FullDisk(real)  # type: ignore[assignment]
    with pytest.raises(StoreError, match=r"failed \(database or disk is full\)"):
        store.add(JobSpec(argv=("true",)))
    store._db = real
    assert not real.in_transaction
    assert store.list() == []
    assert store.add(JobSpec(argv=("true",))).id == 1  # the store is usable once the disk has room
    store.close()


def test_a_job_stored_before_a_check_existed_can_still_be_edited(tmp_path: Path) -> None:
    # Names with control characters were accepted once: such a job keeps its name, and an edit
    # of its priority checks only what it changes.
    store = JobStore(tmp_path / "q.db")
    job = store.add(JobSpec(argv=("true",), cwd="/", env={}, name="ok"))
    old = spec_to_json(JobSpec(argv=("true",), cwd="/", env={}, name="a\tb"))
    store._db.execute("UPDATE jobs SET spec = ?, name = 'a\tb' WHERE id = ?", (old, job.id))
    edited = store.edit(job.id, {"priority": 5})
    assert (edited.spec.priority, edited.spec.name) == (5, "a\tb")
    with pytest.raises(ValueError, match="invalid priority"):
        store.edit(job.id, {"priority": 10**9})  # what it changes is still checked
    store.close()


class _DiskError:
    """A connection whose every statement after BEGIN fails as when the WAL's side files cannot
    be made (a full disk)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._began = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self._began and sql != "ROLLBACK":
            raise sqlite3.OperationalError("disk I/O error")
        self._began = self._began or sql == "BEGIN"
        return self._db.execute(sql, *args)


def test_a_database_that_cannot_be_read_now_is_not_called_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpubox.queue.store as store_module

    real = sqlite3.connect
    monkeypatch.setattr(store_module.sqlite3, "connect", lambda *a, **k: _DiskError(real(*a, **k)))
    with pytest.raises(StoreError) as caught:
        JobStore(tmp_path / "q.db")
    assert str(caught.value) == f"cannot open the job database {tmp_path / 'q.db'}: disk I/O error"


def test_damage_found_in_use_is_named_as_such_with_sqlite_extended_codes(tmp_path: Path) -> None:
    """A damaged index (SQLITE_CORRUPT_INDEX, 779) is damage as much as SQLITE_CORRUPT (11)."""
    with JobStore(tmp_path / "queue.db") as store:
        for code, damaged in ((11, True), (779, True), (523, True), (26, True), (5, False), (13, False)):
            error = sqlite3.DatabaseError("database disk image is malformed")
            error.sqlite_errorcode = code
            assert ("is damaged" in str(store._failed(error))) is damaged, code
