"""How many queue jobs wait and run, by kind, read from the queue's database.

A scrape must not create the database, start the daemon or take its write lock, so the file is
opened read-only, and one grouped count over the (state, kind) index replaces reading every job.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from gpubox.metrics.catalog import QUEUE_STATES
from gpubox.queue.jobs import KINDS


class QueueUnreadable(Exception):
    """The queue's database exists but cannot be read."""


def read_queue_depth(db: Path) -> dict[tuple[str, str], int] | None:
    """(kind, state) to its number of jobs, for every kind, queued and running; None with no queue."""
    try:
        if not db.exists():
            return None
    except OSError as exc:  # a state directory this user may not search: no traceback, no failed scrape
        raise QueueUnreadable(f"the job database {db} cannot be read ({exc.strerror or exc})") from None
    marks = ",".join("?" * len(QUEUE_STATES))
    try:
        with closing(sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=2.0)) as conn:
            rows = conn.execute(
                f"SELECT kind, state, count(*) FROM jobs WHERE state IN ({marks}) GROUP BY kind, state", QUEUE_STATES
            ).fetchall()
    except sqlite3.Error as exc:
        raise QueueUnreadable(f"the job database {db} cannot be read ({exc})") from None
    # Zeros too: a series that drops to 0 stays visible, where a missing one would only go stale.
    depth = {(kind, state): 0 for kind in KINDS for state in QUEUE_STATES}
    for kind, state, count in rows:
        depth[(str(kind), str(state))] = int(count)
    return depth
