"""A supervisor's side of jobs handed on (supervise._Chain), without processes: what it writes
for the jobs recorded under it when its daemon goes, and which stops it keeps in mind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.queue import supervise
from tests.queue.test_spawner import _launch


def launch(tmp_path: Path, job_id: int, attempt: int = 1) -> supervise.Launch:
    return _launch(tmp_path, ("true",), attempt, job_id=job_id, db_path=tmp_path / "queue.db")


def chain_with(daemon: bool) -> tuple[supervise._Chain, int, int]:
    """A chain, its orders' write end and its done pipe's read end (closed: the daemon is gone)."""
    orders_r, orders_w = os.pipe()
    done_r, done_w = os.pipe()
    if not daemon:
        os.close(done_r)
    return supervise._Chain(supervise._Orders(orders_r), done_w, short_success=True), orders_w, done_r


def test_a_daemon_gone_as_a_job_is_handed_on_leaves_never_ran_records_only_for_jobs_never_received(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job before ended, the one handed on started, and telling that end fails: the job that
    runs now, the one that ended (its own record) and the ones dropped keep their records; only a
    start recorded here whose order never came is said never to have run."""
    ended, running, dropped, _ = (launch(tmp_path, i) for i in (1, 2, 3, 4))
    monkeypatch.setattr(supervise, "_recorded_here", lambda _: [(1, 1), (2, 1), (3, 1), (4, 1)])
    chain, _, _ = chain_with(daemon=False)
    chain.done_with(dropped)
    chain.current = running
    chain.tell_end(ended, supervise.Outcome(0, "succeeded", None, 1.0), started=running, started_at=1.0)
    assert chain.closed
    records = {p.name for p in tmp_path.glob("*.exit")}
    assert records == {"1.1.exit", "4.1.exit"}
    assert supervise.read_exit(tmp_path / "1.1.exit", 1) == supervise.Outcome(0, "succeeded", None, 1.0)
    found = supervise.read_exit(tmp_path / "4.1.exit", 1)
    assert found is not None and not found.ran


def test_a_stop_placed_on_a_job_is_kept_for_that_attempt_only(tmp_path: Path) -> None:
    """A cancel's signal that came before the job handed on: that attempt is dropped when it
    comes; the same job run again (a retry, another attempt) is not."""
    chain, orders_w, done_r = chain_with(daemon=True)
    chain.asked.add((5, 1))
    for attempt in (1, 2):
        os.write(orders_w, supervise.NEXT + supervise._launch_line(launch(tmp_path, 5, attempt)))
        chain.on_readable()
    assert chain.pending is not None and (chain.pending[0].job_id, chain.pending[0].attempt) == (5, 2)
    assert (5, 1) not in chain.asked  # dropped: kept in mind no longer
    assert [r.attempt for r in chain.recent] == [1]
    assert os.read(done_r, 100) == b"5 1 back\n"
    found = supervise.read_exit(tmp_path / "5.1.exit", 1)
    assert found is not None and not found.ran


def test_a_supervisor_that_stops_listening_to_a_silent_daemon_closes_its_end(tmp_path: Path) -> None:
    """No "recorded" within the wait: the end goes to its exit record, and the daemon's next
    order (a job handed on, whose start it then undoes) fails instead of waiting unread."""
    chain, orders_w, _ = chain_with(daemon=True)
    told = launch(tmp_path, 6)
    chain.tell_end(told, supervise.Outcome(0, "succeeded", None, 1.0), started=None)
    assert chain.unrecorded and not chain.closed
    chain.unrecorded[0] = (*chain.unrecorded[0][:2], 0.0)  # its wait is over
    chain.expire()
    assert chain.closed and chain.fd() == []
    assert supervise.read_exit(tmp_path / "6.1.exit", 1) == supervise.Outcome(0, "succeeded", None, 1.0)
    with pytest.raises(BrokenPipeError):
        os.write(orders_w, supervise.NEXT)
