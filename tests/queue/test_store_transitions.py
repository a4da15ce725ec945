"""The job store's transitions, against a real SQLite file and a fake clock: how an attempt ends
(retries, preemption, stale attempts), stop requests, dependency failures, requeue, edits,
waiting reasons, pause targets, change detection and jobs lost to a reboot. No processes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpubox.queue.store import Job, JobSpec, JobStore
from tests.queue.conftest import Clock


def rows(store: JobStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, from a second connection: what "unchanged" means."""
    conn = sqlite3.connect(store.path)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
            for table in ("jobs", "attempts", "paused")
        }
    finally:
        conn.close()


def start(store: JobStore, job_id: int, boot: str = "boot-1", pid: int = 4242) -> Job:
    assert store.mark_started(job_id, pid, [], boot, log_path=f"/logs/{job_id}")
    job = store.get(job_id)
    assert job is not None and job.state == "running"
    return job


def get(store: JobStore, job_id: int) -> Job:
    job = store.get(job_id)
    assert job is not None
    return job


# finish


def test_a_failed_attempt_is_retried_until_the_retries_run_out(store: JobStore, clock: Clock) -> None:
    job = store.add(JobSpec(argv=("train",), retries=2))

    start(store, job.id)
    clock.now = 1010.0
    again = store.finish(job.id, 1, 1, "failed")
    assert again is not None
    assert (again.state, again.failures, again.attempt) == ("queued", 1, 1)
    assert again.reason == "attempt 1 failed (exit code 1); retry 1 of 2"
    assert (again.exit_code, again.ended_at, again.pid, again.request) == (None, None, None, None)

    start(store, job.id)
    clock.now = 1020.0
    again = store.finish(job.id, 2, None, "failed", reason="killed by SIGSEGV")
    assert again is not None
    assert (again.state, again.failures, again.attempt) == ("queued", 2, 2)
    assert again.reason == "attempt 2 failed (killed by SIGSEGV); retry 2 of 2"

    start(store, job.id)
    clock.now = 1030.0
    ended = store.finish(job.id, 3, 7, "failed", reason="exit code 7")
    assert ended is not None
    assert (ended.state, ended.failures, ended.attempt, ended.exit_code) == ("failed", 2, 3, 7)
    assert (ended.ended_at, ended.reason) == (1030.0, "exit code 7")

    attempts = store.attempts(job.id)
    assert [(a.number, a.outcome, a.exit_code, a.ended_at) for a in attempts] == [
        (1, "failed", 1, 1010.0),
        (2, "failed", None, 1020.0),
        (3, "failed", 7, 1030.0),
    ]
    assert attempts[1].reason == "killed by SIGSEGV"


def test_success_and_other_outcomes_end_the_job_even_with_retries_left(store: JobStore, clock: Clock) -> None:
    for outcome in ("succeeded", "cancelled", "timeout", "lost"):
        job = store.add(JobSpec(argv=("x",), retries=5))
        start(store, job.id)
        ended = store.finish(job.id, 1, 0 if outcome == "succeeded" else None, outcome)
        assert ended is not None and ended.state == outcome and ended.failures == 0
        assert ended.ended_at == clock.now


def test_finishing_an_old_attempt_returns_none_and_changes_nothing(store: JobStore, clock: Clock) -> None:
    job = store.add(JobSpec(argv=("x",), retries=1))
    start(store, job.id)
    assert store.finish(job.id, 1, 1, "failed") is not None  # back in the queue
    start(store, job.id)  # attempt 2 runs
    before = rows(store)
    clock.now = 2000.0
    assert store.finish(job.id, 1, 0, "succeeded") is None
    assert store.finish(job.id, 3, 0, "succeeded") is None
    assert store.finish(404, 1, 0, "succeeded") is None
    assert rows(store) == before
    assert store.finish(job.id, 2, 0, "succeeded") is not None
    assert store.finish(job.id, 2, 1, "failed") is None  # ended once
    assert get(store, job.id).state == "succeeded"


def test_finishing_a_queued_job_returns_none(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",)))
    before = rows(store)
    assert store.finish(job.id, 0, 0, "succeeded") is None
    assert store.finish(job.id, 1, 0, "succeeded") is None
    assert rows(store) == before


def test_an_unknown_outcome_is_refused(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",)))
    start(store, job.id)
    before = rows(store)
    with pytest.raises(ValueError, match="'queued' is not how an attempt ends"):
        store.finish(job.id, 1, 0, "queued")
    assert rows(store) == before


def test_a_preempted_attempt_goes_back_to_the_queue_without_using_a_retry(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("batch",), kind="batch", retries=0))
    start(store, job.id)
    assert get(store, job.id).state == "running"
    store.request_stop(job.id, "preempt")
    back = store.finish(job.id, 1, -15, "preempted", reason="stopped for job 9")
    assert back is not None
    assert (back.state, back.failures, back.attempt, back.request, back.pid) == ("queued", 0, 1, None, None)
    assert back.reason == "attempt 1 was preempted (stopped for job 9); back in the queue"
    (attempt,) = store.attempts(job.id)
    assert (attempt.outcome, attempt.exit_code, attempt.reason) == ("preempted", -15, "stopped for job 9")
    # Preempted again and again: still no retry used, and it can still run.
    for number in (2, 3):
        start(store, job.id)
        back = store.finish(job.id, number, None, "preempted")
        assert back is not None and back.state == "queued" and back.failures == 0
        assert back.reason == f"attempt {number} was preempted (stopped); back in the queue"
    start(store, job.id)
    ended = store.finish(job.id, 4, 2, "failed")
    assert ended is not None and ended.state == "failed"  # retries=0: the first failure ends it


# Stop requests


def test_cancel_wins_over_preempt(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",)))
    start(store, job.id)
    assert store.request_stop(job.id, "preempt").request == "preempt"
    assert store.request_stop(job.id, "cancel").request == "cancel"
    marked = store.request_stop(job.id, "preempt")
    assert (marked.state, marked.request) == ("running", "cancel")
    ended = store.finish(job.id, 1, -15, "cancelled")
    assert ended is not None and ended.request is None


def test_cancelling_a_queued_job_ends_it_at_once(store: JobStore, clock: Clock) -> None:
    job = store.add(JobSpec(argv=("x",)))
    clock.now = 1005.0
    cancelled = store.request_stop(job.id, "cancel")
    assert (cancelled.state, cancelled.ended_at, cancelled.attempt) == ("cancelled", 1005.0, 0)
    assert cancelled.reason == "cancelled before it started"
    assert store.attempts(job.id) == []
    assert not store.mark_started(job.id, 1, [], "boot-1")


def test_preempting_a_queued_or_ended_job_changes_nothing(store: JobStore) -> None:
    queued = store.add(JobSpec(argv=("x",)))
    done = store.add(JobSpec(argv=("y",)))
    start(store, done.id)
    store.finish(done.id, 1, 0, "succeeded")
    before = rows(store)
    assert store.request_stop(queued.id, "preempt").state == "queued"
    assert store.request_stop(done.id, "preempt").state == "succeeded"
    assert store.request_stop(done.id, "cancel").state == "succeeded"
    assert rows(store) == before


def test_bad_stop_requests(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",)))
    before = rows(store)
    with pytest.raises(ValueError, match="unknown stop request 'pause'"):
        store.request_stop(job.id, "pause")
    with pytest.raises(ValueError, match="job 404 does not exist"):
        store.request_stop(404, "cancel")
    assert rows(store) == before


# Dependencies, requeue, edits


def test_fail_queued_ends_only_queued_jobs(store: JobStore, clock: Clock) -> None:
    queued = store.add(JobSpec(argv=("a",)))
    running = store.add(JobSpec(argv=("b",)))
    start(store, running.id)
    clock.now = 1100.0
    assert store.fail_queued(queued.id, "job 7, which it runs after, ended failed")
    failed = get(store, queued.id)
    assert (failed.state, failed.ended_at, failed.attempt) == ("failed", 1100.0, 0)
    assert failed.reason == "job 7, which it runs after, ended failed"
    before = rows(store)
    assert not store.fail_queued(queued.id, "again")
    assert not store.fail_queued(running.id, "not queued")
    assert not store.fail_queued(404, "missing")
    assert rows(store) == before


def test_requeue_only_ended_jobs_resets_failures_and_keeps_attempts(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",), retries=1))
    start(store, job.id)
    store.finish(job.id, 1, 1, "failed")
    start(store, job.id)
    ended = store.finish(job.id, 2, 1, "failed")
    assert ended is not None and (ended.state, ended.failures) == ("failed", 1)

    again = store.requeue(job.id)
    assert (again.state, again.failures, again.attempt) == ("queued", 0, 2)
    assert (again.exit_code, again.ended_at, again.reason, again.request) == (None, None, None, None)
    assert [a.number for a in store.attempts(job.id)] == [1, 2]
    start(store, job.id)
    assert get(store, job.id).attempt == 3

    queued = store.add(JobSpec(argv=("y",)))
    before = rows(store)
    with pytest.raises(ValueError, match="is running; only a finished job can be retried"):
        store.requeue(job.id)
    with pytest.raises(ValueError, match="is queued; only a finished job can be retried"):
        store.requeue(queued.id)
    with pytest.raises(ValueError, match="job 404 does not exist"):
        store.requeue(404)
    assert rows(store) == before


def test_requeue_of_a_succeeded_or_cancelled_job(store: JobStore) -> None:
    done = store.add(JobSpec(argv=("x",)))
    start(store, done.id)
    store.finish(done.id, 1, 0, "succeeded")
    cancelled = store.add(JobSpec(argv=("y",)))
    store.cancel(cancelled.id)
    assert store.requeue(done.id).state == "queued"
    assert store.requeue(cancelled.id).state == "queued"
    assert get(store, cancelled.id).attempt == 0


def test_edit_a_queued_job(store: JobStore) -> None:
    job = store.add(JobSpec(argv=("x",), priority=1, time_limit_s=60.0))
    edited = store.edit(job.id, {"priority": 9, "time_limit_s": 7200.0, "gpus": 2, "gpu_mem_bytes": 1 << 30})
    assert (edited.spec.priority, edited.spec.time_limit_s, edited.spec.gpus) == (9, 7200.0, 2)
    assert edited.spec.gpu_mem_bytes == 1 << 30
    assert edited.spec.argv == ("x",) and edited.state == "queued"
    assert rows(store)["jobs"][0][4] == 9  # the priority column the scheduler sorts by
    assert store.edit(job.id, {"time_limit_s": None}).spec.time_limit_s is None
    pinned = store.edit(job.id, {"gpus": None, "gpu_ids": ("GPU-a", "GPU-b")})
    assert pinned.spec.gpu_ids == ("GPU-a", "GPU-b")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "infer"}, "cannot edit kind"),
        ({"argv": ("rm", "-rf", "/")}, "cannot edit argv"),
        ({"priority": 1, "env": {}}, "cannot edit env"),
        ({"gpus": -1}, "the GPU count must be 0 or more"),
        ({"gpu_mem_bytes": 0}, "must be positive"),
        ({"time_limit_s": 0.0}, "the time limit must be positive"),
        ({"time_limit_s": -5.0}, "the time limit must be positive"),
        ({"gpus": 0, "gpu_mem_bytes": 1 << 30}, "CPU-only job"),
        ({"gpu_ids": ()}, "at least one GPU"),
        ({"gpus": 3, "gpu_ids": ("GPU-a",)}, "not both"),
    ],
)
def test_bad_edits_change_nothing(store: JobStore, changes: dict[str, Any], message: str) -> None:
    job = store.add(JobSpec(argv=("x",), priority=1))
    before = rows(store)
    with pytest.raises(ValueError, match=message):
        store.edit(job.id, changes)
    assert rows(store) == before


def test_only_a_queued_job_can_be_edited(store: JobStore) -> None:
    running = store.add(JobSpec(argv=("x",)))
    start(store, running.id)
    done = store.add(JobSpec(argv=("y",)))
    start(store, done.id)
    store.finish(done.id, 1, 0, "succeeded")
    before = rows(store)
    with pytest.raises(ValueError, match="is running; only a queued job can be edited"):
        store.edit(running.id, {"priority": 3})
    with pytest.raises(ValueError, match=r"has ended \(succeeded\); only a queued job can be edited"):
        store.edit(done.id, {"priority": 3})
    with pytest.raises(ValueError, match="job 404 does not exist"):
        store.edit(404, {"priority": 3})
    assert rows(store) == before


# Reasons, pauses, change detection, reboots


def test_set_reasons_writes_only_rows_that_change(store: JobStore) -> None:
    a, b, c = store.add_many([JobSpec(argv=(x,)) for x in "abc"])
    start(store, c.id)
    conn = sqlite3.connect(store.path)
    conn.execute("CREATE TABLE written (job_id INTEGER)")
    conn.execute("CREATE TRIGGER count_writes AFTER UPDATE ON jobs BEGIN INSERT INTO written VALUES (NEW.id); END")
    conn.commit()

    def written() -> list[int]:
        ids = [r[0] for r in conn.execute("SELECT job_id FROM written ORDER BY rowid")]
        conn.execute("DELETE FROM written")
        conn.commit()
        return ids

    try:
        store.set_reasons({a.id: "waits for a CPU-only slot", b.id: None, c.id: "not queued", 404: "missing"})
        assert written() == [a.id]
        assert get(store, a.id).reason == "waits for a CPU-only slot"
        assert get(store, b.id).reason is None and get(store, c.id).reason is None
        store.set_reasons({a.id: "waits for a CPU-only slot", b.id: "the queue is paused"})
        assert written() == [b.id]
        store.set_reasons({a.id: "waits for a CPU-only slot", b.id: "the queue is paused"})
        assert written() == []
        store.set_reasons({a.id: None})
        assert written() == [a.id]
        assert get(store, a.id).reason is None
    finally:
        conn.close()


def test_pause_and_resume_say_whether_anything_changed(store: JobStore, clock: Clock) -> None:
    assert store.paused() == {}
    assert store.pause() is True
    clock.now = 1500.0
    assert store.pause() is False
    assert store.pause("GPU-abc") is True
    assert store.paused() == {"queue": 1000.0, "GPU-abc": 1500.0}
    assert store.resume("GPU-abc") is True
    assert store.resume("GPU-abc") is False
    assert store.resume("GPU-other") is False
    assert store.resume() is True
    assert store.resume() is False
    assert store.paused() == {}


def test_data_version_changes_when_another_connection_commits(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    with JobStore(path) as mine, JobStore(path) as other:
        version = mine.data_version()
        assert mine.data_version() == version
        mine.add(JobSpec(argv=("x",)))
        assert mine.data_version() == version  # its own commits do not count
        other.add(JobSpec(argv=("y",)))
        changed = mine.data_version()
        assert changed != version
        assert mine.data_version() == changed
        other.pause()
        assert mine.data_version() != changed


def test_lost_after_reboot_ends_the_attempts_too(store: JobStore, clock: Clock) -> None:
    old = store.add(JobSpec(argv=("a",)))
    new = store.add(JobSpec(argv=("b",)))
    start(store, old.id, boot="boot-1")
    store.request_stop(old.id, "cancel")
    start(store, new.id, boot="boot-2")
    clock.now = 1300.0
    assert store.lost_after_reboot("boot-2") == [old.id]
    lost = get(store, old.id)
    assert (lost.state, lost.ended_at, lost.request) == ("lost", 1300.0, None)
    assert lost.reason == "the machine restarted while the job ran"
    (attempt,) = store.attempts(old.id)
    assert (attempt.outcome, attempt.ended_at, attempt.reason) == ("lost", 1300.0, lost.reason)
    (current,) = store.attempts(new.id)
    assert (current.outcome, current.ended_at) == (None, None)
    assert store.finish(old.id, 1, 0, "succeeded") is None  # a late exit record cannot revive it
    assert store.lost_after_reboot("boot-2") == []


# several changes in one transaction


def test_an_end_and_the_next_start_commit_together_or_not_at_all(store: JobStore) -> None:
    first, second = store.add_many([JobSpec(argv=("true",)), JobSpec(argv=("true",))])
    start(store, first.id)
    before = rows(store)
    writes = store.writes
    with pytest.raises(RuntimeError), store.transaction():
        assert store.finish(first.id, 1, 0, "succeeded") is not None
        assert store.mark_started(second.id, 4343, [], "boot-1")
        raise RuntimeError("the daemon fails between the two")
    assert rows(store) == before  # neither the end nor the start
    assert store.writes == writes
    with store.transaction():
        assert store.finish(first.id, 1, 0, "succeeded") is not None
        assert store.mark_started(second.id, 4343, [], "boot-1")
        assert rows(store) == before  # another connection sees nothing until the commit
    assert store.writes == writes + 1  # one commit for both
    assert (get(store, first.id).state, get(store, second.id).state) == ("succeeded", "running")


def test_ending_an_attempt_without_reading_back_says_the_state_and_the_stop_asked(store: JobStore) -> None:
    """The daemon's way from one job to the next ends an attempt without reading the job back:
    what it is told must be what `finish` would have read, and the stop asked of the job."""
    retried = store.add(JobSpec(argv=("x",), retries=1))
    start(store, retried.id)
    assert store.end_attempt(retried.id, 1, 1, "failed") == ("queued", None)  # a retry is left
    assert get(store, retried.id).state == "queued"
    start(store, retried.id)
    assert store.end_attempt(retried.id, 2, 1, "failed") == ("failed", None)
    assert get(store, retried.id).state == "failed"
    assert store.end_attempt(retried.id, 2, 0, "succeeded") is None  # ended once

    cancelled = store.add(JobSpec(argv=("x",)))
    start(store, cancelled.id)
    store.request_stop(cancelled.id, "cancel")
    assert store.end_attempt(cancelled.id, 1, 0, "succeeded") == ("cancelled", "cancel")
    assert get(store, cancelled.id).state == "cancelled"

    preempted = store.add(JobSpec(argv=("x",)))
    start(store, preempted.id)
    store.request_stop(preempted.id, "preempt")
    assert store.end_attempt(preempted.id, 1, None, "preempted") == ("queued", "preempt")
    assert get(store, preempted.id).state == "queued"


def test_a_success_is_recorded_alike_with_or_without_a_stop_asked(store: JobStore, clock: Clock) -> None:
    """A success with no stop asked takes a shorter way (no read): the job and its attempt end as
    the longer way ends them, and a stop asked meanwhile still comes back with the state."""
    plain, asked = store.add(JobSpec(argv=("x",))), store.add(JobSpec(argv=("x",)))
    start(store, plain.id)
    start(store, asked.id)
    store.request_stop(asked.id, "preempt")  # asked, but the job succeeded first
    clock.now = 1234.5
    assert store.end_attempt(plain.id, 1, 0, "succeeded", "fine") == ("succeeded", None)
    assert store.end_attempt(asked.id, 1, 0, "succeeded", "fine") == ("succeeded", "preempt")
    for job_id in (plain.id, asked.id):
        job = get(store, job_id)
        ended = (job.state, job.exit_code, job.reason, job.ended_at, job.request)
        assert ended == ("succeeded", 0, "fine", 1234.5, None)
        (attempt,) = store.attempts(job_id)
        assert (attempt.outcome, attempt.exit_code, attempt.reason, attempt.ended_at) == ended[:4]
    assert store.end_attempt(plain.id, 1, 0, "succeeded") is None  # ended once


def test_undoing_a_start_queues_the_job_again_unless_it_was_cancelled_meanwhile(store: JobStore) -> None:
    """A start whose job never ran (a job handed on and taken back) is undone; a cancel asked of
    it meanwhile is not undone with it: the job ends cancelled, never having run."""
    again, cancelled = (store.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0)).id for _ in range(2))
    start(store, again)
    start(store, cancelled)
    store.request_stop(cancelled, "cancel")
    assert store.abandon_start(again, 1)
    assert (get(store, again).state, get(store, again).attempt, store.attempts(again)) == ("queued", 0, [])
    assert not store.abandon_start(cancelled, 1)
    job = get(store, cancelled)
    assert (job.state, job.attempt, job.request, job.reason) == (
        "cancelled",
        1,
        None,
        "cancelled on request before it ran",
    )
    assert [a.outcome for a in store.attempts(cancelled)] == ["cancelled"]
    assert not store.abandon_start(again, 1)  # not running: nothing changes
