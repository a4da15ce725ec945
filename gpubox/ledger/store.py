"""The ledger database: `ledger.db` under the state directory, apart from the queue's database.

WAL mode, and every write in one `BEGIN IMMEDIATE` transaction: a batch's increments, the GPUs'
new marks and the time of the last sample recorded are committed together, so a recorder that
starts again resumes exactly where the database says the last one stopped, and never counts an
interval twice. Commits do not wait for the disk (synchronous=NORMAL): a power cut may lose the
last batch, and its time then shows as a gap, never as a double count.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.ledger.accounting import GpuMark
from gpubox.ledger.rollup import HOUR, AttemptSeen, Batch
from gpubox.ledger.schema import (
    ATTEMPT_COLUMNS,
    GPU_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    UNQUEUED_COLUMNS,
    UPGRADES,
    Columns,
)
from gpubox.paths import Paths, ensure_private_dir, resolve_paths

DAY = 86400


class LedgerError(Exception):
    """The ledger database cannot be opened or used."""


def ledger_path(paths: Paths | None = None) -> Path:
    return (paths or resolve_paths()).state_dir / "ledger.db"


def ledger_exists(path: Path) -> bool:
    """Whether there is a ledger at `path` yet. Path.exists() says False only for a missing file:
    a state directory this user may not search (or a name too long) raises, here a LedgerError."""
    try:
        return path.exists()
    except OSError as e:
        raise LedgerError(f"cannot open the ledger {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class Pruned:
    """Rows that retention deleted, by table."""

    gpu_minutes: int
    gpu_hours: int
    attempt_hours: int
    attempts: int
    unqueued_hours: int
    gaps: int
    waits: int = 0


class LedgerStore:
    """The ledger's SQLite database; one instance per thread."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        """`create=False` (a report, `queue show`, a scrape) reads only: it refuses a database that
        does not exist yet or has another schema than this gpubox's, and never writes to it."""
        self.path = Path(path)
        self._reads = 0  # depth of nested reading() blocks
        try:
            if self.path.is_dir():
                raise LedgerError(f"the ledger {self.path} is a directory, not a file")
            if not self.path.exists():
                if not create:
                    raise LedgerError(f"no ledger yet at {self.path}: the queue daemon records one")
                ensure_private_dir(self.path.parent)
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            # mode=ro still lets SQLite make the WAL index it needs to read, and nothing else
            target, uri = (self.path, False) if create else (f"{self.path.absolute().as_uri()}?mode=ro", True)
            self._db = sqlite3.connect(target, timeout=10.0, isolation_level=None, check_same_thread=False, uri=uri)
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open the ledger {self.path}: {e}") from None
        try:
            self._db.execute("PRAGMA busy_timeout = 10000")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0 and self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise LedgerError(f"{self.path} is an SQLite database, but not gpubox's ledger")
            if not create:
                self._check_readable(version)
                return
            self._db.execute("PRAGMA synchronous = NORMAL")
            if str(self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower() != "wal":
                raise LedgerError(f"the ledger {self.path} cannot use WAL mode")
            if version != SCHEMA_VERSION:
                self._init_schema()
        except sqlite3.DatabaseError as e:
            self._db.close()
            if not create and "readonly" in str(e):
                # a WAL database is read through a shared-memory file beside it, which SQLite must create
                raise LedgerError(
                    f"cannot read the ledger {self.path}: SQLite needs to create {self.path.name}-shm"
                    f" in {self.path.parent}, which you cannot write to"
                ) from None
            raise LedgerError(f"the ledger {self.path} is corrupt or not a gpubox ledger ({e})") from None
        except LedgerError:
            self._db.close()
            raise

    def _check_readable(self, version: int) -> None:
        """A reader takes the current schema only: setting one up or upgrading it is the daemon's."""
        if version == 0:
            raise LedgerError(f"{self.path} is not a gpubox ledger (it is empty): the gpubox daemon sets it up")
        if version > SCHEMA_VERSION:
            raise LedgerError(f"the ledger {self.path} has schema {version}; this gpubox knows {SCHEMA_VERSION}")
        if version != SCHEMA_VERSION:
            raise LedgerError(
                f"the ledger {self.path} has schema {version}: the gpubox daemon upgrades it when it starts"
            )

    def _init_schema(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(f"the ledger {self.path} has schema {version}; this gpubox knows {SCHEMA_VERSION}")
            if version < SCHEMA_VERSION:
                steps = [SCHEMA] if version == 0 else [UPGRADES[v] for v in range(version, SCHEMA_VERSION)]
                for statement in ";".join(steps).split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise LedgerError(f"the ledger {self.path} is unavailable ({e})") from None
        try:
            yield self._db
        except sqlite3.DatabaseError as e:
            self._rollback()
            raise LedgerError(f"the ledger {self.path} failed ({e})") from e
        except BaseException:
            self._rollback()
            raise
        try:
            self._db.execute("COMMIT")
        except sqlite3.DatabaseError as e:  # disk full, I/O error: nothing of the batch is kept
            self._rollback()
            raise LedgerError(f"the ledger {self.path} could not commit ({e})") from e

    def _rollback(self) -> None:
        """End a failed transaction; SQLite may have ended it already, and that is not a second error."""
        if self._db.in_transaction:
            with suppress(sqlite3.DatabaseError):
                self._db.execute("ROLLBACK")

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One read transaction: every query inside sees the same committed state. Nested, the
        outermost one holds (a report's table, totals and chart read one state together)."""
        if self._reads:
            self._reads += 1
            try:
                yield
            finally:
                self._reads -= 1
            return
        try:
            self._db.execute("BEGIN")
        except sqlite3.DatabaseError as e:
            raise LedgerError(f"the ledger {self.path} cannot be read ({e})") from e
        self._reads = 1
        try:
            yield
        finally:
            self._reads = 0
            self._rollback()  # it wrote nothing: ending it cannot fail for want of disk

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._db.execute(sql, params).fetchall())
        except sqlite3.DatabaseError as e:
            raise LedgerError(f"the ledger {self.path} failed ({e})") from None

    # Recording

    def load_marks(self) -> dict[str, GpuMark]:
        """Each GPU's last recorded sample: where a new recorder starts attributing."""
        rows = self.rows("SELECT uuid, last_at, energy_mj FROM gpus WHERE last_at IS NOT NULL")
        return {uuid: GpuMark(last_at, energy) for uuid, last_at, energy in rows}

    def meta(self) -> dict[str, float]:
        return {key: value for key, value in self.rows("SELECT key, value FROM meta") if value is not None}

    def write(self, batch: Batch) -> None:
        """Add a batch's increments, and move the GPUs' marks, in one transaction."""
        if batch.empty and batch.last_sample_at is None:
            return
        with self._write() as db:
            ids = self._gpu_ids(db, batch)
            minutes = {(minute, ids[uuid]): GPU_COLUMNS.values(u) for (uuid, minute), u in batch.gpu_minutes.items()}
            _add_rows(db, "gpu_minutes", ("minute", "gpu"), GPU_COLUMNS, minutes.items())
            _add_rows(db, "gpu_hours", ("hour", "gpu"), GPU_COLUMNS, _hour_rows(minutes).items())
            attempt_hours = (((hour, job, n), u) for (job, n, hour), u in batch.attempt_hours.items())
            _add_usage(db, "attempt_hours", ("hour", "job_id", "attempt"), ATTEMPT_COLUMNS, attempt_hours)
            unqueued = (((hour, ids[uuid], user or ""), u) for (uuid, hour, user), u in batch.unqueued_hours.items())
            _add_usage(db, "unqueued_hours", ("hour", "gpu", "user"), UNQUEUED_COLUMNS, unqueued)
            db.executemany(
                "INSERT INTO attempts (job_id, attempt, kind, name, user, tags, first_at, last_at, peak_gpu_mem_bytes)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, attempt) DO UPDATE SET"
                " kind = excluded.kind, name = excluded.name, user = excluded.user, tags = excluded.tags,"
                " first_at = MIN(first_at, excluded.first_at), last_at = MAX(last_at, excluded.last_at),"
                " peak_gpu_mem_bytes = MAX(COALESCE(peak_gpu_mem_bytes, excluded.peak_gpu_mem_bytes),"
                " COALESCE(excluded.peak_gpu_mem_bytes, peak_gpu_mem_bytes))",
                [_attempt_row(seen) for seen in batch.attempts.values()],
            )
            db.executemany(
                "INSERT OR IGNORE INTO gaps (gpu, started_at, ended_at) VALUES (?, ?, ?)",
                [(ids[g.uuid], g.start, g.end) for g in batch.gaps],
            )
            db.executemany(
                "INSERT INTO wait_hours (hour, peak_jobs) VALUES (?, ?)"
                " ON CONFLICT (hour) DO UPDATE SET peak_jobs = MAX(peak_jobs, excluded.peak_jobs)",
                list(batch.wait_peaks.items()),
            )
            db.executemany(
                "INSERT INTO wait_reasons (hour, reason, job_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (hour, reason) DO UPDATE SET job_ms = job_ms + excluded.job_ms",
                [(hour, reason, round(1000 * seconds)) for (hour, reason), seconds in batch.wait_reasons.items()],
            )
            db.executemany(
                "INSERT INTO wait_free (hour, gpu, free_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (hour, gpu) DO UPDATE SET free_ms = free_ms + excluded.free_ms",
                [(hour, ids[uuid], round(1000 * seconds)) for (uuid, hour), seconds in batch.wait_free.items()],
            )
            meta: dict[str, float] = dict(batch.meta)
            if batch.last_sample_at is not None:
                meta["last_sample_at"] = batch.last_sample_at
            db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                "CASE WHEN key = 'last_sample_at' THEN MAX(value, excluded.value) ELSE excluded.value END",
                list(meta.items()),
            )

    def _gpu_ids(self, db: sqlite3.Connection, batch: Batch) -> dict[str, int]:
        """Each GPU's row id, after recording who it is and its new mark."""
        for seen in batch.gpus.values():
            mark = seen.mark
            db.execute(
                "INSERT INTO gpus (uuid, gpu_index, name, mig_instance, mig_parent, last_at, energy_mj)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET"
                " gpu_index = excluded.gpu_index, name = excluded.name, mig_instance = excluded.mig_instance,"
                " mig_parent = excluded.mig_parent,"
                " energy_mj = CASE WHEN excluded.last_at >= COALESCE(last_at, excluded.last_at)"
                " THEN excluded.energy_mj ELSE energy_mj END,"
                " last_at = MAX(COALESCE(last_at, excluded.last_at), COALESCE(excluded.last_at, last_at))",
                (
                    seen.uuid,
                    seen.index,
                    seen.name,
                    seen.mig_instance,
                    int(seen.mig_parent),
                    mark.taken_at if mark else None,
                    mark.energy_mj if mark else None,
                ),
            )
        named = {uuid for uuid, _ in batch.gpu_minutes} | {g.uuid for g in batch.gaps}
        named |= {uuid for uuid, _, _ in batch.unqueued_hours} | {uuid for uuid, _ in batch.wait_free}
        for uuid in named - set(batch.gpus):
            db.execute("INSERT OR IGNORE INTO gpus (uuid) VALUES (?)", (uuid,))
        return {uuid: gpu_id for gpu_id, uuid in db.execute("SELECT id, uuid FROM gpus")}

    # Retention

    def prune(self, now: float, keep_days: float, keep_minute_days: float | None = None) -> Pruned:
        """Delete what is older than `keep_days` (per-minute rows: `keep_minute_days`, by default the
        same); rows are deleted once they lie wholly before the cut."""
        cut = now - keep_days * DAY
        minute_cut = now - (keep_days if keep_minute_days is None else keep_minute_days) * DAY
        with self._write() as db:

            def delete(sql: str, *params: float) -> int:
                return db.execute(sql, params).rowcount

            # the exporter's counters run from the ledger's start: what leaves the hours goes to the base
            db.execute(
                f"INSERT INTO gpu_pruned (gpu, {', '.join(GPU_COLUMNS.names)})"
                f" SELECT gpu, {GPU_COLUMNS.sums()} FROM gpu_hours WHERE hour <= ? GROUP BY gpu"
                f" ON CONFLICT (gpu) DO UPDATE SET {GPU_COLUMNS.upsert_set()}",
                (cut - HOUR,),
            )
            return Pruned(
                gpu_minutes=delete("DELETE FROM gpu_minutes WHERE minute <= ?", minute_cut - 60),
                gpu_hours=delete("DELETE FROM gpu_hours WHERE hour <= ?", cut - HOUR),
                attempt_hours=delete("DELETE FROM attempt_hours WHERE hour <= ?", cut - HOUR),
                # an attempt that ended an hour before the cut has no hour rows left
                attempts=delete("DELETE FROM attempts WHERE last_at <= ?", cut - HOUR),
                unqueued_hours=delete("DELETE FROM unqueued_hours WHERE hour <= ?", cut - HOUR),
                gaps=delete("DELETE FROM gaps WHERE ended_at <= ?", cut),
                waits=delete("DELETE FROM wait_hours WHERE hour <= ?", cut - HOUR)
                + delete("DELETE FROM wait_reasons WHERE hour <= ?", cut - HOUR)
                + delete("DELETE FROM wait_free WHERE hour <= ?", cut - HOUR),
            )


def _hour_rows(minutes: Mapping[tuple[int, int], list[int]]) -> dict[tuple[int, int], list[int]]:
    """The hour rows of a batch's (minute, gpu) rows, added up from their stored integers, not
    rounded again from the floats: each hour then holds exactly the sum of its minutes, so a
    report (minutes at a window's ends, hours between) and the exporter (hours) agree to the ms."""
    flags = len(GPU_COLUMNS.columns)  # busy_source, after the sums: OR-ed, as the upsert does
    hours: dict[tuple[int, int], list[int]] = {}
    for (minute, gpu), values in minutes.items():
        key = (minute - minute % HOUR, gpu)
        row = hours.get(key)
        if row is None:
            hours[key] = list(values)
            continue
        for i, value in enumerate(values):
            row[i] = row[i] | value if i >= flags else row[i] + value
    return hours


def _add_usage(
    db: sqlite3.Connection,
    table: str,
    key: Sequence[str],
    columns: Columns[Any],
    rows: Iterable[tuple[tuple[object, ...], Any]],
) -> None:
    """Add each usage record to the row with its key, or insert it."""
    _add_rows(db, table, key, columns, ((k, columns.values(usage)) for k, usage in rows))


def _add_rows(
    db: sqlite3.Connection,
    table: str,
    key: Sequence[str],
    columns: Columns[Any],
    rows: Iterable[tuple[tuple[object, ...], Sequence[int]]],
) -> None:
    """Add each row of stored integers (in `columns.names` order) to the row with its key, or insert it."""
    data = [(*k, *values) for k, values in rows]
    if not data:
        return
    names = ", ".join((*key, *columns.names))
    marks = ", ".join("?" * (len(key) + len(columns.names)))
    db.executemany(
        f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT ({', '.join(key)}) DO UPDATE SET "
        f"{columns.upsert_set()}",
        data,
    )


def _attempt_row(seen: AttemptSeen) -> tuple[object, ...]:
    a = seen.allocation
    tags = json.dumps(dict(a.tags), sort_keys=True)
    return (a.job_id, a.attempt, a.kind, a.name, a.user, tags, seen.first_at, seen.last_at, seen.peak_gpu_mem_bytes)


def tags_of(text: str | None) -> Mapping[str, str]:
    """The tags stored with an attempt (a JSON object of strings)."""
    if not text:
        return {}
    value = json.loads(text)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
