"""The job store: every job and every attempt, in one SQLite database under the state directory.

The database runs in WAL mode with a 10 s busy timeout, and every read-then-write happens inside
`BEGIN IMMEDIATE`, so concurrent clients never lose or duplicate a job. A job leaves `queued` for
`running` once per attempt: `mark_started` is a compare-and-set, and the caller that gets False
must not start the process. An attempt ends once: `finish` names the attempt it ends. Bad input
raises ValueError with one clear message and writes nothing; a database that cannot be read
raises StoreError.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

from gpubox.paths import ensure_private_dir
from gpubox.queue.jobs import (
    END_STATES,
    KINDS,
    OUTCOMES,
    STATES,
    Attempt,
    Job,
    JobSpec,
    check_spec,
    spec_from_json,
    spec_to_json,
)

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

    from gpubox.queue.checkpoints import Checkpointer

__all__ = ["END_STATES", "STATES", "Attempt", "Job", "JobSpec", "JobStore", "StoreError"]

SCHEMA_VERSION = 2  # 2: jobs.queued_at
QUEUE = "queue"  # the pause target that stops the whole queue; a GPU's is its UUID
_IDS_PER_READ = 500  # ids bound in one statement (SQLite before 3.32 takes at most 999)

# Schema version N to N+1 is _MIGRATIONS[N - 1]: run in order, in one transaction, by the first
# gpubox that opens an older database (a gpubox that knows an older schema refuses a newer one).
_MIGRATIONS = (
    "ALTER TABLE jobs ADD COLUMN queued_at REAL",  # 1 -> 2: when a job was queued again (NULL: never)
)

_SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    spec TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    priority INTEGER NOT NULL,
    state TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    attempt INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    gpu_uuids TEXT,
    pid INTEGER,
    pid_start INTEGER,
    boot_id TEXT,
    reason TEXT,
    request TEXT,
    queued_at REAL
);
CREATE INDEX jobs_state ON jobs(state);
CREATE INDEX jobs_rank ON jobs(state, kind, priority DESC, submitted_at, id);
CREATE TABLE attempts (
    job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    exit_code INTEGER,
    gpu_uuids TEXT NOT NULL,
    pid INTEGER,
    boot_id TEXT NOT NULL,
    log_path TEXT,
    outcome TEXT,
    reason TEXT,
    PRIMARY KEY (job_id, number)
);
CREATE TABLE paused (
    target TEXT PRIMARY KEY,
    since REAL NOT NULL
);
"""


def not_editable(job_id: int, state: str) -> str | None:
    """Why a job in `state` cannot be edited, or None when it can (it is queued)."""
    if state == "queued":
        return None
    where = "is running" if state == "running" else f"has ended ({state})"
    return f"job {job_id} {where}; only a queued job can be edited"


class StoreError(Exception):
    """The job database cannot be opened or used."""


def _printable(text: str | None) -> str | None:
    """Text SQLite can store: bytes that were not UTF-8 (a file name, say) become escapes."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _job_from_row(row: sqlite3.Row) -> Job:
    uuids = row["gpu_uuids"]
    return Job(
        id=row["id"],
        spec=spec_from_json(row["spec"]),
        state=row["state"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        attempt=row["attempt"],
        exit_code=row["exit_code"],
        gpu_uuids=tuple(json.loads(uuids)) if uuids else (),
        pid=row["pid"],
        pid_start=row["pid_start"],
        boot_id=row["boot_id"],
        reason=row["reason"],
        request=row["request"],
        failures=row["failures"],
        queued_at=row["queued_at"],
    )


def _attempt_from_row(r: sqlite3.Row) -> Attempt:
    return Attempt(
        job_id=r["job_id"],
        number=r["number"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        exit_code=r["exit_code"],
        gpu_uuids=tuple(json.loads(r["gpu_uuids"])),
        pid=r["pid"],
        boot_id=r["boot_id"],
        log_path=r["log_path"],
        outcome=r["outcome"],
        reason=r["reason"],
    )


def file_identity(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` now (device, inode), to tell it from one made there since; None when
    nothing is there; OSError when that cannot be told."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino


class JobStore:
    """The queue's jobs and attempts in SQLite; one instance per thread or process."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, durable: bool = True) -> None:
        """`durable=False` (the daemon's state changes) commits without waiting for the disk: a
        power cut may lose the last transitions, never a submission, and the database stays
        whole (WAL with synchronous=NORMAL). Submissions always wait for the disk."""
        self.path = Path(path)
        self._clock = clock
        self._in_transaction = False
        # Write transactions this connection committed: with `data_version` (other connections'
        # commits), whether the database is still as it was when something was read.
        self.writes = 0
        self._checkpointer: Checkpointer | None = None
        try:
            ensure_private_dir(self.path.parent)
            # One JobStore per process: closing this descriptor would drop the POSIX locks of any
            # SQLite connection this process already holds on the file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            os.chmod(self.path, 0o600)
        except OSError as e:
            raise StoreError(f"cannot open the job database {self.path}: {e.strerror or e}") from None
        try:
            self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the job database {self.path}: {e}") from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("PRAGMA foreign_keys = ON")
            if not durable:
                self._db.execute("PRAGMA synchronous = NORMAL")
            self._refuse_foreign()  # before WAL mode, which would change someone else's file
            mode = self._wal()
            if mode.lower() != "wal":
                raise StoreError(f"the job database {self.path} cannot use WAL mode")
            self._init_schema()
        except sqlite3.OperationalError as e:  # a full disk, side files that cannot be made: not corrupt
            self._db.close()
            raise StoreError(f"cannot open the job database {self.path}: {e}") from None
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(f"the job database {self.path} is corrupt or not a gpubox database ({e})") from None
        except StoreError:
            self._db.close()
            raise
        try:
            self._opened = file_identity(self.path)  # None (not known): never taken for replaced
        except OSError:
            self._opened = None
        for suffix in ("-wal", "-shm"):
            side = Path(f"{self.path}{suffix}")
            if side.exists():
                os.chmod(side, 0o600)

    def replaced(self) -> bool:
        """Whether the file at this store's path is no longer the one it opened (the state folder
        removed, or the database moved aside): what this connection reads then never changes
        again. False when that cannot be told (a folder made unreadable)."""
        try:
            return self._opened is not None and file_identity(self.path) != self._opened
        except OSError:
            return False

    def check_current(self) -> None:
        """StoreError when the database was replaced (`replaced`): a command that waits on it
        would wait for ever."""
        if self.replaced():
            raise StoreError(f"the job database {self.path} was removed or replaced while this command used it")

    def _wal(self) -> str:
        """Switch to WAL mode (a no-op once the file is in it). Clients opening a new database at
        the same moment can get "database is locked" here without the busy timeout applying:
        try again for a while."""
        for attempt in range(100):
            try:
                return str(self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 99:
                    raise
                time.sleep(0.02)
        raise AssertionError("unreachable")

    def _refuse_foreign(self) -> None:
        # Both reads in one read transaction: another client creating the schema commits the tables
        # and the version together, and must never be seen halfway (tables, but version 0).
        self._db.execute("BEGIN")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] if version == 0 else 0
        except BaseException:
            if self._db.in_transaction:  # a read that failed (a full disk) may have ended it already
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        if tables:
            raise StoreError(f"{self.path} is an SQLite database, but not gpubox's")

    def _init_schema(self) -> None:
        if self._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return  # the common case, read without taking the write lock
        self._db.execute("BEGIN IMMEDIATE")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables:
                    raise StoreError(f"{self.path} is an SQLite database, but not gpubox's")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version - 1 :]:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version > SCHEMA_VERSION:
                raise StoreError(
                    f"the job database {self.path} has schema {version}; this gpubox knows "
                    f"{SCHEMA_VERSION} (upgrade gpubox)"
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def checkpoint_aside(self) -> None:
        """For the daemon: WAL checkpoints on a thread of their own, not in its commits
        (gpubox/queue/checkpoints.py). RuntimeError when no thread can be started (a process
        limit): SQLite's own checkpoints then stay in the commits."""
        from gpubox.queue.checkpoints import LOG_KEPT_BYTES, SAFETY_NET_PAGES, Checkpointer

        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self.path)  # first: without it, the commits keep checkpointing
            self._db.execute(f"PRAGMA wal_autocheckpoint = {SAFETY_NET_PAGES}")
            # A stream of commits can outrun the thread's checkpoints and grow the log up to the
            # safety net; the next restart of the log gives the disk back down to this.
            self._db.execute(f"PRAGMA journal_size_limit = {LOG_KEPT_BYTES}")

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One `BEGIN IMMEDIATE` transaction: committed on success, rolled back on any error.
        Inside `transaction()`, part of that one."""
        if self._in_transaction:
            yield self._db
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"the job database {self.path} is unavailable ({e})") from None
        self._in_transaction = True
        try:
            yield self._db
        except sqlite3.DatabaseError as e:
            self._db.execute("ROLLBACK")
            raise self._failed(e) from None
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            try:
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as e:  # a full disk, say: nothing of it is kept
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise self._failed(e) from None
            self.writes += 1
            if self._checkpointer is not None:
                self._checkpointer.committed()
        finally:
            self._in_transaction = False

    def _failed(self, e: sqlite3.DatabaseError) -> StoreError:
        code = getattr(e, "sqlite_errorcode", None)
        # The extended codes (a damaged index: SQLITE_CORRUPT_INDEX) keep the primary one in their low byte.
        if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            # Found damaged in use (a disk error, a copy taken mid-write): say what can be done.
            return StoreError(
                f"the job database {self.path} is damaged ({e}): move it aside to start an empty queue"
                " (sqlite3's .recover may save its jobs)"
            )
        return StoreError(f"the job database {self.path} failed ({e})")

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """Several changes (`finish`, then `mark_started`, say) in one transaction: all or none."""
        return self._write()

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise self._failed(e) from None

    def data_version(self) -> int:
        """A number that changes whenever another connection commits: a cheap "anything new?"."""
        return int(self._read("PRAGMA data_version")[0][0])

    # Submission

    def add(self, spec: JobSpec) -> Job:
        return self.add_many([spec])[0]

    def add_many(self, specs: Iterable[JobSpec]) -> list[Job]:
        """Add every job or none, in one transaction; `after` may name jobs added earlier in it."""
        specs = list(specs)
        for spec in specs:
            check_spec(spec, KINDS)
        now = self._clock()
        ids: list[int] = []
        with self._write() as db:
            for spec in specs:
                for dep in spec.after:
                    if db.execute("SELECT 1 FROM jobs WHERE id = ?", (dep,)).fetchone() is None:
                        raise ValueError(f"job {dep} (named in --after) does not exist")
                cur = db.execute(
                    "INSERT INTO jobs (spec, kind, name, priority, state, submitted_at)"
                    " VALUES (?, ?, ?, ?, 'queued', ?)",
                    (spec_to_json(spec), spec.kind, spec.name, spec.priority, now),
                )
                assert cur.lastrowid is not None
                ids.append(cur.lastrowid)
        return [Job(id=i, spec=s, state="queued", submitted_at=now) for i, s in zip(ids, specs, strict=True)]

    # Reading

    def get(self, job_id: int) -> Job | None:
        rows = self._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _job_from_row(rows[0]) if rows else None

    def require(self, job_id: int) -> Job:
        """The job, or ValueError naming the id that does not exist."""
        job = self.get(job_id)
        if job is None:
            raise ValueError(f"job {job_id} does not exist")
        return job

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,))
        return [_attempt_from_row(r) for r in rows]

    def paused(self) -> dict[str, float]:
        """Paused targets ("queue" or a GPU UUID) and since when."""
        return {r["target"]: r["since"] for r in self._read("SELECT target, since FROM paused")}

    # Starting and ending

    def mark_started(
        self,
        job_id: int,
        pid: int | None,
        gpu_uuids: Sequence[str],
        boot_id: str,
        log_path: str | None = None,
        pid_start: int | None = None,
        expect: JobSpec | None = None,
    ) -> bool:
        """Move a queued job to running; False when it is not queued (another caller won), or,
        with `expect`, when its spec is no longer that one (it was edited meanwhile)."""
        now = self._clock()
        uuids = json.dumps(list(gpu_uuids)) if gpu_uuids else "[]"  # (a CPU-only job's, on the way between two)
        same = "" if expect is None else " AND spec = ?"
        with self._write() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, ended_at = NULL,"
                " exit_code = NULL, attempt = attempt + 1, gpu_uuids = ?, pid = ?, pid_start = ?,"
                f" boot_id = ?, reason = NULL, request = NULL WHERE id = ? AND state = 'queued'{same}",
                (now, uuids, pid, pid_start, boot_id, job_id, *(() if expect is None else (spec_to_json(expect),))),
            )
            if cur.rowcount != 1:
                return False
            db.execute(  # the attempt's number as the update above made it, in the same statement
                "INSERT INTO attempts (job_id, number, started_at, gpu_uuids, pid, boot_id, log_path)"
                " SELECT id, attempt, ?, ?, ?, ?, ? FROM jobs WHERE id = ?",
                (now, uuids, pid, boot_id, log_path, job_id),
            )
        return True

    def started_at(self, job_id: int, attempt: int, when: float) -> None:
        """When a running attempt started, where that came after its start was recorded (a job
        handed on starts once the one before ends)."""
        with self._write() as db:
            db.execute("UPDATE jobs SET started_at = ? WHERE id = ? AND attempt = ?", (when, job_id, attempt))
            db.execute("UPDATE attempts SET started_at = ? WHERE job_id = ? AND number = ?", (when, job_id, attempt))

    def abandon_start(self, job_id: int, attempt: int) -> bool:
        """Undo a start whose supervisor never ran the job: queued again, as if never started;
        False when that attempt is not running, or when a cancel was asked of it meanwhile (then
        it ends cancelled, having never run: the cancel is not undone with the start)."""
        with self._write() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'queued', attempt = attempt - 1, started_at = NULL, pid = NULL,"
                " pid_start = NULL, gpu_uuids = NULL, request = NULL"
                " WHERE id = ? AND state = 'running' AND attempt = ? AND (request IS NULL OR request != 'cancel')",
                (job_id, attempt),
            )
            if cur.rowcount == 1:
                db.execute("DELETE FROM attempts WHERE job_id = ? AND number = ?", (job_id, attempt))
                return True
            now = self._clock()
            reason = "cancelled on request before it ran"
            cancelled = db.execute(
                "UPDATE jobs SET state = 'cancelled', ended_at = ?, reason = ?, request = NULL"
                " WHERE id = ? AND state = 'running' AND attempt = ? AND request = 'cancel'",
                (now, reason, job_id, attempt),
            )
            if cancelled.rowcount == 1:
                db.execute(
                    "UPDATE attempts SET ended_at = ?, outcome = 'cancelled', reason = ?"
                    " WHERE job_id = ? AND number = ?",
                    (now, reason, job_id, attempt),
                )
        return False

    def finish(
        self,
        job_id: int,
        attempt: int,
        exit_code: int | None,
        outcome: str,
        reason: str | None = None,
        ended_at: float | None = None,
    ) -> Job | None:
        """End one attempt; None when that attempt is not the one running (it was ended already).

        A failed attempt goes back to the queue while retries are left; a preempted one always
        does, without using a retry. A job someone asked to cancel ends cancelled, whatever its
        attempt did. Anything else ends the job in the state named. `ended_at` is when the
        attempt ended, where that is known (a daemon may record it later).
        """
        if self.end_attempt(job_id, attempt, exit_code, outcome, reason, ended_at) is None:
            return None
        return self.get(job_id)

    def end_attempt(
        self,
        job_id: int,
        attempt: int,
        exit_code: int | None,
        outcome: str,
        reason: str | None = None,
        ended_at: float | None = None,
    ) -> tuple[str, str | None] | None:
        """`finish` without reading the job back, for the daemon's way from one job to the next:
        the job's state now, and the stop that was asked of it ("cancel", "preempt" or None);
        None when that attempt is not the one running."""
        if outcome not in OUTCOMES:
            raise ValueError(f"{outcome!r} is not how an attempt ends (expected one of: {', '.join(OUTCOMES)})")
        now = self._clock() if ended_at is None else ended_at
        reason = _printable(reason)
        with self._write() as db:
            if outcome == "succeeded" and self._succeeded(db, job_id, attempt, exit_code, reason, now):
                return outcome, None
            # The spec (the largest column) only where its retries matter.
            columns = "state, attempt, failures, request" + (", spec" if outcome == "failed" else "")
            row = db.execute(f"SELECT {columns} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row["state"] != "running" or row["attempt"] != attempt:
                return None
            asked = row["request"]
            if asked == "cancel" and outcome != "cancelled":
                outcome, reason = "cancelled", f"cancelled on request ({reason or f'exit code {exit_code}'})"
            db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, outcome = ?, reason = ?"
                " WHERE job_id = ? AND number = ?",
                (now, exit_code, outcome, reason, job_id, attempt),
            )
            if outcome == "preempted":
                again = f"attempt {attempt} was preempted ({reason or 'stopped'}); back in the queue"
                self._back_to_queue(db, job_id, row["failures"], again)
                return "queued", asked
            retries = spec_from_json(row["spec"]).retries if outcome == "failed" else 0
            if row["failures"] < retries:
                used = row["failures"] + 1
                again = f"attempt {attempt} failed ({reason or f'exit code {exit_code}'}); retry {used} of {retries}"
                self._back_to_queue(db, job_id, used, again)
                return "queued", asked
            db.execute(
                "UPDATE jobs SET state = ?, ended_at = ?, exit_code = ?, reason = ?, request = NULL WHERE id = ?",
                (outcome, now, exit_code, reason, job_id),
            )
        return outcome, asked

    @staticmethod
    def _succeeded(
        db: sqlite3.Connection, job_id: int, attempt: int, exit_code: int | None, reason: str | None, now: float
    ) -> bool:
        """The common end, in two statements instead of a read and two: a running attempt that
        succeeded with no stop asked of it. False (nothing changed) for anything else."""
        cur = db.execute(
            "UPDATE jobs SET state = 'succeeded', ended_at = ?, exit_code = ?, reason = ?"
            " WHERE id = ? AND state = 'running' AND attempt = ? AND request IS NULL",
            (now, exit_code, reason, job_id, attempt),
        )
        if cur.rowcount != 1:
            return False
        db.execute(
            "UPDATE attempts SET ended_at = ?, exit_code = ?, outcome = 'succeeded', reason = ?"
            " WHERE job_id = ? AND number = ?",
            (now, exit_code, reason, job_id, attempt),
        )
        return True

    def _back_to_queue(self, db: sqlite3.Connection, job_id: int, failures: int, reason: str | None) -> None:
        db.execute(
            # Its last attempt's start and end stay in that attempt's record; the job is not started
            # now, and waits from now on.
            "UPDATE jobs SET state = 'queued', started_at = NULL, ended_at = NULL, exit_code = NULL, pid = NULL,"
            " pid_start = NULL, request = NULL, failures = ?, reason = ?, queued_at = ? WHERE id = ?",
            (failures, reason, self._clock(), job_id),
        )

    def mark_ended(self, job_id: int, exit_code: int | None, state: str, reason: str | None = None) -> Job:
        """End the running attempt of a job in `state`; a job that is not running is an error."""
        if state not in END_STATES:
            raise ValueError(f"{state!r} is not an end state (expected one of: {', '.join(END_STATES)})")
        job = self.require(job_id)
        if job.state != "running":
            raise ValueError(f"job {job_id} is {job.state}, not running")
        ended = self.finish(job_id, job.attempt, exit_code, state, reason)
        if ended is None:
            raise ValueError(f"job {job_id} ended while it was being recorded")
        return ended

    # What people and the daemon ask of jobs

    def any_queued(self) -> bool:
        return self.queued_count(1) > 0

    def queued_count(self, up_to: int) -> int:
        """How many jobs are queued, counted up to `up_to` (a long line is not read through)."""
        rows = self._read("SELECT count(*) FROM (SELECT 1 FROM jobs WHERE state = 'queued' LIMIT ?)", (up_to,))
        return int(rows[0][0])

    def ends(self, job_ids: Sequence[int]) -> dict[int, tuple[str, int | None]]:
        """The state and exit code of each of these jobs that exists: two columns, for a wait on
        many jobs that would otherwise read (and decode) every whole job at every look."""
        found: dict[int, tuple[str, int | None]] = {}
        for at in range(0, len(job_ids), _IDS_PER_READ):
            chunk = job_ids[at : at + _IDS_PER_READ]
            marks = ",".join("?" * len(chunk))
            for row in self._read(f"SELECT id, state, exit_code FROM jobs WHERE id IN ({marks})", chunk):
                found[row["id"]] = (row["state"], row["exit_code"])
        return found

    def stop_request(self, job_id: int) -> str | None:
        """The stop asked for a job ("cancel", "preempt"), or None; one column, for the daemon's
        record of each end."""
        rows = self._read("SELECT request FROM jobs WHERE id = ?", (job_id,))
        return rows[0]["request"] if rows else None

    def request_stop(self, job_id: int, intent: str) -> Job:
        """Cancel a queued job now; mark a running one for the caller to signal (cancel wins)."""
        if intent not in ("cancel", "preempt"):
            raise ValueError(f"unknown stop request {intent!r}")
        now = self._clock()
        with self._write() as db:
            row = db.execute("SELECT state, request FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise ValueError(f"job {job_id} does not exist")
            if row["state"] == "queued" and intent == "cancel":
                db.execute(
                    "UPDATE jobs SET state = 'cancelled', ended_at = ?, reason = ? WHERE id = ?",
                    (now, "cancelled before it started", job_id),
                )
            elif row["state"] == "running" and row["request"] != "cancel":
                db.execute("UPDATE jobs SET request = ? WHERE id = ?", (intent, job_id))
        return self.require(job_id)

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job; a running job is returned marked, for the caller to signal."""
        return self.request_stop(job_id, "cancel")

    def fail_queued(self, job_id: int, reason: str) -> bool:
        """End a queued job as failed without running it (a dependency failed)."""
        now = self._clock()
        with self._write() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'failed', ended_at = ?, reason = ? WHERE id = ? AND state = 'queued'",
                (now, reason, job_id),
            )
        return cur.rowcount == 1

    def requeue(self, job_id: int) -> Job:
        """Queue a finished job again, with its retries back; its attempts so far are kept."""
        return self.requeue_all([job_id])[0]

    def requeue_all(self, job_ids: Sequence[int]) -> list[Job]:
        """Queue finished jobs again, all or none (one transaction: a job that is not finished, or
        does not exist, leaves every one as it was)."""
        with self._write() as db:
            for job_id in job_ids:
                self._check_retry(job_id)
                self._back_to_queue(db, job_id, 0, None)
        return [self.require(job_id) for job_id in job_ids]

    def check_retry(self, job_ids: Sequence[int]) -> None:
        """ValueError when a job does not exist or has not ended: what requeue_all would refuse,
        said before anything else is checked."""
        for job_id in job_ids:
            self._check_retry(job_id)

    def _check_retry(self, job_id: int) -> None:
        state = self.require(job_id).state
        if state not in END_STATES:
            raise ValueError(f"job {job_id} is {state}; only a finished job can be retried")

    def edit(self, job_id: int, changes: Mapping[str, Any]) -> Job:
        """Change a queued job's spec (priority, GPUs, memory, time limit); nothing else may change."""
        allowed = {"priority", "gpus", "gpu_ids", "gpu_mem_bytes", "time_limit_s"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"cannot edit {', '.join(sorted(unknown))} (only {', '.join(sorted(allowed))})")
        with self._write() as db:
            row = db.execute("SELECT state, spec FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise ValueError(f"job {job_id} does not exist")
            refusal = not_editable(job_id, row["state"])
            if refusal is not None:
                raise ValueError(refusal)
            if not changes:
                raise ValueError("nothing to change")
            spec = replace(spec_from_json(row["spec"]), **changes)
            check_spec(spec, KINDS, check_text=False)  # only what an edit changes
            db.execute(
                "UPDATE jobs SET spec = ?, priority = ? WHERE id = ?",
                (spec_to_json(spec), spec.priority, job_id),
            )
        return self.require(job_id)

    def set_reasons(self, reasons: Mapping[int, str | None]) -> None:
        """Record why queued jobs wait; rows whose reason is unchanged are not written."""
        with self._write() as db:
            for job_id, reason in reasons.items():
                db.execute(
                    "UPDATE jobs SET reason = ? WHERE id = ? AND state = 'queued' AND reason IS NOT ?",
                    (reason, job_id, reason),
                )

    def pause(self, target: str = QUEUE) -> bool:
        """Pause the queue or one GPU (by UUID); False when it was paused already."""
        with self._write() as db:
            cur = db.execute("INSERT OR IGNORE INTO paused (target, since) VALUES (?, ?)", (target, self._clock()))
        return cur.rowcount == 1

    def resume(self, target: str = QUEUE) -> bool:
        """Resume the queue or one GPU; False when it was not paused."""
        with self._write() as db:
            cur = db.execute("DELETE FROM paused WHERE target = ?", (target,))
        return cur.rowcount == 1

    def lost_after_reboot(self, current_boot_id: str) -> list[int]:
        """Mark `lost` every running job started under another boot; return their ids."""
        now = self._clock()
        reason = "the machine restarted while the job ran"
        with self._write() as db:
            rows = db.execute(
                "SELECT id, attempt FROM jobs WHERE state = 'running' AND boot_id IS NOT ?",
                (current_boot_id,),
            ).fetchall()
            for r in rows:
                db.execute(
                    "UPDATE jobs SET state = 'lost', ended_at = ?, reason = ?, request = NULL WHERE id = ?",
                    (now, reason, r["id"]),
                )
                db.execute(
                    "UPDATE attempts SET ended_at = ?, outcome = 'lost', reason = ? WHERE job_id = ? AND number = ?",
                    (now, reason, r["id"], r["attempt"]),
                )
        return [r["id"] for r in rows]

    def clean(self, older_than_s: float) -> list[int]:
        """Delete finished jobs (and their attempts) that ended more than older_than_s ago."""
        if older_than_s < 0:
            raise ValueError(f"the age must be 0 or more, not {older_than_s}")
        cutoff = self._clock() - older_than_s
        marks = ",".join("?" * len(END_STATES))
        with self._write() as db:
            rows = db.execute(
                f"SELECT id FROM jobs WHERE state IN ({marks}) AND ended_at <= ? ORDER BY id",
                (*END_STATES, cutoff),
            ).fetchall()
            # A job that a queued or running job runs after stays: its outcome decides that job.
            needed = {
                dep
                for r in db.execute("SELECT spec FROM jobs WHERE state IN ('queued', 'running')")
                for dep in spec_from_json(r["spec"]).after
            }
            ids = [r["id"] for r in rows if r["id"] not in needed]
            db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in ids])
        return ids

    def queued_ranked(self, kind_order: Sequence[str], limit: int) -> list[Job]:
        """The `limit` queued jobs the policy ranks first: priority, kind, submission, id.

        One indexed read per kind (the first `limit` of each), merged: the global first `limit`
        are among them. A single ORDER BY over the kind order would sort every queued job."""
        rank = {kind: i for i, kind in enumerate(kind_order)}
        rows: list[sqlite3.Row] = []
        for kind in kind_order:
            rows += self._read(
                "SELECT * FROM jobs WHERE state = 'queued' AND kind = ?"
                " ORDER BY priority DESC, submitted_at, id LIMIT ?",
                (kind, limit),
            )
        rows.sort(key=lambda r: (-r["priority"], rank[r["kind"]], r["submitted_at"], r["id"]))
        return [_job_from_row(r) for r in rows[:limit]]

    # Last, so that `list` in the annotations above is still the builtin.
    def list(self, states: Iterable[str] | None = None) -> list[Job]:
        if states is None:
            rows = self._read("SELECT * FROM jobs ORDER BY id")
        else:
            wanted = list(states)
            for s in wanted:
                if s not in STATES:
                    raise ValueError(f"unknown state {s!r} (expected one of: {', '.join(STATES)})")
            marks = ",".join("?" * len(wanted))
            rows = self._read(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id", wanted)
        return [_job_from_row(r) for r in rows]
