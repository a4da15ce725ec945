"""The ledger database's tables, and how usage records map to their integer columns.

Figures are stored as integers (milliseconds, joules, bytes): SQLite stores an integer in 0 to 8
bytes by its size, and a zero in none, where a float always takes 8. A figure that is usually known
the whole time (busy, occupancy, energy, PCIe, loader_wait) stores the time it was unknown, which
is then zero. Rows are keyed by time first, so a report's window is one range scan and the rows a
flush touches sit on the same few pages. GPUs are referred to by a small integer, not their UUID.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpubox.ledger.usage import AttemptUsage, GpuUsage, Sums, UnqueuedUsage

SCHEMA_VERSION = 3  # 2: the queue's waits per hour; 3: free GPUs while jobs waited, pruned totals

_U = TypeVar("_U", bound=Sums)
_MS = 1000


@dataclass(frozen=True)
class Column:
    name: str
    field: str
    scale: int = _MS  # from the field's unit to the column's: seconds to ms by default
    unknown_of: str | None = None  # stored as that field minus this one: the time this figure was unknown


@dataclass(frozen=True)
class Columns(Generic[_U]):
    """The integer columns of one usage record, then its busy_source flags if it has them."""

    record: type[_U]
    columns: tuple[Column, ...]

    @property
    def has_flags(self) -> bool:
        return "busy_source" in self.record.__dataclass_fields__  # type: ignore[attr-defined]

    @property
    def names(self) -> tuple[str, ...]:
        names = tuple(c.name for c in self.columns)
        return (*names, "busy_source") if self.has_flags else names

    def values(self, usage: _U) -> list[int]:
        row = []
        for c in self.columns:
            value = round(getattr(usage, c.field) * c.scale)
            row.append(round(getattr(usage, c.unknown_of) * c.scale) - value if c.unknown_of else value)
        return [*row, int(getattr(usage, "busy_source"))] if self.has_flags else row  # noqa: B009

    def usage(self, row: Sequence[Any], offset: int = 0) -> _U:
        """The record back from `row[offset:]`, in the order of `names`; NULL sums are 0."""
        stored = {c.field: int(row[offset + i] or 0) for i, c in enumerate(self.columns)}
        kw: dict[str, Any] = {}
        for c in self.columns:
            value = stored[c.unknown_of] - stored[c.field] if c.unknown_of else stored[c.field]
            kw[c.field] = value / c.scale
        if self.has_flags:
            kw["busy_source"] = int(row[offset + len(self.columns)] or 0)
        return self.record(**kw)

    def ddl(self) -> str:
        return ", ".join(f"{name} INTEGER NOT NULL DEFAULT 0" for name in self.names)

    def upsert_set(self) -> str:
        """The SET clause that adds an excluded row to the stored one."""
        parts = [f"{c.name} = {c.name} + excluded.{c.name}" for c in self.columns]
        if self.has_flags:
            parts.append("busy_source = busy_source | excluded.busy_source")
        return ", ".join(parts)

    def sums(self, prefix: str = "") -> str:
        """SELECT expressions adding the columns up, in `names` order (flags: OR of distinct values)."""
        parts = [f"SUM({prefix}{c.name})" for c in self.columns]
        if self.has_flags:
            # the flags are 1, 2 or 3, so the OR of several distinct ones is always 3
            parts.append(
                f"CASE WHEN MIN(NULLIF({prefix}busy_source, 0)) = MAX({prefix}busy_source) "
                f"THEN MAX({prefix}busy_source) WHEN MAX({prefix}busy_source) > 0 THEN 3 ELSE 0 END"
            )
        return ", ".join(parts)


GPU_COLUMNS = Columns(
    GpuUsage,
    (
        Column("observed_ms", "observed_s"),
        Column("allocated_ms", "allocated_s"),
        Column("busy_ms", "busy_s"),
        Column("busy_unknown_ms", "busy_known_s", unknown_of="observed_s"),
        Column("idle_allocated_ms", "idle_allocated_s"),
        Column("starved_ms", "starved_s"),
        Column("loader_unknown_ms", "loader_known_s", unknown_of="allocated_s"),
        Column("occupancy_ms", "occupancy_s"),
        Column("occupancy_unknown_ms", "occupancy_known_s", unknown_of="observed_s"),
        Column("energy_j", "energy_j", 1),
        Column("energy_estimated_j", "energy_estimated_j", 1),
        Column("energy_unknown_ms", "energy_known_s", unknown_of="observed_s"),
        Column("pcie_tx_bytes", "pcie_tx_bytes", 1),
        Column("pcie_rx_bytes", "pcie_rx_bytes", 1),
        Column("pcie_unknown_ms", "pcie_known_s", unknown_of="observed_s"),
        Column("unqueued_ms", "unqueued_s"),
    ),
)

ATTEMPT_COLUMNS = Columns(
    AttemptUsage,
    (
        Column("allocated_ms", "allocated_s"),
        Column("busy_ms", "busy_s"),
        Column("busy_unknown_ms", "busy_known_s", unknown_of="allocated_s"),
        Column("idle_allocated_ms", "idle_allocated_s"),
        Column("starved_ms", "starved_s"),
        Column("loader_unknown_ms", "loader_known_s", unknown_of="allocated_s"),
        Column("energy_j", "energy_j", 1),
        Column("energy_estimated_j", "energy_estimated_j", 1),
        Column("energy_unknown_ms", "energy_known_s", unknown_of="allocated_s"),
    ),
)

UNQUEUED_COLUMNS = Columns(
    UnqueuedUsage,
    (
        Column("gpu_ms", "gpu_s"),
        Column("busy_ms", "busy_s"),
        Column("busy_unknown_ms", "busy_known_s", unknown_of="gpu_s"),
    ),
)

# Jobs that waited in the queue, per hour: the most waiting at once, and job-seconds per reason.
WAITS_SCHEMA = """
CREATE TABLE wait_hours (
    hour INTEGER PRIMARY KEY,
    peak_jobs INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE wait_reasons (
    hour INTEGER NOT NULL,
    reason TEXT NOT NULL,
    job_ms INTEGER NOT NULL,
    PRIMARY KEY (hour, reason)
) WITHOUT ROWID;
"""

# GPU-seconds each GPU sat unallocated (observed, neither held by a job nor used outside the queue)
# while at least one job waited, per hour; and each GPU's totals from the hours retention pruned, so
# the exporter's counters never step back.
FREE_SCHEMA = f"""
CREATE TABLE wait_free (
    hour INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    free_ms INTEGER NOT NULL,
    PRIMARY KEY (hour, gpu)
) WITHOUT ROWID;
CREATE TABLE gpu_pruned (
    gpu INTEGER PRIMARY KEY,
    {GPU_COLUMNS.ddl()}
);
"""

SCHEMA = (
    f"""
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value REAL
) WITHOUT ROWID;
CREATE TABLE gpus (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    gpu_index INTEGER,
    name TEXT,
    mig_instance INTEGER,
    mig_parent INTEGER NOT NULL DEFAULT 0,
    last_at REAL,
    energy_mj INTEGER
);
CREATE TABLE gpu_minutes (
    minute INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    {GPU_COLUMNS.ddl()},
    PRIMARY KEY (minute, gpu)
) WITHOUT ROWID;
CREATE TABLE gpu_hours (
    hour INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    {GPU_COLUMNS.ddl()},
    PRIMARY KEY (hour, gpu)
) WITHOUT ROWID;
CREATE TABLE attempts (
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    user TEXT,
    tags TEXT NOT NULL DEFAULT '{{}}',
    first_at REAL NOT NULL,
    last_at REAL NOT NULL,
    peak_gpu_mem_bytes INTEGER,
    PRIMARY KEY (job_id, attempt)
) WITHOUT ROWID;
CREATE TABLE attempt_hours (
    hour INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    {ATTEMPT_COLUMNS.ddl()},
    PRIMARY KEY (hour, job_id, attempt)
) WITHOUT ROWID;
CREATE TABLE unqueued_hours (
    hour INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    user TEXT NOT NULL,
    {UNQUEUED_COLUMNS.ddl()},
    PRIMARY KEY (hour, gpu, user)
) WITHOUT ROWID;
CREATE TABLE gaps (
    gpu INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    PRIMARY KEY (gpu, started_at)
) WITHOUT ROWID;
CREATE INDEX gaps_ended ON gaps(ended_at);
"""
    + "\n"
    + WAITS_SCHEMA
    + "\n"
    + FREE_SCHEMA
)

# What a database of each older version lacks, applied in order by the daemon when it opens it.
UPGRADES = {1: WAITS_SCHEMA, 2: FREE_SCHEMA}
