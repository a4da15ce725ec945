"""The exporter's ledger counters: what starved means, and totals that never drop because the
clock was set back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import build_report
from gpubox.ledger.store import LedgerStore
from gpubox.metrics.catalog import LEDGER_METRICS
from gpubox.metrics.families import ledger_families
from gpubox.metrics.ledger_totals import ledger_totals
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, open_store, proc, snap

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


def test_the_counters_match_the_report_when_a_write_straddles_a_minute(tmp_path: Path) -> None:
    # One write holds 300.3 ms of each of two minutes of one hour. The report of a window under an
    # hour reads the minutes, the exporter the hours: both must say the same milliseconds.
    boundary = T0 + 600
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=0.5, clock=clock, flush_every_s=3600)
    for t in (boundary - 0.3003, boundary + 0.3003):
        recorder.record(snap(t, [gpu(gpu_busy=50.0)]), [job(1, "GPU-0")])
    recorder.close()
    store.close()
    exported = ledger_totals(store.path)()["GPU-0"]
    with LedgerStore(store.path, create=False) as reader:
        [row] = build_report(reader, boundary - 60, boundary + 60, by="gpu", now=boundary + 1).rows
    assert abs(exported.allocated_s - row.allocated_gpu_hours * 3600) < 1e-9, (exported, row)
    assert exported.busy_s is not None and row.busy_gpu_hours is not None
    assert abs(exported.busy_s - row.busy_gpu_hours * 3600) < 1e-9, (exported, row)


def test_a_gpu_that_left_the_box_keeps_the_labels_the_ledger_saw(tmp_path: Path) -> None:
    """Its counters stay one series: the same gpu, uuid and name labels as while it was there."""

    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        parts = [gpu("GPU-0", 0, gpu_busy=50.0), gpu("GPU-1", 1, gpu_busy=50.0), gpu("MIG-a", 1, mig_instance=2)]
        return snap(t, parts, []), [job(1, "GPU-1")]

    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, scene, T0, T0 + 3600)
    recorder.close()
    store.close()
    totals = ledger_totals(store.path)()
    named = {uuid: (s.label, s.name) for uuid, s in totals.items()}
    model = gpu("GPU-1", 1).name
    assert named["GPU-1"] == ("1", model) and named["MIG-a"] == ("1/2", model)
    here = snap(T0 + 3600, [gpu("GPU-0", 0)], [])  # GPU 1 has left the box
    [allocated, *_] = ledger_families(totals, here)
    labels = {tuple(sample.labels[k] for k in ("gpu", "uuid", "name")) for sample in allocated.samples}
    assert ("1", "GPU-1", model) in labels and ("0", "GPU-0", gpu("GPU-0", 0).name) in labels
