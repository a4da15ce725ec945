"""Jobs handed on: with one CPU slot, the next CPU-only job's start is committed while the job
before runs, and handed to that job's supervisor, which starts it the moment the job before
ends. These tests run the daemon in this process (tests/queue/test_queue_fast_start.py) to see
the hand-on happen, and check that a job handed on never runs unrecorded, twice, ahead of its
time, or when it was cancelled, and that a signal meant for it never stops the job running."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

import gpubox.queue.daemon as daemon_module
import gpubox.queue.supervise as supervise_module
from gpubox.paths import Paths
from gpubox.queue.client import cancel_jobs
from gpubox.queue.daemon import Daemon
from gpubox.queue.layout import socket_path
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import Job, JobStore
from gpubox.queue.wire import poke
from tests.queue.conftest import NoGpus, wait_until
from tests.queue.test_queue_fast_start import HANG, hold, run_daemon, spec, wait_done


def handed_to_run_after(daemon: Daemon, job_id: int) -> bool:
    handed = daemon._handed
    return handed is not None and not handed.revoking and handed.job.id == job_id


@pytest.fixture(autouse=True)
def any_job_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs are handed on after any job, however slow this machine runs `true`."""
    monkeypatch.setattr(daemon_module, "STREAM_S", HANG)


def true_long_and(store: JobStore, tmp_path: Path, *names: str) -> list[Job]:
    """A `true`, a long job (it holds until `go` is made, then writes "long" to `ran`), and jobs
    that write their names there: in that order, each once, if all goes well."""
    ran = tmp_path / "ran"
    long = spec(f"{hold(tmp_path / 'go')}; echo long >> {ran}")
    return store.add_many([spec("true"), long, *(spec(f"echo {name} >> {ran}") for name in names)])


def release_and_see_only_the_third_cancelled(store: JobStore, tmp_path: Path, jobs: list[Job]) -> None:
    """Let the long job end; every job ends, the long one and the last succeeded, the third cancelled."""
    (tmp_path / "go").touch()
    wait_done(store, [j.id for j in jobs])
    assert [store.require(j.id).state for j in jobs[1:]] == ["succeeded", "cancelled", "succeeded"]


def test_a_stream_is_handed_on_and_each_start_is_recorded_when_it_happened(paths: Paths) -> None:
    n = 30

    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(n)])]
        poke(socket_path(paths))
        wait_done(store, ids)
        jobs = [store.require(i) for i in ids]
        assert [(j.state, j.attempt) for j in jobs] == [("succeeded", 1)] * n
        for before, after in itertools.pairwise(jobs):
            assert before.ended_at is not None and after.started_at is not None
            assert after.started_at >= before.ended_at, "a job's start is recorded before the one before ended"
        for job in jobs:
            (attempt,) = store.attempts(job.id)
            assert attempt.started_at == job.started_at

    fast = run_daemon(paths, scenario)
    assert fast >= n // 2


def test_a_job_handed_on_behind_a_long_job_is_taken_back_and_runs_once_later(paths: Paths, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    backs: list[int] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        original = daemon._back

        def counted(store: JobStore, job_id: int, attempt: int) -> None:
            backs.append(job_id)
            original(store, job_id, attempt)

        daemon._back = counted  # type: ignore[method-assign]
        first, long, after = store.add_many([spec("true"), spec(hold(tmp_path / "go")), spec(f"echo after >> {ran}")])
        poke(socket_path(paths))
        wait_until(lambda: backs == [after.id], HANG, "the job handed on to be taken back")
        time.sleep(3 * daemon_module.HAND_ON_S)
        assert store.require(after.id).state == "queued"  # not shown running behind the long job
        assert store.require(long.id).state == "running"
        (tmp_path / "go").touch()
        wait_done(store, [first.id, long.id, after.id])
        assert store.require(after.id).attempt == 1
        assert store.require(after.id).started_at >= store.require(long.id).ended_at  # type: ignore[operator]

    run_daemon(paths, scenario)
    assert ran.read_text() == "after\n"


@pytest.mark.parametrize("taken_back_first", [False, True])
def test_a_cancel_of_a_job_handed_on_drops_it_and_never_stops_the_job_running(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_back_first: bool
) -> None:
    """The cancel's commit makes the daemon take the job back, and its signal goes to the
    supervisor of the job running: whichever comes first, only the job handed on is dropped."""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    ran = tmp_path / "ran"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, long, dropped, last = true_long_and(store, tmp_path, "dropped", "last")
        poke(socket_path(paths))
        wait_until(lambda: handed_to_run_after(daemon, dropped.id), HANG, "the job to be handed on")
        supervisor = store.require(dropped.id).pid
        assert store.require(dropped.id).state == "running" and supervisor == store.require(long.id).pid
        if taken_back_first:
            store.request_stop(dropped.id, "cancel")  # the commit alone: the daemon takes it back
            wait_until(lambda: store.require(dropped.id).state == "cancelled", HANG, "the cancel")
            assert supervisor is not None
            os.kill(supervisor, 15)  # the signal after, as a slow client sends it
        else:
            cancel_jobs(store, [dropped.id])
        wait_until(lambda: store.require(dropped.id).state == "cancelled", HANG, "the cancel")
        time.sleep(0.3)  # the signal reached the supervisor of the long job
        assert store.require(long.id).state == "running"
        release_and_see_only_the_third_cancelled(store, tmp_path, [first, long, dropped, last])

    run_daemon(paths, scenario)
    assert ran.read_text().split() == ["long", "last"]


def test_a_job_handed_on_runs_once_after_the_job_before_when_the_daemon_is_gone(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its start is recorded: the supervisor runs it as the daemon would have let it, and the
    next daemon records both ends from the exit records."""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    ran = tmp_path / "ran"
    ids: list[int] = []

    def first_daemon(daemon: Daemon, store: JobStore) -> None:
        jobs = true_long_and(store, tmp_path, "next")
        ids.extend(j.id for j in jobs)
        poke(socket_path(paths))
        wait_until(lambda: handed_to_run_after(daemon, jobs[2].id), HANG, "the job to be handed on")
        # the daemon stops here: its supervisors read EOF

    run_daemon(paths, first_daemon)
    (tmp_path / "go").touch()
    wait_until(lambda: ran.exists() and ran.read_text().split() == ["long", "next"], HANG, "both jobs to run")

    def second_daemon(daemon: Daemon, store: JobStore) -> None:
        wait_done(store, ids)
        assert [(store.require(i).state, store.require(i).attempt) for i in ids] == [("succeeded", 1)] * 3

    run_daemon(paths, second_daemon)
    assert ran.read_text().split() == ["long", "next"]


def test_a_supervisor_killed_with_a_job_handed_on_loses_both_and_the_queue_goes_on(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the job handed on started is not known: it ends `lost`, as the job running does,
    never run again; the jobs after it run, and later ones are handed on again."""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    ran = tmp_path / "ran"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, long, handed = true_long_and(store, tmp_path, "handed")
        poke(socket_path(paths))
        wait_until(lambda: handed_to_run_after(daemon, handed.id), HANG, "the job to be handed on")
        supervisor = store.require(long.id).pid
        assert supervisor is not None
        os.kill(supervisor, signal.SIGKILL)
        wait_done(store, [first.id, long.id, handed.id])
        assert [store.require(i).state for i in (long.id, handed.id)] == ["lost", "lost"]
        assert daemon._handed is None
        later = [j.id for j in store.add_many([spec(f"echo later >> {ran}") for _ in range(5)])]
        poke(socket_path(paths))
        wait_done(store, later)
        assert {store.require(i).state for i in later} == {"succeeded"}

    run_daemon(paths, scenario, config=QueueConfig(poll_interval_s=0.1))
    assert ran.read_text().split() == ["later"] * 5


def test_a_job_recorded_as_handed_on_but_never_sent_is_queued_again_and_runs_once(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon stops between committing the start of a job handed on and sending it (killed
    there): the supervisor, at EOF, finds it recorded under itself and leaves an exit record that
    says it never ran; the next daemon queues it again."""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    ran = tmp_path / "ran"
    ids: list[int] = []

    def first_daemon(daemon: Daemon, store: JobStore) -> None:
        def never_sent(*_: object, **__: object) -> None:
            daemon._stop = True

        monkeypatch.setattr(supervise_module, "hand_on", never_sent)
        jobs = true_long_and(store, tmp_path, "next")
        ids.extend(j.id for j in jobs)
        poke(socket_path(paths))
        wait_until(lambda: store.require(jobs[2].id).state == "running", HANG, "the start to be committed")
        wait_until(lambda: daemon._stop, HANG, "the daemon to stop")

    run_daemon(paths, first_daemon)
    monkeypatch.undo()
    monkeypatch.setattr(daemon_module, "STREAM_S", HANG)
    (tmp_path / "go").touch()

    def second_daemon(daemon: Daemon, store: JobStore) -> None:
        wait_done(store, ids)
        assert [(store.require(i).state, store.require(i).attempt) for i in ids] == [("succeeded", 1)] * 3

    run_daemon(paths, second_daemon, config=QueueConfig(poll_interval_s=0.1))
    assert ran.read_text().split() == ["long", "next"]


def test_a_cancel_whose_signal_comes_before_the_job_handed_on_drops_it_when_it_comes(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its start is committed, the client cancels it (request, then SIGTERM to the supervisor) and
    only then is it sent: the supervisor, told by the database that the signal was for a job not
    yet its own, keeps its job running and drops that one when it comes. (The daemon's own
    taking back, which would also drop it, is switched off here.)"""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    monkeypatch.setattr(supervise_module, "revoke", lambda supervisor: True)
    real_hand_on = supervise_module.hand_on
    ran = tmp_path / "ran"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, long, cancelled, last = true_long_and(store, tmp_path, "cancelled", "last")

        def late(supervisor: object, launch: object, recorded: bool = False) -> None:
            if getattr(launch, "job_id", None) == cancelled.id:
                with JobStore(paths.state_dir / "queue.db") as client:
                    assert cancel_jobs(client, [cancelled.id])[0].action == "stopping"
                time.sleep(0.5)  # the supervisor places the signal before the job comes
            real_hand_on(supervisor, launch, recorded)  # type: ignore[arg-type]

        monkeypatch.setattr(supervise_module, "hand_on", late)
        poke(socket_path(paths))
        wait_until(lambda: store.require(cancelled.id).state == "cancelled", HANG, "the cancel")
        assert store.require(long.id).state == "running"
        release_and_see_only_the_third_cancelled(store, tmp_path, [first, long, cancelled, last])

    run_daemon(paths, scenario)
    assert ran.read_text().split() == ["long", "last"]


def test_a_stop_signal_nobody_asked_for_does_not_stop_a_job_handed_on(
    paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs are recorded under one supervisor for a moment, and a cancel's signal may come
    late: a job handed on stops only when the database says it was asked to."""
    monkeypatch.setattr(daemon_module, "HAND_ON_S", HANG)
    ran = tmp_path / "ran"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        # After the first, the second is started by the daemon; the third is handed on to its
        # supervisor while it runs, and the fourth to the same one while the third runs.
        _first, second, handed, after = store.add_many(
            [
                spec("true"),
                spec("sleep 0.3"),
                spec(f"{hold(tmp_path / 'go')}; echo handed >> {ran}"),
                spec(f"echo after >> {ran}"),
            ]
        )
        poke(socket_path(paths))
        wait_until(lambda: handed_to_run_after(daemon, after.id), HANG, "the job after to be handed on")
        assert store.require(second.id).state == "succeeded"
        assert store.require(second.id).pid == store.require(handed.id).pid  # it was handed on
        supervisor = store.require(handed.id).pid
        assert supervisor is not None and supervisor == store.require(after.id).pid
        os.kill(supervisor, signal.SIGTERM)
        time.sleep(0.5)
        assert store.require(handed.id).state == "running"
        (tmp_path / "go").touch()
        wait_done(store, [handed.id, after.id])
        assert [store.require(i).state for i in (handed.id, after.id)] == ["succeeded", "succeeded"]

    run_daemon(paths, scenario)
    assert ran.read_text().split() == ["handed", "after"]


def test_a_never_ran_record_left_before_a_start_is_not_that_starts(paths: Paths) -> None:
    """An attempt number is used again after a start is undone: a "never ran" record from the
    first start must not undo the second (its job may run), while a record left since counts."""
    daemon = Daemon(paths, QueueConfig(), gpu_source=NoGpus())
    with JobStore(paths.state_dir / "queue.db") as store:
        job = store.add(spec("true"))
        assert store.mark_started(job.id, os.getpid(), (), "boot", None)
        started = store.require(job.id)
    record = paths.state_dir / "logs" / f"{job.id}.1.exit"
    record.parent.mkdir(parents=True, exist_ok=True)
    assert started.started_at is not None
    for ended, counts in ((started.started_at - 5.0, False), (started.started_at + 1.0, True)):
        supervise_module.write_exit(record, 1, supervise_module.Outcome(None, "cancelled", "never", ended, False))
        assert (daemon._exit_record(started) is not None) is counts
