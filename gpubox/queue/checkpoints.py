"""The daemon's WAL checkpoints, on a thread of their own.

SQLite copies its write-ahead log into the database (a checkpoint) inside whichever commit
fills the log past 1,000 pages: in a stream of short jobs, every hundredth job's end and next
start waited 3 to 4 ms for it, a tenth of the stream's time lost in stalls. The daemon's
connection checkpoints only past a far larger log (a safety net), and this thread, with a
connection of its own, runs a passive checkpoint every `every` commits of the daemon: SQLite
does the copy without the GIL, beside the daemon, and a passive checkpoint never blocks a
writer or a reader. The log restarts from its beginning only when a checkpoint has copied all of
it before the next commit; commits back to back can outrun the thread, and the file then grows
up to the safety net until a quieter moment, when it is cut back to LOG_KEPT_BYTES.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import suppress
from pathlib import Path

EVERY = 100  # daemon commits between checkpoints: about what SQLite's own 1,000 pages hold
LOG_KEPT_BYTES = 4 << 20  # the log file's size once it restarts: what SQLite's own checkpoints keep
SAFETY_NET_PAGES = 10000  # the daemon's own connection checkpoints past this (40 MB at 4 KiB)


class Checkpointer:
    def __init__(self, path: Path, every: int = EVERY) -> None:
        self.path = path
        self.every = every
        self._commits = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpubox-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """One more commit of the daemon's: every `every`, a checkpoint."""
        self._commits += 1
        if self._commits >= self.every:
            self._commits = 0
            self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except sqlite3.Error:
            return  # the daemon's own checkpoints (past the safety net) keep the log bounded
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                # A database locked or damaged: the next commits ask again (the daemon says why).
                with suppress(sqlite3.Error):
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            db.close()
