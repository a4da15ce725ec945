"""The ledger database: its own file, WAL, a schema version, integers on disk, and retention."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpubox.ledger import queries
from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import build_report
from gpubox.ledger.schema import GPU_COLUMNS, SCHEMA_VERSION
from gpubox.ledger.store import LedgerError, LedgerStore, ledger_path
from gpubox.paths import resolve_paths
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, open_store, proc, snap

DAY = 86400


def working(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    procs = [proc(1, "GPU-1", user="bob")]
    return snap(t, [gpu("GPU-0", 0, gpu_busy=37.5), gpu("GPU-1", 1, gpu_busy=10.0)], procs), [job(1, "GPU-0")]


def test_the_ledger_lives_in_its_own_file_under_the_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUBOX_STATE_DIR", "/somewhere/state")
    assert ledger_path() == Path("/somewhere/state/ledger.db")
    assert ledger_path(resolve_paths({"HOME": "/home/x"})) == Path("/home/x/.local/state/gpubox/ledger.db")


def test_wal_schema_version_and_private_file(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.close()
    db = sqlite3.connect(tmp_path / "state" / "ledger.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert (tmp_path / "state" / "ledger.db").stat().st_mode & 0o077 == 0


def test_refuses_a_foreign_database_a_newer_schema_and_a_missing_file_when_asked(tmp_path: Path) -> None:
    foreign = tmp_path / "other.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(LedgerError, match="not gpubox's"):
        LedgerStore(foreign)
    newer = tmp_path / "newer.db"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(LedgerError, match="schema"):
        LedgerStore(newer)
    with pytest.raises(LedgerError, match="no ledger yet"):
        LedgerStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_figures_are_stored_as_integers(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, working, T0, T0 + 300)
    recorder.close()
    types = store.rows("SELECT DISTINCT typeof(busy_ms), typeof(observed_ms) FROM gpu_minutes")
    assert types == [("integer", "integer")]
    assert store.rows(
        "SELECT sum(busy_ms) FROM gpu_minutes WHERE gpu = (SELECT id FROM gpus WHERE uuid = 'GPU-0')"
    ) == [(112_500,)]


def test_each_hour_row_is_the_sum_of_its_minute_rows(tmp_path: Path) -> None:
    # Reports read minutes at a window's ends and hours between, the exporter hours alone: the
    # two tables must hold the same milliseconds, however a write's time falls across minutes.
    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        share = (t * 7.3) % 1.0  # figures that change with every sample
        gpus = [gpu("GPU-0", 0, gpu_busy=100 * share, sm_occupancy=33.3, power_w=301.7)]
        return snap(t, gpus, [proc(1, job_id=1, loader_wait=share / 3)]), [job(1, "GPU-0")]

    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=0.7, clock=clock, flush_every_s=20)
    drive(recorder, clock, scene, T0 - 95.0003, T0 + 130, step=0.7003)  # across an hour and its minutes
    recorder.close()
    columns = ", ".join(f"SUM({name})" for name in GPU_COLUMNS.names[:-1])
    minutes = store.rows(f"SELECT minute - minute % 3600, gpu, {columns} FROM gpu_minutes GROUP BY 1, 2 ORDER BY 1, 2")
    hours = store.rows(f"SELECT hour, gpu, {columns} FROM gpu_hours GROUP BY 1, 2 ORDER BY 1, 2")
    assert len(hours) == 2 and hours == minutes


def test_retention_deletes_what_is_older_than_the_days_kept(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, working, T0, T0 + 3600)
    drive(recorder, clock, working, T0 + 10 * DAY, T0 + 10 * DAY + 3600)  # the days between are a gap
    recorder.close()
    now = T0 + 10 * DAY + 3600
    pruned = store.prune(now, keep_days=30, keep_minute_days=5)
    assert pruned.gpu_minutes == 2 * 60 and pruned.gpu_hours == 0 and pruned.attempts == 0
    # the old hour is still reported, from hour rows; its minutes are gone
    [old] = [r for r in build_report(store, T0, T0 + 3600, "gpu", now=now).rows if r.group == "0"]
    assert old.busy_gpu_hours == 0.375
    pruned = store.prune(now, keep_days=5)
    assert pruned.gpu_hours == 2 and pruned.attempt_hours == 1 and pruned.unqueued_hours == 1 and pruned.gaps == 0
    assert build_report(store, T0, T0 + 3600, "gpu", now=now).rows == ()
    assert build_report(store, T0, T0 + 3600, "job", now=now).rows == ()
    # the recent day is untouched
    recent = build_report(store, now - 3600, now, "job", now=now)
    assert [r.allocated_gpu_hours for r in recent.rows] == [1.0]
    assert store.prune(now + 6 * DAY, keep_days=5).gaps == 2  # the gap ended 6 days ago now


@pytest.mark.parametrize("minutes_from", [T0 + 4 * 3600, T0 + 5400], ids=["all-minutes", "to-mid-hour"])
def test_a_window_that_cuts_hours_whose_minutes_were_pruned_counts_their_part(
    tmp_path: Path, minutes_from: int
) -> None:
    # Minutes are kept 35 days, hours 400: a window 40 days back that cuts hours must count the
    # part of each hour inside it from the hour's row, not drop the part (or the whole report).
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, working, T0, T0 + 3 * 3600)
    recorder.close()
    now = minutes_from + 35 * DAY
    store.prune(now, keep_days=400, keep_minute_days=35)
    [(kept,)] = store.rows("SELECT count(*) FROM gpu_minutes")
    assert kept == (0 if minutes_from > T0 + 3 * 3600 else 2 * 90)
    windows = ((T0 + 1800, T0 + 5400), (T0 + 900, T0 + 2 * 3600 + 2700), (T0 + 600, T0 + 1200), (T0 + 4500, T0 + 9000))
    for since, until in windows:
        rows = {r.group: r for r in build_report(store, since, until, "gpu", now=now).rows}
        hours = (until - since) / 3600
        assert set(rows) == {"0", "1"}
        assert rows["0"].calendar_gpu_hours == pytest.approx(hours)
        assert rows["0"].allocated_gpu_hours == pytest.approx(hours)
        assert rows["0"].busy_gpu_hours == pytest.approx(0.375 * hours)
        assert rows["1"].unqueued_gpu_hours == pytest.approx(hours)


def test_totals_since_the_ledger_began_never_drop_when_hours_are_pruned(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    for day in range(3):
        drive(recorder, clock, working, T0 + day * DAY, T0 + day * DAY + 3600)
    recorder.close()
    before = queries.gpu_totals(store)
    assert store.prune(T0 + 2 * DAY + 3600, keep_days=1).gpu_hours == 4  # two days of two GPUs
    assert queries.gpu_totals(store) == before  # what the exporter's counters read
    assert store.prune(T0 + 3 * DAY + 3600, keep_days=1).gpu_hours == 2  # and again: it adds up
    assert queries.gpu_totals(store) == before
    [gpu0] = [u for g, u in before.items() if queries.gpus(store)[g].uuid == "GPU-0"]
    assert (gpu0.allocated_s, gpu0.busy_s) == (3 * 3600, 3 * 0.375 * 3600)


def test_a_figure_that_is_not_a_number_does_not_stop_the_ledger_writing(tmp_path: Path) -> None:
    """A NaN PCIe rate (GPM's doubles can be) once made every write fail: its minute stayed pending for good."""
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock, flush_every_s=0)

    def odd(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        nan = float("nan")
        return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0, pcie_tx_Bps=nan, pcie_rx_Bps=nan)]), [job(1, "GPU-0")]

    drive(recorder, clock, odd, T0, T0 + 600)
    total = build_report(store, T0, T0 + 600, now=T0 + 600).total
    assert total.observed_gpu_hours == total.allocated_gpu_hours == pytest.approx(600 / 3600)
    assert total.busy_gpu_hours == pytest.approx(300 / 3600)
    assert total.pcie_tx_bytes is None and total.pcie_rx_bytes is None


def test_a_misread_energy_counter_is_no_figure_and_does_not_stop_the_ledger(tmp_path: Path) -> None:
    """One read of the energy counter (or of the power) far above any GPU's draw, such as all ones
    for "not available", is no figure: not 10^16 J in the report, and no value that cannot be
    stored and so stops every later write."""
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock, flush_every_s=0)
    watts = 700

    def misread(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        counter = int(T0 * 1000 + (t - T0) * watts * 1000)  # mJ, steady at 700 W
        if T0 + 100 <= t < T0 + 110:
            return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0, energy_mj=(1 << 64) - 1)]), [job(1, "GPU-0")]
        if T0 + 300 <= t < T0 + 310:
            return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0, power_w=float(0xFFFFFFFF) / 1000)]), [job(1, "GPU-0")]
        return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0, energy_mj=counter)]), [job(1, "GPU-0")]

    drive(recorder, clock, misread, T0, T0 + 600)
    total = build_report(store, T0, T0 + 600, now=T0 + 600).total
    assert total.observed_gpu_hours == pytest.approx(600 / 3600)  # written to the end
    assert total.energy_kwh is not None
    assert 0 < total.energy_kwh * 3.6e6 <= watts * 600
    assert total.energy_kwh * 3.6e6 >= watts * (600 - 60)  # only the misread intervals are missing
