"""`queue wait` reads the jobs again only when something committed, quickly while the queue is
busy and less often while it is quiet (the sleeps are recorded, not slept)."""

from __future__ import annotations

from pathlib import Path

from gpubox.queue.client import FAST_POLL_S, SLOW_POLL_S, wait_jobs
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
