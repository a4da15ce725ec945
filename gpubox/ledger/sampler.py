"""The queue daemon's recording thread: every `ledger.interval` seconds a telemetry snapshot and the
queue's allocations go to the Recorder. A thread of its own, so that a slow driver call never
delays scheduling; its own database connections, since SQLite's do not cross threads."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.store import LedgerError, LedgerStore

RETRY_BACKEND_S = 60.0  # a box whose driver is not loaded yet: look again this often
PRUNE_EVERY_S = 86400.0
MAX_FLUSH_EVERY_S = 60.0
REPEAT_LOG_S = 3600.0  # the same failure is logged again after this long


def flush_every(interval_s: float) -> float:
    """Writes once a minute at the default 5 s interval; sooner at short intervals, so a report
    never lags more than a dozen samples."""
    return min(MAX_FLUSH_EVERY_S, 12 * interval_s)


class LedgerSampler:
    def __init__(
        self,
        ledger_db: Any,
        interval_s: float,
        retention_days: float,
        minute_retention_days: float,
        open_backend: Callable[[], Any],
        allocations: Callable[[], Sequence[Allocation] | None],
        waiting: Callable[[], Mapping[int, str]],
        log: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`open_backend()` gives a telemetry backend (raising BackendUnavailable without a driver);
        `allocations()` lists the running attempts' GPUs (None while the daemon does not know yet:
        then nothing is recorded, so no time goes to nobody) and `waiting()` why each queued job waits
        (from the daemon's memory: it must not open the queue's database, see
        gpubox/queue/ledger_feed.py)."""
        self.ledger_db = ledger_db
        self.interval_s = interval_s
        self.retention_days = retention_days
        self.minute_retention_days = minute_retention_days
        self.open_backend = open_backend
        self.allocations = allocations
        self.waiting = waiting
        self.log = log
        self.clock = clock
        self.recording = False  # True once NVML answers: until then nobody needs the allocations
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpubox-ledger", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling and write what is pending."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        backend = self._backend()
        if backend is None:
            return
        store = None
        try:
            store = LedgerStore(self.ledger_db)
            recorder = Recorder(store, self.interval_s, flush_every_s=flush_every(self.interval_s))
        except (LedgerError, sqlite3.Error) as exc:
            self.log(f"GPU use is not recorded: {exc}")
            if store is not None:
                store.close()
            backend.close()
            return
        self.recording = True
        pruned_at = 0.0
        told: dict[str, float] = {}  # message -> when it was last logged
        try:
            while True:
                try:
                    allocations = self.allocations()
                    if allocations is not None:
                        recorder.record(backend.sample(), allocations, self.waiting())
                    if self.clock() - pruned_at >= PRUNE_EVERY_S:
                        pruned_at = self.clock()  # a failed prune waits for the next day too
                        store.prune(pruned_at, self.retention_days, self.minute_retention_days)
                except Exception as exc:  # a bad sample or a locked database costs one sample
                    self._log_once(told, f"recording GPU use: {type(exc).__name__}: {exc}")
                if self._stop.wait(self.interval_s):
                    break
        finally:
            self.recording = False
            try:
                recorder.close()
            except (LedgerError, sqlite3.Error) as exc:
                self.log(f"the last minute of GPU use was not written: {exc}")
            finally:
                store.close()
                backend.close()

    def _log_once(self, told: dict[str, float], message: str) -> None:
        """Log a failure once an hour while it repeats (a read-only ledger fails every sample)."""
        now = self.clock()
        for old in [m for m, at in told.items() if now - at >= REPEAT_LOG_S]:
            del told[old]
        if message not in told:
            told[message] = now
            self.log(f"{message} (said again in an hour if it goes on)")

    def _backend(self) -> Any:
        """The telemetry backend, waiting for a driver that is not loaded yet; None when stopped."""
        from gpubox.telemetry.backend import BackendUnavailable

        told = False
        while not self._stop.is_set():
            try:
                return self.open_backend()
            except Exception as exc:  # any failure to open: one line, and another try later
                # Not only BackendUnavailable: anything else would end this thread with a traceback in
                # the daemon's log, and GPU use would go unrecorded until the daemon restarts.
                if not told:
                    why = exc if isinstance(exc, BackendUnavailable) else f"{type(exc).__name__}: {exc}"
                    self.log(f"GPU use is not recorded until NVML answers: {why}")
                    told = True
            self._stop.wait(RETRY_BACKEND_S)
        return None
