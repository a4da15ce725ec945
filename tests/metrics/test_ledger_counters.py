"""The exporter's ledger counters: what starved means, and totals that never drop because the
clock was set back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.metrics.catalog import LEDGER_METRICS
from gpubox.metrics.ledger_totals import ledger_totals
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import Clock, drive, gpu, job, open_store, proc, snap

LATER = 1_111_111 * 3600  # an hour in 2096: the box's clock now reads earlier than what was recorded


def test_starved_seconds_say_what_they_count() -> None:
    starved = {m.name: m for m in LEDGER_METRICS}["gpubox_gpu_starved_seconds_total"]
    assert "allocated" in starved.help and "loader_wait" in starved.help
    assert "busy" not in starved.help  # it is allocated time, busy or not


def test_totals_include_what_was_recorded_after_the_clock_now(tmp_path: Path) -> None:
    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        return snap(t, [gpu(gpu_busy=50.0)], [proc(1, job_id=1, loader_wait=0.25)]), [job(1, "GPU-0")]

    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, scene, LATER, LATER + 2 * 3600)
    recorder.close()
    store.close()
    totals = ledger_totals(store.path)()
    assert set(totals) == {"GPU-0"}
    seconds = totals["GPU-0"]
    assert (seconds.allocated_s, seconds.busy_s, seconds.starved_s) == (7200.0, 3600.0, 1800.0)
