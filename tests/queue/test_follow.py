"""`queue logs -f` reads each attempt's log to its end: what a job writes just before it ends,
or before the next attempt starts, is never skipped (driven here without processes)."""

from __future__ import annotations

from pathlib import Path

from gpubox.queue.client import follow


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
