"""The ledger's counters for the exporter: each GPU's allocated, busy and starved seconds since the
ledger began, read at each scrape from the file the queue daemon writes (read-only). Retention
moves what it prunes from the hourly rows into each GPU's base, so the counters never step back."""

from __future__ import annotations

from pathlib import Path

from gpubox.metrics.ledger_hook import GpuSeconds, LedgerTotals


def ledger_totals(path: Path) -> LedgerTotals:
    def totals() -> dict[str, GpuSeconds]:
        from gpubox.ledger import queries
        from gpubox.ledger.store import LedgerStore

        if not path.exists():
            return {}  # nothing recorded yet (no daemon has run): no counters rather than zeros
        with LedgerStore(path, create=False) as store, store.reading():
            info = queries.gpus(store)
            # every row, not those up to now: a clock set back must not make a counter drop
            usage = queries.gpu_totals(store)
        return {
            info[gpu].uuid: GpuSeconds(
                allocated_s=u.allocated_s,
                busy_s=u.busy_s if u.busy_known_s else None,
                starved_s=u.starved_s if u.loader_known_s else None,
                label=info[gpu].label if info[gpu].index is not None else "",
                name=info[gpu].name or "",
            )
            for gpu, u in usage.items()
            if gpu in info
        }

    return totals
