"""`queue wait` reads the jobs again only when something committed, quickly while the queue is
busy and less often while it is quiet (the sleeps are recorded, not slept)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gpubox.exit_codes import GpuboxError
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
    reads = _count_reads(reader)

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 12:
            writer.pause("queue")  # a commit that does not end the job: read, and poll fast again
        if len(sleeps) == 14:
            writer.finish(job.id, 1, 0, "succeeded")

    ended = wait_jobs(reader, [job.id], None, sleep=sleep)
    assert ended == {job.id: ("succeeded", 0)}
    # Quiet: ever longer sleeps, capped; the job read once, not at every look.
    assert sleeps[0] == FAST_POLL_S
    assert sleeps[:11] == sorted(sleeps[:11]) and max(sleeps) == SLOW_POLL_S
    assert sleeps[12] == FAST_POLL_S  # something committed: look again soon
    # Its state read at the start, after each of the two commits and once more to confirm the
    # end; none between; the whole job never.
    assert reads == {"ends": 4, "get": 0}
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
    assert done == {job.id: ("succeeded", 0)}
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
    assert done == {job.id: ("cancelled", None)}
    assert sleeps == [FAST_POLL_S] * 6
    reader.close()
    writer.close()


def _count_reads(store: JobStore) -> dict[str, int]:
    """Count the store's reads of states and of whole jobs, by name."""
    reads = {"ends": 0, "get": 0}
    for name in reads:
        real = getattr(store, name)

        def counting(*args: object, _real: object = real, _name: str = name) -> object:
            reads[_name] += 1
            return _real(*args)  # type: ignore[operator]

        setattr(store, name, counting)
    return reads


def test_a_wait_on_many_jobs_reads_only_the_states_of_those_not_seen_ended(tmp_path: Path) -> None:
    """`queue add --file jobs --wait` waits for a thousand jobs: a look reads the state and exit
    code of those not seen ended yet, not every whole job (its environment decoded)."""
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    jobs = writer.add_many([JobSpec(argv=("true",), cwd="/", env={"A": "b"}, gpus=0) for _ in range(600)])
    ids = [j.id for j in jobs]
    reader = JobStore(db)
    reads = _count_reads(reader)
    asked: list[int] = []
    real_ends = reader.ends

    def ends(wanted: Sequence[int]) -> dict[int, tuple[str, int | None]]:
        asked.append(len(wanted))
        return real_ends(wanted)

    reader.ends = ends  # type: ignore[method-assign,assignment]
    left = iter(jobs)

    def sleep(seconds: float) -> None:
        for job in [next(left) for _ in range(200)]:  # 200 end between two looks, the last failing
            assert writer.mark_started(job.id, 123, (), "boot", str(tmp_path / "log"))
            writer.finish(job.id, 1, 3 if job.id == ids[-1] else 0, "failed" if job.id == ids[-1] else "succeeded")

    done = wait_jobs(reader, ids, None, sleep=sleep)
    assert done is not None and list(done) == ids
    assert done[ids[-1]] == ("failed", 3) and {done[i] for i in ids[:-1]} == {("succeeded", 0)}
    # All at the start (do they exist?), those not seen ended after each commit, all once more
    # at the end.
    assert asked == [600, 600, 400, 200, 600]
    assert reads["get"] == 0
    reader.close()
    writer.close()


def test_a_job_put_back_in_the_queue_after_it_was_seen_ended_is_waited_for_again(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    first, second = writer.add_many([JobSpec(argv=("true",), cwd="/", env={}, gpus=0) for _ in range(2)])
    reader = JobStore(db)

    def first_queued_again() -> None:
        writer.cancel(second.id)
        writer.requeue(first.id)  # all were seen ended, but this one is queued again

    steps: Iterator[Callable[[], object]] = iter(
        [lambda: writer.cancel(first.id), first_queued_again, lambda: writer.cancel(first.id)]
    )
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        next(steps)()

    done = wait_jobs(reader, [first.id, second.id], None, sleep=sleep)
    assert done == {first.id: ("cancelled", None), second.id: ("cancelled", None)}
    assert len(looks) == 3  # it did not return while the first was queued again
    reader.close()
    writer.close()


def test_a_job_removed_while_waited_for_is_said_once_seen(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    job = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    other = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    reader = JobStore(db)

    def sleep(seconds: float) -> None:
        writer.cancel(job.id)
        writer.clean(0)

    with pytest.raises(GpuboxError, match=f"job {job.id} was removed"):
        wait_jobs(reader, [other.id, job.id], None, sleep=sleep)
    reader.close()
    writer.close()


def test_a_wait_says_which_job_does_not_exist_before_it_wakes_anyone(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "queue.db")
    job = store.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    woken: list[bool] = []
    with pytest.raises(ValueError, match="job 99 does not exist"):
        wait_jobs(store, [job.id, 99], None, on_wait=lambda: woken.append(True))
    assert woken == []
    store.close()


def test_a_wait_on_many_jobs_looks_soon_after_commits_only_once_few_are_left(tmp_path: Path) -> None:
    """One of the jobs waited for runs all through a stream of them: that alone does not make the
    end near while more than SHORT_LINE are left (looking every 10 ms made the stream slower)."""
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    jobs = writer.add_many([JobSpec(argv=("true",), cwd="/", env={}, gpus=0) for _ in range(SHORT_LINE + 30)])
    reader = JobStore(db)
    left = iter(jobs)
    running = next(left)
    assert writer.mark_started(running.id, 123, (), "boot", str(tmp_path / "log"))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        nonlocal running
        sleeps.append(seconds)
        for _ in range(10):  # ten end between two looks; the next one runs
            writer.finish(running.id, 1, 0, "succeeded")
            following = next(left, None)
            if following is None:
                return
            running = following
            assert writer.mark_started(running.id, 123, (), "boot", str(tmp_path / "log"))

    done = wait_jobs(reader, [j.id for j in jobs], None, sleep=sleep)
    assert done is not None and len(done) == len(jobs)
    # 130, 120, ... 110 left at the first looks: backing off; 100 left from the fourth: soon.
    assert sleeps[:3] == sorted(sleeps[:3]) and sleeps[1] > FAST_POLL_S
    assert set(sleeps[3:]) == {FAST_POLL_S}
    reader.close()
    writer.close()


def test_an_end_committed_while_the_wait_begins_is_seen_at_the_first_look(tmp_path: Path) -> None:
    """The job ends between the wait's first read and its first look (here: while `on_wait` wakes
    the daemon): a later commit must not be needed to see it."""
    db = tmp_path / "queue.db"
    writer = JobStore(db)
    job = writer.add(JobSpec(argv=("true",), cwd="/", env={}, gpus=0))
    reader = JobStore(db)

    def ends_now() -> None:
        assert writer.mark_started(job.id, 123, (), "boot", str(tmp_path / "log"))
        writer.finish(job.id, 1, 0, "succeeded")

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    done = wait_jobs(reader, [job.id], 5.0, clock=lambda: now[0], sleep=sleep, on_wait=ends_now)
    assert done == {job.id: ("succeeded", 0)}
    assert now[0] == FAST_POLL_S  # at the first look
    reader.close()
    writer.close()
