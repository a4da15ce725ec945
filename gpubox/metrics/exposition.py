"""The collector Prometheus scrapes, and the exposition text of one scrape.

At each scrape the collector takes one snapshot of the box, whose rates cover the time since the
previous scrape (the backend keeps that state; the first scrape's rates are warming up and left
out), reads the queue's depth from its database (no daemon needed) and, when given, the ledger's
totals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from gpubox.metrics.catalog import ALL_METRICS
from gpubox.metrics.families import (
    gpu_families,
    ledger_families,
    new_family,
    process_families,
    queue_families,
    with_samples,
)
from gpubox.metrics.ledger_hook import LedgerTotals
from gpubox.metrics.queue_depth import QueueUnreadable, read_queue_depth
from gpubox.telemetry.backend import TelemetryBackend


class BoxCollector:
    """A prometheus_client collector: `collect()` yields the box's metric families, one scrape each."""

    def __init__(
        self, backend: TelemetryBackend, queue_db: Path | None = None, ledger: LedgerTotals | None = None
    ) -> None:
        """`queue_db`: the queue's database (None: no queue depth); `ledger`: GPU UUID to its totals."""
        self._backend = backend
        self._queue_db = queue_db
        self._ledger = ledger
        # Scrapes may come at once; they share one backend, whose rates run from one call to the next.
        self._lock = threading.Lock()
        self.errors: tuple[str, ...] = ()  # what the last scrape could not read
        self.on_new_error: Callable[[str], object] | None = None  # told of an error the scrape before did not have

    def describe(self) -> Iterator[Metric]:
        """Every family a scrape may have, without samples: the registry learns the names from it,
        so that a scrape asking for some of them (`?name[]=`) reaches this collector."""
        return (new_family(spec) for spec in ALL_METRICS)

    def warm_up(self) -> None:
        """Start the rates' window, so that the next scrape has rates."""
        with self._lock:
            self._backend.sample()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            before = set(self.errors)
            families, self.errors = self._scrape()
            if self.on_new_error is not None:
                for error in self.errors:
                    if error not in before:
                        self.on_new_error(error)
        yield from families

    def _scrape(self) -> tuple[list[Metric], tuple[str, ...]]:
        snap = self._backend.sample()
        errors = list(snap.errors)
        families: list[Metric] = [*gpu_families(snap), *process_families(snap)]
        if self._queue_db is not None:
            try:
                depth = read_queue_depth(self._queue_db)
            except QueueUnreadable as exc:
                errors.append(str(exc))
                depth = None
            if depth is not None:
                families += queue_families(depth)
        if self._ledger is not None:
            try:
                totals = self._ledger()
            except Exception as exc:  # a broken ledger must not cost the scrape its GPU figures
                from gpubox.ledger.store import LedgerError

                said = str(exc) if isinstance(exc, LedgerError) else f"the ledger cannot be read ({exc})"
                errors.append(f"{said}; its counters are left out")
            else:
                families += ledger_families(totals, snap)
        return with_samples(families), tuple(errors)

    def close(self) -> None:
        with self._lock:
            self._backend.close()


def registry_of(collector: BoxCollector) -> CollectorRegistry:
    """A registry of gpubox's metrics alone (prometheus_client's default one adds its own process's)."""
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def exposition_text(collector: BoxCollector) -> str:
    """One scrape, in the Prometheus text format."""
    return generate_latest(registry_of(collector)).decode()


def dump(collector: BoxCollector, window: float, sleep: Callable[[float], None] = time.sleep) -> str:
    """One scrape whose rates cover `window` seconds: a one-shot reader has no previous scrape."""
    collector.warm_up()
    sleep(window)
    return exposition_text(collector)


def open_box_collector(
    demo: bool, loader_window: int = 10, loader_sampling: bool = True, queue_db: Path | None = None
) -> BoxCollector:
    """The collector of this box (the simulated one with `demo`) and of this user's queue; raises
    BackendUnavailable when there is no NVIDIA driver."""
    from gpubox.ledger.store import ledger_path
    from gpubox.metrics.ledger_totals import ledger_totals
    from gpubox.paths import resolve_paths
    from gpubox.telemetry.sources import open_backend

    paths = resolve_paths()
    if queue_db is None:
        from gpubox.queue.layout import db_path

        queue_db = db_path(paths)
    backend = open_backend(demo, loader_window=loader_window, loader_sampling=loader_sampling)
    # The simulated box has GPUs of its own, not the ones the ledger recorded.
    return BoxCollector(backend, queue_db, None if demo else ledger_totals(ledger_path(paths)))
