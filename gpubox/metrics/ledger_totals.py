"""The ledger's counters for the exporter: each GPU's allocated, busy and starved seconds since the
ledger began, read at each scrape from the file the queue daemon writes. Rows older than
`ledger.retention_days` are pruned, so once the ledger is that old the totals step back a little
each day, which Prometheus reads as a counter reset."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpubox.metrics.ledger_hook import GpuSeconds, LedgerTotals


def ledger_totals(path: Path, clock: Callable[[], float] = time.time) -> LedgerTotals:
    def totals() -> dict[str, GpuSeconds]:
        from gpubox.ledger import queries
        from gpubox.ledger.store import LedgerStore

        if not path.exists():
            return {}  # nothing recorded yet (no daemon has run): no counters rather than zeros
        with LedgerStore(path, create=False) as store:
            info = queries.gpus(store)
            usage = queries.gpu_usage(store, 0.0, clock() + 3600)
        return {
            info[gpu].uuid: GpuSeconds(
                allocated_s=u.allocated_s,
                busy_s=u.busy_s if u.busy_known_s else None,
                starved_s=u.starved_s if u.loader_known_s else None,
            )
            for gpu, u in usage.items()
            if gpu in info
        }

    return totals
