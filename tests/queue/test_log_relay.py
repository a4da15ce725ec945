"""A job's stdout and stderr go through pipes that its supervisor copies to `<prefix>.out` and
`<prefix>.err`, each made only when something is written: first the relay alone, then real jobs
through the queue.

Every timeout here is only a guard against a hang, never a measure of speed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpubox.queue import log_relay
from gpubox.queue.log_relay import LogRelay, copy_while_waiting
from tests.queue.conftest import QueueBox, wait_until

END_STATES = ("succeeded", "failed", "cancelled", "timeout", "lost")
HANG = 60.0
MIB = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


def test_no_file_until_something_is_written(tmp_path: Path) -> None:
    relay = LogRelay(tmp_path / "1.1.err")
    relay.started()  # as after the spawn: only the job's copy of the write end is left (none here)
    relay.pump()
    relay.close()
    assert not (tmp_path / "1.1.err").exists()


def test_written_bytes_and_notes_land_in_order(tmp_path: Path) -> None:
    path = tmp_path / "1.1.err"
    relay = LogRelay(path)
    job_end = os.dup(relay.write_end)  # the job's copy
    relay.started()
    os.write(job_end, b"first\n")
    relay.note("time limit of 1s reached; stopping the job")  # after what the job wrote before it
    os.write(job_end, b"last words\n")
    os.close(job_end)
    relay.close()  # copies what the pipe still holds
    assert path.read_bytes() == b"first\ngpubox: time limit of 1s reached; stopping the job\nlast words\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_wait_copies_while_it_waits_so_the_writer_never_blocks(tmp_path: Path) -> None:
    path = tmp_path / "1.1.err"
    relay = LogRelay(path)
    # A writer of 1 MiB, far more than a pipe holds: it finishes only if the relay reads meanwhile.
    out = LogRelay(tmp_path / "1.1.out")
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.write(1, b'o' * {MIB}); os.write(2, b'e' * {MIB})"],
        stdout=out.write_end,
        stderr=relay.write_end,
        close_fds=True,
    )
    out.started()
    relay.started()
    for _ in range(int(HANG / 0.05)):
        if writer.poll() is not None:
            break
        copy_while_waiting([out, relay], 0.05)
    assert writer.returncode == 0
    out.close()
    relay.close()
    assert (tmp_path / "1.1.out").read_bytes() == b"o" * MIB
    assert path.read_bytes() == b"e" * MIB


def test_a_write_that_fails_is_dropped_and_the_pipe_still_drains(tmp_path: Path) -> None:
    relay = LogRelay(tmp_path / "gone" / "deeper" / "1.1.err")  # its folder cannot be made
    job_end = os.dup(relay.write_end)
    relay.started()
    os.write(job_end, b"lost\n")
    relay.pump()  # no exception: the output is lost, as the job's own write would have failed
    os.write(job_end, b"x" * 1000)  # the pipe was emptied: the job is not held back
    os.close(job_end)
    relay.close()
    assert not (tmp_path / "gone").exists()


def test_a_fifo_where_the_log_goes_loses_the_output_instead_of_hanging(tmp_path: Path) -> None:
    """Opening a FIFO to write blocks until something reads it: the supervisor would hang there
    for good, its job blocked on a full pipe and deaf to a cancel. The output is lost instead."""
    path = tmp_path / "1.1.out"
    os.mkfifo(path)
    relay = LogRelay(path)
    job_end = os.dup(relay.write_end)
    relay.started()
    os.write(job_end, b"lost\n")
    done = threading.Event()

    def pump() -> None:
        relay.pump()
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    if not done.wait(HANG):
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # let the hung open go, then fail
        pytest.fail("the relay hung opening a FIFO")
    os.write(job_end, b"x" * 1000)  # the pipe was emptied: the job is not held back
    os.close(job_end)
    relay.close()
    assert stat.S_ISFIFO(os.stat(path).st_mode)


def test_output_lost_to_a_full_disk_is_marked_where_it_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job never sees a write to its log fail: the log itself says what is missing."""
    path = tmp_path / "1.1.out"
    relay = LogRelay(path)
    job_end = os.dup(relay.write_end)
    relay.started()
    real_write = os.write
    full = [False]

    def write(fd: int, data: bytes) -> int:
        if full[0] and fd not in (job_end, relay.read_end):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    os.write(job_end, b"first\n")
    relay.pump()
    full[0] = True
    os.write(job_end, b"x" * 1000)
    relay.pump()
    full[0] = False  # space freed
    os.write(job_end, b"last\n")
    relay.pump()
    os.write(job_end, b"y" * 10)
    full[0] = True  # full again at the end: said if it can be when the relay closes
    relay.pump()
    full[0] = False
    os.close(job_end)
    relay.close()
    lost = "gpubox: {} byte(s) of output lost here: No space left on device\n"
    assert path.read_text() == "first\n" + lost.format(1000) + "last\n" + lost.format(10)


def test_a_log_removed_while_the_job_writes_is_made_again_and_let_go(tmp_path: Path) -> None:
    """The logs folder removed to free space: the space is freed (the relay holds no removed
    file), and what the job writes next lands in a new log, as it would for a log not made yet."""
    folder = tmp_path / "logs"
    folder.mkdir()
    relay = LogRelay(folder / "1.1.out")
    job_end = os.dup(relay.write_end)
    relay.started()
    os.write(job_end, b"before\n")
    relay.pump()
    shutil.rmtree(folder)
    os.write(job_end, b"after\n")
    relay.pump()
    removed = [fd for fd in os.listdir("/proc/self/fd") if _target(fd) == f"{folder}/1.1.out (deleted)"]
    assert removed == []
    os.close(job_end)
    relay.close()
    assert (folder / "1.1.out").read_bytes() == b"after\n"


def _target(fd: str) -> str:
    """What this process's descriptor `fd` is open on ("<path> (deleted)" for a removed file)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the listing's own descriptor, closed by now
        return ""


def test_a_logs_folder_another_relay_makes_first_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs write their first bytes after the logs folder was removed: one relay makes the
    folder again a moment before the other, whose output lands all the same."""
    folder = tmp_path / "logs"
    real_mkdir = os.mkdir

    def made_first(path: str | os.PathLike[str], mode: int = 0o777) -> None:
        real_mkdir(path, mode)  # the other job's relay
        real_mkdir(path, mode)  # this one's: FileExistsError

    monkeypatch.setattr(os, "mkdir", made_first)
    relay = LogRelay(folder / "1.1.out")
    job_end = os.dup(relay.write_end)
    relay.started()
    os.write(job_end, b"first\n")
    os.close(job_end)
    relay.close()
    assert (folder / "1.1.out").read_bytes() == b"first\n"


# Through the queue


def test_a_job_leaves_only_the_logs_it_wrote_to(queue: QueueBox) -> None:
    silent = queue.add("--gpus", "0", "--", "true")
    talks = queue.add("--gpus", "0", "--", "echo", "hi")
    for job_id in (silent, talks):
        assert queue.wait_state(job_id, END_STATES, timeout=HANG)["state"] == "succeeded"
    logs = queue.state_dir / "logs"
    assert sorted(p.name for p in logs.glob(f"{silent}.*")) == []
    assert sorted(p.name for p in logs.glob(f"{talks}.*")) == [f"{talks}.1.out"]
    for job_id, stream, text in ((silent, "", ""), (silent, "--stderr", ""), (talks, "--stderr", "")):
        shown = queue("queue", "logs", *([stream] if stream else []), str(job_id))
        assert (shown.returncode, shown.stdout, shown.stderr) == (0, text, "")
        followed = queue("queue", "logs", "-f", *([stream] if stream else []), str(job_id), timeout=HANG)
        assert (followed.returncode, followed.stdout) == (0, text)


def test_a_large_stderr_written_just_before_the_end_is_whole(queue: QueueBox) -> None:
    code = f"import os, sys; os.write(1, b'o' * {MIB} + b'out\\n'); os.write(2, b'e' * {MIB} + b'end\\n'); sys.exit(3)"
    job_id = queue.add("--gpus", "0", "--no-probe", "--", sys.executable, "-c", code)
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert (row["state"], row["exit_code"]) == ("failed", 3)
    err = queue.state_dir / "logs" / f"{job_id}.1.err"
    assert err.read_bytes() == b"e" * MIB + b"end\n"
    assert queue("queue", "logs", str(job_id)).stdout == "o" * MIB + "out\n"


def test_a_job_writing_much_as_it_stops_is_not_held_back(queue: QueueBox, tmp_path: Path) -> None:
    """On SIGTERM the job writes 1 MiB to stderr and exits 0: more than a pipe holds, so it
    ends within its grace period only if the supervisor reads while it waits for it."""
    ready = tmp_path / "ready"
    code = (
        "import os, signal\n"
        # Blocked and waited for: the job's group and each of its processes get a SIGTERM each.
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "signal.sigwait({signal.SIGTERM})\n"
        f"os.write(2, b'b' * {MIB} + b'bye\\n')\n"
    )
    job_id = queue.add("--gpus", "0", "--no-probe", "--", sys.executable, "-c", code)
    wait_until(ready.exists, HANG, "the job's SIGTERM handler in place")
    assert queue("queue", "cancel", str(job_id)).returncode == 0
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    # SIGKILL (exit 137) at the end of the grace period would mean it was held back that long.
    assert (row["state"], row["exit_code"]) == ("cancelled", 0)
    assert (queue.state_dir / "logs" / f"{job_id}.1.err").read_bytes() == b"b" * MIB + b"bye\n"


def test_a_helper_that_keeps_stderr_open_does_not_hold_up_the_end(queue: QueueBox) -> None:
    job_id = queue.add("--gpus", "0", "--shell", "--", "echo before >&2; (sleep 300 >&2 &); echo after")
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert row["state"] == "succeeded"
    err = (queue.state_dir / "logs" / f"{job_id}.1.err").read_text()
    assert err == "before\ngpubox: stopped 1 process(es) the job left running\n"


def test_a_writer_that_never_lets_the_pipe_empty_does_not_hold_the_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor copies between its other duties (a time limit, a cancel): one pump must
    return even while the job refills the pipe as fast as it is read."""
    relay = LogRelay(tmp_path / "1.1.out")
    relay.started()
    reads = []

    def always_more(fd: int, n: int) -> bytes:  # a job that refills the pipe at once, for ever
        reads.append(fd)
        if len(reads) > 1000:
            raise AssertionError("one pump copied for as long as the job wrote")
        return b"x" * n

    monkeypatch.setattr(log_relay.os, "read", always_more)
    relay.pump()
    monkeypatch.undo()
    assert 0 < len(reads) <= 1000
    relay.close()
    assert (tmp_path / "1.1.out").stat().st_size == len(reads) * 65536


def test_a_pipe_a_job_enlarged_is_copied_whole_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job may enlarge its pipe (F_SETPIPE_SZ; past 1 MiB as root) and end with it full: what
    it holds is still the job's output, copied whole when the relay closes, however many reads
    that takes (here 4 KiB reads of a 1 MiB pipe: 256, more than one copy's bound)."""
    monkeypatch.setattr(log_relay, "_CHUNK", 4096)
    relay = LogRelay(tmp_path / "1.1.out")
    fcntl.fcntl(relay.write_end, F_SETPIPE_SZ, MIB)  # allowed to anyone (/proc/sys/fs/pipe-max-size)
    job_end = os.dup(relay.write_end)
    relay.started()
    os.write(job_end, b"y" * MIB)  # the job writes it all, and ends
    os.close(job_end)
    relay.close()
    assert (tmp_path / "1.1.out").stat().st_size == MIB
