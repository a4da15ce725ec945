"""`queue logs -f` reads each attempt's log to its end: what a job writes just before it ends,
or before the next attempt starts, is never skipped (driven here without processes)."""

from __future__ import annotations

from pathlib import Path

from gpubox.queue.client import each_attempt, follow


def test_what_the_job_wrote_after_the_last_read_and_before_it_ended_is_read(tmp_path: Path) -> None:
    log = tmp_path / "1.1.out"
    log.write_bytes(b"line 1\n")
    ends: list[int] = []

    def done() -> bool:
        if not ends:  # the job writes its last line between the follower's read and this look
            with open(log, "ab") as fh:
                fh.write(b"LAST LINE\n")
        ends.append(1)
        return True

    assert b"".join(follow(lambda: log, done, sleep=lambda s: None)) == b"line 1\nLAST LINE\n"


def test_the_end_of_an_attempt_is_read_before_the_next_ones_log(tmp_path: Path) -> None:
    first, second = tmp_path / "1.1.out", tmp_path / "1.2.out"
    first.write_bytes(b"att 1 start\n")
    current = [first]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        # While the follower sleeps, attempt 1 ends and attempt 2 starts and ends.
        sleeps.append(seconds)
        with open(first, "ab") as fh:
            fh.write(b"att 1 end\n")
        second.write_bytes(b"att 2\n")
        current[0] = second

    done = lambda: bool(sleeps)  # noqa: E731
    assert b"".join(follow(lambda: current[0], done, sleep)) == b"att 1 start\natt 1 end\natt 2\n"


def test_an_attempt_that_began_and_ended_between_two_looks_is_read_whole(tmp_path: Path) -> None:
    """A job that fails at once and is retried: its first attempt's output (the traceback) is
    printed before the retry's, not skipped because the follower never saw it running."""
    logs = {n: tmp_path / f"1.{n}.out" for n in (1, 2)}
    attempt = [0]  # not started yet
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:  # while the follower sleeps, attempt 1 runs and fails; attempt 2 starts
            logs[1].write_bytes(b"att 1: Traceback\n")
            logs[2].write_bytes(b"att 2\n")
            attempt[0] = 2

    done = lambda: len(sleeps) >= 2  # noqa: E731
    path_for = each_attempt(lambda: attempt[0], logs.__getitem__)
    assert b"".join(follow(path_for, done, sleep)) == b"att 1: Traceback\natt 2\n"


def test_a_follower_starts_at_the_latest_attempt(tmp_path: Path) -> None:
    logs = {n: tmp_path / f"1.{n}.out" for n in (1, 2, 3)}
    for n, log in logs.items():
        log.write_bytes(f"att {n}\n".encode())
    path_for = each_attempt(lambda: 3, logs.__getitem__)
    assert b"".join(follow(path_for, lambda: True, lambda s: None)) == b"att 3\n"


def test_every_attempt_is_read_when_the_job_ended_before_the_first_look(tmp_path: Path) -> None:
    """Three quick attempts, all over before the follower first looks: the first printed nothing
    (its error went to stderr), and the second's output must not be skipped on the way to the third."""
    logs = {n: tmp_path / f"1.{n}.out" for n in (1, 2, 3)}
    logs[1].write_bytes(b"")
    logs[2].write_bytes(b"att 2\n")
    logs[3].write_bytes(b"att 3\n")
    attempt = [0]  # queued when the follower starts

    def sleep(seconds: float) -> None:
        attempt[0] = 3  # all three ran and the job failed while it slept

    path_for = each_attempt(lambda: attempt[0], logs.__getitem__)
    done = lambda: attempt[0] == 3  # noqa: E731
    assert b"".join(follow(path_for, done, sleep)) == b"att 2\natt 3\n"


def test_a_log_removed_and_made_again_is_read_from_its_start(tmp_path: Path) -> None:
    """The logs folder removed to free space while the job runs: its supervisor makes a new log
    for what the job writes next, shorter than what was read of the old one."""
    log = tmp_path / "1.1.out"
    log.write_bytes(b"a long first part\n")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        log.unlink()
        log.write_bytes(b"new\n")

    done = lambda: bool(sleeps)  # noqa: E731
    assert b"".join(follow(lambda: log, done, sleep)) == b"a long first part\nnew\n"
