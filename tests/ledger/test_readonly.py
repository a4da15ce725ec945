"""A reader (`create=False`: the report, `queue show`, every scrape) never writes to the ledger: it
refuses an empty file and an older schema, which are the daemon's to set up and upgrade, and reads
the current one, while the daemon writes or after it stopped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.attempt_lookup import recorded_job_usage
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import build_report
from gpubox.ledger.schema import FREE_SCHEMA, SCHEMA, SCHEMA_VERSION, WAITS_SCHEMA
from gpubox.ledger.store import LedgerError, LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, open_store, snap


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_empty_file_is_refused_and_left_empty(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.touch()
    with pytest.raises(LedgerError, match="is not a gpubox ledger"):
        LedgerStore(path, create=False)
    assert files(tmp_path) == {"ledger.db": b""}


def test_a_folder_the_reader_cannot_write_is_said_to_be_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What SQLite says when it cannot make the -shm file a WAL reader needs (a folder the user may
    not write to: tests run as root, who may, so SQLite's answer is stood in for)."""
    with open_store(tmp_path) as store:
        path = store.path

    class Refusing:
        def execute(self, *args: object) -> None:
            raise sqlite3.OperationalError("attempt to write a readonly database")

        def close(self) -> None:
            pass

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: Refusing())
    with pytest.raises(LedgerError) as found:
        LedgerStore(path, create=False)
    assert str(found.value) == (
        f"cannot read the ledger {path}: SQLite needs to create ledger.db-shm in {path.parent},"
        " which you cannot write to"
    )


def test_a_directory_in_the_ledger_s_place_is_said_to_be_one(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").mkdir()
    for create in (True, False):
        with pytest.raises(LedgerError, match="is a directory, not a file"):
            LedgerStore(tmp_path / "ledger.db", create=create)


@pytest.mark.parametrize(("version", "lacks"), [(1, (WAITS_SCHEMA, FREE_SCHEMA)), (2, (FREE_SCHEMA,))])
def test_an_older_schema_is_left_for_the_daemon_to_upgrade(
    tmp_path: Path, version: int, lacks: tuple[str, ...]
) -> None:
    path = tmp_path / "ledger.db"
    old = SCHEMA
    for part in lacks:
        old = old.replace(part, "")
    db = sqlite3.connect(path)
    db.executescript(old + f"PRAGMA user_version = {version};")
    db.execute("INSERT INTO gpus (id, uuid) VALUES (1, 'GPU-0')")
    db.execute("INSERT INTO gpu_hours (hour, gpu, allocated_ms) VALUES (0, 1, 3600000)")
    db.commit()
    db.close()
    before = files(tmp_path)
    with pytest.raises(LedgerError, match=rf"has schema {version}: the gpubox daemon upgrades it when it starts"):
        LedgerStore(path, create=False)
    assert files(tmp_path) == before
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == version
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'wait_free'").fetchone()[0] == 0
    db.close()
    with LedgerStore(path) as daemon:  # the daemon's open upgrades it, and keeps what was there
        assert daemon.rows("PRAGMA user_version") == [(SCHEMA_VERSION,)]
        assert daemon.rows("SELECT count(*) FROM wait_free") == [(0,)]
        assert daemon.rows("SELECT allocated_ms FROM gpu_hours") == [(3600000,)]


def test_the_current_schema_reads_while_the_daemon_writes_and_after_it_stopped(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock, flush_every_s=0)

    def scene(t: float) -> tuple[BoxSnapshot, list[Allocation]]:
        return snap(t, [gpu(gpu_busy=50.0)]), [job(1, "GPU-0")]

    drive(recorder, clock, scene, T0, T0 + 600)
    with LedgerStore(store.path, create=False) as reader:  # the daemon's connection is open (WAL)
        [row] = build_report(reader, T0, T0 + 600, "gpu", now=T0 + 600).rows
        assert row.allocated_gpu_hours == 600 / 3600
        with pytest.raises(LedgerError):
            reader.prune(T0 + 600, keep_days=0)  # a reader cannot write
    drive(recorder, clock, scene, T0 + 605, T0 + 1200)
    recorder.close()
    store.close()
    state = store.path.parent
    before = files(state)
    with LedgerStore(store.path, create=False) as reader:
        [row] = build_report(reader, T0, T0 + 1200, "gpu", now=T0 + 1200).rows
        assert row.busy_gpu_hours == 600 / 3600
    assert files(state)["ledger.db"] == before["ledger.db"]


def test_nested_reads_share_the_outermost_transaction(tmp_path: Path) -> None:
    """A report's parts read in one transaction: a write between them is not seen by the later ones."""
    path = tmp_path / "ledger.db"
    LedgerStore(path).close()
    reader = LedgerStore(path, create=False)
    writer = sqlite3.connect(path, isolation_level=None)  # the daemon, in another process
    with reader.reading():
        before = reader.rows("SELECT count(*) FROM meta")
        writer.execute("INSERT INTO meta (key, value) VALUES ('test', 1.0)")
        with reader.reading():  # nested: still the outer snapshot
            assert reader.rows("SELECT count(*) FROM meta") == before
    assert reader.rows("SELECT count(*) FROM meta") == [(before[0][0] + 1,)]
    reader.close()
    writer.close()


def test_a_job_usage_whose_ledger_cannot_be_looked_for_is_a_ledger_error(tmp_path: Path) -> None:
    # `queue show` says a LedgerError on stderr and goes on; a bare OSError would be a traceback.
    with pytest.raises(LedgerError, match=r"cannot open the ledger .*File name too long"):
        recorded_job_usage(1, tmp_path / ("s" * 300) / "ledger.db")
