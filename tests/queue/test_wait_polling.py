"""`queue wait` reads the jobs again only when something committed, quickly while the queue is
busy and less often while it is quiet (the sleeps are recorded, not slept)."""

from __future__ import annotations

from pathlib import Path

from gpubox.queue.client import FAST_POLL_S, SHORT_LINE, SLOW_POLL_S, wait_jobs
from gpubox.queue.jobs import JobSpec
from gpubox.queue.store import JobStore


def test_wait_reads_again_soon_after_a_commit_and_backs_off_while_nothing_changes(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    job = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    assert writer.mark_started(job.id, 123, (), "boot", str(tmp_path / "log"))
    reader = JobStore(db)
    sleeps: list[float] = []
    reads = 0
    real_get = reader.get

    def counting_get(job_id: int):  # type: ignore[no-untyped-def]
        nonlocal reads
        reads += 1
        return real_get(job_id)

    reader.get = counting_get  # type: ignore[method-assign]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 12:
            writer.pause("queue")  # a commit that does not end the job: read, and poll fast again
        if len(sleeps) == 14:
            writer.finish(job.id, 1, 0, "succeeded")

    ended = wait_jobs(reader, [job.id], None, sleep=sleep)
    assert ended is not None and [j.state for j in ended] == ["succeeded"]
    # Quiet: ever longer sleeps, capped; the job read once, not at every look.
    assert sleeps[0] == FAST_POLL_S
    assert sleeps[:11] == sorted(sleeps[:11]) and max(sleeps) == SLOW_POLL_S
    assert sleeps[12] == FAST_POLL_S  # something committed: look again soon
    # The check that the job exists, a read at the start and one after each commit; none between.
    assert reads == 4
    assert len(sleeps) == 14  # the end is seen at the first look after it
    reader.close()
    writer.close()


def test_wait_behind_a_long_line_looks_less_often_until_its_job_runs(tmp_path: Path) -> None:
    """Behind more than SHORT_LINE queued jobs, a commit (another job's end) does not bring the
    next look sooner: the job waited for cannot end soon, and each look takes CPU from the jobs
    that run. Once it runs, or the line is short, a commit brings a look at once again."""
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    ahead = writer.add_many([JobSpec(argv=("true",), cwd="/", env={}, gpus=0) for _ in range(SHORT_LINE + 20)])
    job = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    reader = JobStore(db)
    sleeps: list[float] = []
    ended = iter(ahead)

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) <= 10:  # a job of the line starts and ends at every look: commits
            first = next(ended)
            assert writer.mark_started(first.id, 123, (), "boot", str(tmp_path / "log"))
            writer.finish(first.id, 1, 0, "succeeded")
        elif len(sleeps) == 11:
            assert writer.mark_started(job.id, 123, (), "boot", str(tmp_path / "log"))
        elif len(sleeps) == 13:
            writer.finish(job.id, 1, 0, "succeeded")

    done = wait_jobs(reader, [job.id], None, sleep=sleep)
    assert done is not None and [j.state for j in done] == ["succeeded"]
    assert sleeps[:11] == sorted(sleeps[:11]) and sleeps[10] == SLOW_POLL_S  # commits, yet backing off
    assert sleeps[11] == FAST_POLL_S  # it runs: look again soon
    assert len(sleeps) == 13
    reader.close()
    writer.close()


def test_wait_in_a_short_line_looks_again_soon_after_each_commit(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    ahead = writer.add_many([JobSpec(argv=("true",), cwd="/", env={}, gpus=0) for _ in range(SHORT_LINE - 1)])
    job = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    reader = JobStore(db)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) <= 5:
            writer.cancel(ahead[len(sleeps) - 1].id)
        else:
            writer.cancel(job.id)

    done = wait_jobs(reader, [job.id], None, sleep=sleep)
    assert done is not None and [j.state for j in done] == ["cancelled"]
    assert sleeps == [FAST_POLL_S] * 6
    reader.close()
    writer.close()
