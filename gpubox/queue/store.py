"""The job store: every job and every attempt, in one SQLite database under the state directory.

The database runs in WAL mode with a 10 s busy timeout, and every read-then-write happens inside
`BEGIN IMMEDIATE`, so concurrent clients never lose or duplicate a job. A job leaves `queued` for
`running` once only: `mark_started` is a compare-and-set, and the caller that gets False must not
start the process. Bad input raises ValueError with one clear message and writes nothing; a
database that cannot be read raises StoreError.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubox.paths import ensure_private_dir
from gpubox.queue.policy import KINDS

SCHEMA_VERSION = 1
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timeout", "lost")
END_STATES = ("succeeded", "failed", "cancelled", "timeout", "lost")

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
    exit_code INTEGER,
    gpu_uuids TEXT,
    pid INTEGER,
    boot_id TEXT,
    reason TEXT
);
CREATE INDEX jobs_state ON jobs(state);
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
    PRIMARY KEY (job_id, number)
);
"""


class StoreError(Exception):
    """The job database cannot be opened or used."""


@dataclass(frozen=True)
class JobSpec:
    argv: tuple[str, ...]
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "other"
    name: str | None = None
    gpus: int = 1
    gpu_ids: tuple[str, ...] | None = None
    gpu_mem_bytes: int | None = None
    priority: int = 0
    after: tuple[int, ...] = ()
    time_limit_s: float | None = None
    retries: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    probe: bool = True
    share: bool = False


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: str
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0
    exit_code: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    pid: int | None = None
    boot_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Attempt:
    job_id: int
    number: int
    started_at: float
    ended_at: float | None
    exit_code: int | None
    gpu_uuids: tuple[str, ...]
    pid: int | None
    boot_id: str
    log_path: str | None


def _spec_to_json(spec: JobSpec) -> str:
    return json.dumps(
        {
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": spec.env,
            "kind": spec.kind,
            "name": spec.name,
            "gpus": spec.gpus,
            "gpu_ids": None if spec.gpu_ids is None else list(spec.gpu_ids),
            "gpu_mem_bytes": spec.gpu_mem_bytes,
            "priority": spec.priority,
            "after": list(spec.after),
            "time_limit_s": spec.time_limit_s,
            "retries": spec.retries,
            "tags": spec.tags,
            "shell": spec.shell,
            "probe": spec.probe,
            "share": spec.share,
        },
        sort_keys=True,
    )


def _spec_from_json(text: str) -> JobSpec:
    d: dict[str, Any] = json.loads(text)
    gpu_ids = d["gpu_ids"]
    return JobSpec(
        argv=tuple(d["argv"]),
        cwd=d["cwd"],
        env=dict(d["env"]),
        kind=d["kind"],
        name=d["name"],
        gpus=d["gpus"],
        gpu_ids=None if gpu_ids is None else tuple(gpu_ids),
        gpu_mem_bytes=d["gpu_mem_bytes"],
        priority=d["priority"],
        after=tuple(d["after"]),
        time_limit_s=d["time_limit_s"],
        retries=d["retries"],
        tags=dict(d["tags"]),
        shell=d["shell"],
        probe=d["probe"],
        share=d["share"],
    )


def _job_from_row(row: sqlite3.Row) -> Job:
    uuids = row["gpu_uuids"]
    return Job(
        id=row["id"],
        spec=_spec_from_json(row["spec"]),
        state=row["state"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        attempt=row["attempt"],
        exit_code=row["exit_code"],
        gpu_uuids=tuple(json.loads(uuids)) if uuids else (),
        pid=row["pid"],
        boot_id=row["boot_id"],
        reason=row["reason"],
    )


def _check_spec(spec: JobSpec) -> None:
    if not spec.argv or any(not isinstance(a, str) for a in spec.argv) or not spec.argv[0]:
        raise ValueError("the command is empty")
    if spec.kind not in KINDS:
        raise ValueError(f"unknown kind {spec.kind!r} (expected one of: {', '.join(KINDS)})")
    if spec.gpus < 0:
        raise ValueError(f"the GPU count must be 0 or more, not {spec.gpus}")
    if spec.gpu_ids is not None and not spec.gpu_ids:
        raise ValueError("an explicit GPU list must name at least one GPU")
    if spec.gpu_mem_bytes is not None and spec.gpu_mem_bytes <= 0:
        raise ValueError(f"the GPU memory asked for must be positive, not {spec.gpu_mem_bytes}")
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise ValueError(f"the time limit must be positive, not {spec.time_limit_s}")
    if spec.retries < 0:
        raise ValueError(f"retries must be 0 or more, not {spec.retries}")


class JobStore:
    """The queue's jobs and attempts in SQLite; one instance per thread or process."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        ensure_private_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            os.chmod(self.path, 0o600)
        except OSError as e:
            raise StoreError(f"cannot open the job database {self.path}: {e.strerror}") from None
        try:
            self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the job database {self.path}: {e}") from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("PRAGMA foreign_keys = ON")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"the job database {self.path} cannot use WAL mode")
            self._init_schema()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(f"the job database {self.path} is corrupt or not a gpubox database ({e})") from None
        except StoreError:
            self._db.close()
            raise
        for suffix in ("-wal", "-shm"):
            side = Path(f"{self.path}{suffix}")
            if side.exists():
                os.chmod(side, 0o600)

    def _init_schema(self) -> None:
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
            elif version > SCHEMA_VERSION:
                raise StoreError(
                    f"the job database {self.path} has schema {version}; this gpubox knows "
                    f"{SCHEMA_VERSION} (upgrade gpubox)"
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One `BEGIN IMMEDIATE` transaction: committed on success, rolled back on any error."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"the job database {self.path} is unavailable ({e})") from None
        try:
            yield self._db
        except sqlite3.DatabaseError as e:
            self._db.execute("ROLLBACK")
            raise StoreError(f"the job database {self.path} failed ({e})") from None
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"the job database {self.path} failed ({e})") from None

    # Submission

    def add(self, spec: JobSpec) -> Job:
        return self.add_many([spec])[0]

    def add_many(self, specs: Iterable[JobSpec]) -> list[Job]:
        """Add every job or none, in one transaction; `after` may name jobs added earlier in it."""
        specs = list(specs)
        for spec in specs:
            _check_spec(spec)
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
                    (_spec_to_json(spec), spec.kind, spec.name, spec.priority, now),
                )
                assert cur.lastrowid is not None
                ids.append(cur.lastrowid)
        return [Job(id=i, spec=s, state="queued", submitted_at=now) for i, s in zip(ids, specs, strict=True)]

    # Reading

    def get(self, job_id: int) -> Job | None:
        rows = self._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _job_from_row(rows[0]) if rows else None

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,))
        return [
            Attempt(
                job_id=r["job_id"],
                number=r["number"],
                started_at=r["started_at"],
                ended_at=r["ended_at"],
                exit_code=r["exit_code"],
                gpu_uuids=tuple(json.loads(r["gpu_uuids"])),
                pid=r["pid"],
                boot_id=r["boot_id"],
                log_path=r["log_path"],
            )
            for r in rows
        ]

    # Transitions

    def mark_started(
        self,
        job_id: int,
        pid: int | None,
        gpu_uuids: Sequence[str],
        boot_id: str,
        log_path: str | None = None,
    ) -> bool:
        """Move a queued job to running; False when it is not queued (another caller won)."""
        now = self._clock()
        uuids = json.dumps(list(gpu_uuids))
        with self._write() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, ended_at = NULL,"
                " exit_code = NULL, attempt = attempt + 1, gpu_uuids = ?, pid = ?, boot_id = ?,"
                " reason = NULL WHERE id = ? AND state = 'queued'",
                (now, uuids, pid, boot_id, job_id),
            )
            if cur.rowcount != 1:
                return False
            attempt = db.execute("SELECT attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
            db.execute(
                "INSERT INTO attempts (job_id, number, started_at, gpu_uuids, pid, boot_id,"
                " log_path) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, attempt, now, uuids, pid, boot_id, log_path),
            )
        return True

    def set_pid(self, job_id: int, pid: int) -> None:
        """Record the pid of a running job once its process exists."""
        with self._write() as db:
            db.execute("UPDATE jobs SET pid = ? WHERE id = ? AND state = 'running'", (pid, job_id))
            db.execute(
                "UPDATE attempts SET pid = ? WHERE job_id = ? AND number = (SELECT attempt FROM jobs WHERE id = ?)",
                (pid, job_id, job_id),
            )

    def mark_ended(self, job_id: int, exit_code: int | None, state: str, reason: str | None = None) -> Job:
        """Record how a running job ended; a job that is not running is an error."""
        if state not in END_STATES:
            raise ValueError(f"{state!r} is not an end state (expected one of: {', '.join(END_STATES)})")
        now = self._clock()
        with self._write() as db:
            row = db.execute("SELECT state, attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise ValueError(f"job {job_id} does not exist")
            if row["state"] != "running":
                raise ValueError(f"job {job_id} is {row['state']}, not running")
            db.execute(
                "UPDATE jobs SET state = ?, ended_at = ?, exit_code = ?, reason = ? WHERE id = ?",
                (state, now, exit_code, reason, job_id),
            )
            db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ? WHERE job_id = ? AND number = ?",
                (now, exit_code, job_id, row["attempt"]),
            )
        job = self.get(job_id)
        assert job is not None
        return job

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job; a running job is returned unchanged for the caller to signal."""
        now = self._clock()
        with self._write() as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise ValueError(f"job {job_id} does not exist")
            if row["state"] == "queued":
                db.execute(
                    "UPDATE jobs SET state = 'cancelled', ended_at = ?, reason = ? WHERE id = ?",
                    (now, "cancelled before it started", job_id),
                )
        job = self.get(job_id)
        assert job is not None
        return job

    def lost_after_reboot(self, current_boot_id: str) -> list[int]:
        """Mark `lost` every running job started under another boot; return their ids."""
        now = self._clock()
        with self._write() as db:
            rows = db.execute(
                "SELECT id, attempt FROM jobs WHERE state = 'running' AND boot_id IS NOT ?",
                (current_boot_id,),
            ).fetchall()
            for r in rows:
                db.execute(
                    "UPDATE jobs SET state = 'lost', ended_at = ?, reason = ? WHERE id = ?",
                    (now, "the machine restarted while the job ran", r["id"]),
                )
                db.execute(
                    "UPDATE attempts SET ended_at = ? WHERE job_id = ? AND number = ?",
                    (now, r["id"], r["attempt"]),
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
            ids = [r["id"] for r in rows]
            db.executemany("DELETE FROM jobs WHERE id = ?", [(i,) for i in ids])
        return ids

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
