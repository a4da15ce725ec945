"""The spawner that forks supervisors for the daemon: what it hands over, and how it ends."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpubox.queue import proctree, supervise, zygote
from gpubox.queue import spawner as spawner_end
from gpubox.queue.jobs import JobSpec
from gpubox.queue.spawner import _PYTHON, Spawner
from tests.queue.conftest import QueueBox, blocked_in, wait_until


def _launch(
    tmp_path: Path,
    argv: tuple[str, ...],
    attempt: int = 1,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    job_id: int = 7,
    db_path: Path | None = None,
) -> supervise.Launch:
    return supervise.Launch(
        job_id=job_id,
        attempt=attempt,
        spec=JobSpec(argv=argv, cwd=str(cwd or tmp_path), env=env or dict(os.environ), gpus=0, probe=False),
        gpu_uuids=(),
        log_prefix=tmp_path / f"{job_id}.{attempt}",
        boot_id="b",
        grace_s=1.0,
        daemon_pid=os.getpid(),
        socket_path=tmp_path / "no.sock",
        db_path=db_path,
    )


@contextmanager
def _spawner() -> Iterator[tuple[Spawner, int]]:
    """A spawner as the daemon has one, and the read end of the done pipe its supervisors write."""
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    spawner = Spawner(done_w)
    try:
        yield spawner, done_r
    finally:
        spawner.close()
        os.close(done_r)
        os.close(done_w)


def _hand_over(spare: supervise.Spare, launch: supervise.Launch) -> None:
    """As the daemon does once the start is recorded: the launch, then "go"."""
    supervise.prepare(spare, launch)
    supervise.go(spare)


def test_a_spare_runs_the_job_it_is_handed_and_reports_it(tmp_path: Path) -> None:
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        assert proctree.is_alive(spare.pid, spare.pid_start)
        # Its own session (once it has started): the daemon's terminal and signals miss it.
        wait_until(lambda: os.getsid(spare.pid) == spare.pid, 10, "the spare to leave the session")
        _hand_over(spare, _launch(tmp_path, ("sh", "-c", "echo out; echo err >&2; exit 3")))
        line = os.read(done_r, 4096)
        parsed = supervise.parse_done(line.rstrip(b"\n"))
        assert parsed is not None
        assert parsed[:2] == (7, 1)
        assert (parsed[2].exit_code, parsed[2].outcome) == (3, "failed")
        assert (tmp_path / "7.1.out").read_text() == "out\n"
        assert (tmp_path / "7.1.err").read_text() == "err\n"
        # Nobody says the end is recorded (a daemon killed after the message, say): the exit record.
        supervise.discard(spare)
        wait_until(lambda: (tmp_path / "7.1.exit").exists(), 10, "the exit record")
        wait_until(lambda: bool((tmp_path / "7.1.exit").read_text()), 10, "the exit record's text")
        assert json.loads((tmp_path / "7.1.exit").read_text())["exit_code"] == 3


def test_a_discarded_spare_runs_nothing_and_the_spawner_ends_with_its_daemon(tmp_path: Path) -> None:
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    spawner = Spawner(done_w)
    spawner.ask()
    spare = spawner.receive()
    supervise.discard(spare)
    wait_until(lambda: not proctree.is_alive(spare.pid, spare.pid_start), 10, "the discarded spare to exit")
    assert not list(tmp_path.iterdir())  # it wrote nothing
    proc = spawner.proc
    assert proc is not None
    spawner.close()  # the daemon's end closes: the spawner sees EOF
    assert proc.returncode == 0
    os.close(done_r)
    os.close(done_w)


def test_a_prepared_spare_runs_its_job_only_on_go_and_nothing_when_discarded(tmp_path: Path) -> None:
    with _spawner() as (spawner, done_r):
        spawner.ask()
        kept = spawner.receive()
        spawner.ask()
        dropped = spawner.receive()
        ran = tmp_path / "ran"
        supervise.prepare(kept, _launch(tmp_path, ("sh", "-c", f"echo kept >> {ran}")))
        supervise.prepare(dropped, _launch(tmp_path, ("sh", "-c", f"echo dropped >> {ran}"), attempt=2))
        # Prepared (each took its launch and the job's name): nothing has run.
        named = [Path(f"/proc/{spare.pid}/comm") for spare in (kept, dropped)]
        wait_until(lambda: all(p.read_text().strip() == "gpubox-job7" for p in named), 10, "the launches read")
        time.sleep(0.3)
        assert not ran.exists()
        supervise.discard(dropped)
        wait_until(lambda: not proctree.is_alive(dropped.pid, dropped.pid_start), 10, "the discarded spare to exit")
        supervise.go(kept)
        parsed = supervise.parse_done(os.read(done_r, 4096).rstrip(b"\n"))
        assert parsed is not None and parsed[:2] == (7, 1) and parsed[2].outcome == "succeeded"
        assert ran.read_text() == "kept\n"
        assert not (tmp_path / "7.2.exit").exists()  # the discarded one ran nothing and reported nothing
        supervise.discard(kept)
        wait_until(lambda: not proctree.is_alive(kept.pid, kept.pid_start), 10, "the supervisor to exit")


def test_the_daemon_replaces_a_killed_spawner(queue: QueueBox) -> None:
    queue.start_daemon()
    first = queue.add("--gpus", "0", "--", "true")
    assert queue("queue", "wait", str(first)).returncode == 0
    daemon = queue.daemon_pid()
    assert daemon
    spawners = [
        pid
        for pid in proctree.descendants(daemon)
        if b"gpubox.queue.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    for pid in spawners:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    second = queue.add("--gpus", "0", "--", "sh", "-c", "exit 5")
    assert queue("queue", "wait", str(second), "--timeout", "60s").returncode == 5


def test_a_job_gets_only_stdin_stdout_stderr_and_no_ignored_signals(queue: QueueBox) -> None:
    # Nothing of the daemon, the spawner or the supervisor (pipes, sockets, the database) may
    # reach the job, and signals gpubox ignores (SIGINT, SIGHUP, SIGPIPE) must not stay ignored.
    job = queue.add("--gpus", "0", "--", "sh", "-c", "ls /proc/$$/fd; grep SigIgn /proc/$$/status")
    assert queue("queue", "wait", str(job)).returncode == 0
    out = queue("queue", "logs", str(job)).stdout.splitlines()
    assert out[:3] == ["0", "1", "2"] and len(out) == 4, out
    mask = int(out[3].split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGTERM, signal.SIGXFSZ):
        assert not mask & (1 << (sig - 1)), f"{sig.name} is ignored in the job"


def _done(done_r: int) -> tuple[int, int, supervise.Outcome]:
    ready, _, _ = select.select([done_r], [], [], 10)
    assert ready, "no done message"
    parsed = supervise.parse_done(os.read(done_r, 4096).rstrip(b"\n"))
    assert parsed is not None
    return parsed


def test_a_supervisor_told_its_end_is_recorded_runs_the_next_job_as_a_new_process_would(tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    report = 'echo "$PPID $(pwd) ${ONLY_FIRST:-unset}" > "$OUT"'
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        env = {**os.environ, "ONLY_FIRST": "yes", "OUT": str(tmp_path / "one")}
        _hand_over(spare, _launch(tmp_path, ("sh", "-c", report), cwd=first_dir, env=env))
        assert _done(done_r)[:2] == (7, 1)
        assert supervise.recorded(spare)
        # Idle, it keeps no job's directory busy (an unmount would fail) and says it is idle.
        wait_until(
            lambda: Path(f"/proc/{spare.pid}/comm").read_text().strip() == "gpubox-idle", 10, "the supervisor idle"
        )
        assert os.readlink(f"/proc/{spare.pid}/cwd") == "/"
        env = {k: v for k, v in os.environ.items() if k != "ONLY_FIRST"} | {"OUT": str(tmp_path / "two")}
        _hand_over(spare, _launch(tmp_path, ("sh", "-c", report + "; exit 4"), 2, second_dir, env))
        number, attempt, outcome = _done(done_r)
        assert (number, attempt, outcome.exit_code) == (7, 2, 4)
        # The same supervisor ran both, each job in its own directory with its own environment.
        assert (tmp_path / "one").read_text() == f"{spare.pid} {first_dir} yes\n"
        assert (tmp_path / "two").read_text() == f"{spare.pid} {second_dir} unset\n"
        assert supervise.recorded(spare)
        assert not list(tmp_path.glob("7.*.exit"))  # both ends recorded: no exit record
        open_fds = len(os.listdir(f"/proc/{spare.pid}/fd"))
        _hand_over(spare, _launch(tmp_path, ("true",), 3))
        assert _done(done_r)[2].outcome == "succeeded"
        assert supervise.recorded(spare)
        wait_until(lambda: len(os.listdir(f"/proc/{spare.pid}/fd")) == open_fds, 10, "the logs to be closed")
        supervise.discard(spare)  # sent away while idle: it exits, writing nothing
        wait_until(lambda: not proctree.is_alive(spare.pid, spare.pid_start), 10, "the supervisor to exit")
        assert not list(tmp_path.glob("7.*.exit"))


@pytest.mark.parametrize("when", ["idle", "running"])
def test_a_signalled_supervisor_reports_its_stop_and_leaves_only_when_sent_away(tmp_path: Path, when: str) -> None:
    """A stop signal is for the job the supervisor runs. One that comes while it waits for its
    next job stops that job before it runs: a job handed over is always reported, never dropped
    with the supervisor. (The daemon keeps no supervisor that was stopped.)"""
    ran = tmp_path / "ran"
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        if when == "idle":
            _hand_over(spare, _launch(tmp_path, ("true",)))
            assert _done(done_r)[2].outcome == "succeeded"
            assert supervise.recorded(spare)
            os.kill(spare.pid, signal.SIGTERM)
            _hand_over(spare, _launch(tmp_path, ("sh", "-c", f"touch {ran}"), 2))
            number, attempt, outcome = _done(done_r)
            assert (number, attempt, outcome.outcome, outcome.ran) == (7, 2, "cancelled", False)
            assert not ran.exists()
        else:
            _hand_over(spare, _launch(tmp_path, ("sleep", "30")))
            wait_until(lambda: bool(proctree.descendants(spare.pid)), 10, "the job to start")
            os.kill(spare.pid, signal.SIGTERM)
            assert _done(done_r)[2].outcome == "cancelled"
        assert supervise.recorded(spare)
        time.sleep(0.2)
        assert proctree.is_alive(spare.pid, spare.pid_start)  # it waits for the daemon's word
        supervise.discard(spare)
        wait_until(lambda: not proctree.is_alive(spare.pid, spare.pid_start), 10, "the supervisor to exit")
        assert not list(tmp_path.glob("7.*.exit"))


def test_a_supervisor_waits_for_recorded_only_so_long() -> None:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        orders = supervise._Orders(r)
        assert not orders.expect(supervise.RECORDED, 0.05)  # nothing came: it leaves its exit record
        os.write(w, supervise.RECORDED)
        assert orders.expect(supervise.RECORDED, 0.05)
        os.close(w)
        assert not orders.expect(supervise.RECORDED, 5)  # EOF: at once
    finally:
        os.close(r)


def test_a_done_message_is_written_whole_whatever_its_reason() -> None:
    reason = "é" * 1000 + ": command not found"  # JSON makes each é six bytes
    line = supervise.done_message(7, 2, supervise.Outcome(127, "failed", reason, 1.5))
    assert len(line) <= select.PIPE_BUF and line.endswith(b"\n") and line.count(b"\n") == 1
    parsed = supervise.parse_done(line.rstrip(b"\n"))
    assert parsed is not None and parsed[:2] == (7, 2)
    assert parsed[2].exit_code == 127 and parsed[2].reason and reason.startswith(parsed[2].reason)


def test_a_success_is_said_without_json_and_every_end_reads_back_as_it_was() -> None:
    """Most ends are successes, said on the way from one job to the next: in a short line the
    daemon reads without JSON (where it said it reads it). Every other end reads back whole."""
    success = supervise.Outcome(0, "succeeded", None, 1796188922.0033467)
    line = supervise.done_message(7, 2, success, short_success=True)
    assert line == b"7 2 ok 1796188922.0033467\n"
    assert supervise.parse_done(line.rstrip(b"\n")) == (7, 2, success)
    others = [
        supervise.Outcome(0, "succeeded", "a note", 1.5),
        supervise.Outcome(0, "succeeded", None, None),
        supervise.Outcome(0, "cancelled", "stopped by SIGTERM", 1.5),
        supervise.Outcome(None, "cancelled", "stopped by SIGTERM before it ran", 1.5, ran=False),
        supervise.Outcome(3, "failed", "exit code 3", 1.5),
    ]
    for outcome in [*others, success]:
        for short in (True, False):
            line = supervise.done_message(7, 2, outcome, short_success=short)
            assert (b" ok " in line) == (short and outcome is success)
            assert supervise.parse_done(line.rstrip(b"\n")) == (7, 2, outcome)
    nan_json = b'7 2 {"exit_code": 0, "outcome": "succeeded", "ended_at": NaN}'
    for odd in (b"7 2 ok later", b"7 2 ok nan", b"7 2 ok inf", nan_json):
        parsed = supervise.parse_done(odd)
        assert parsed is None or parsed[2].ended_at is None, odd  # never a time that is not one


@pytest.mark.parametrize("reads_ok", [True, False])
def test_supervisors_say_a_success_in_a_short_line_only_to_a_daemon_that_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_ok: bool
) -> None:
    """A spawner started by an older daemon (its own died after an upgrade in place) is not told
    that the daemon reads "ok": its supervisors say a success in JSON, which that daemon reads."""
    monkeypatch.setattr(spawner_end, "_READS", ("ok",) if reads_ok else ())
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        _hand_over(spare, _launch(tmp_path, ("true",)))
        line = os.read(done_r, 4096)
        assert line.startswith(b"7 1 ok " if reads_ok else b'7 1 {"exit_code": 0, "outcome": "succeeded"'), line
        parsed = supervise.parse_done(line.rstrip(b"\n"))
        assert parsed is not None and parsed[2].outcome == "succeeded" and parsed[2].ended_at
        supervise.discard(spare)


def test_the_spawner_puts_gpubox_after_the_standard_library(tmp_path: Path) -> None:
    """Installed in site-packages, gpubox's folder holds other packages too: none of them may
    stand in for a standard module in the spawner (it starts without `site`)."""
    (tmp_path / "enum.py").write_text("raise ImportError('a package shadowed the standard enum')\n")
    stub = tmp_path / "gpubox" / "queue"
    stub.mkdir(parents=True)
    (tmp_path / "gpubox" / "__init__.py").write_text("")
    (stub / "__init__.py").write_text("")
    (stub / "zygote.py").write_text(
        "import enum, sys\n"
        "def main(argv):\n"
        "    print(enum.__file__, sys.path.index(sys.argv[1]) == len(sys.path) - 1, '' in sys.path, argv)\n"
        "    return 0\n"
    )
    result = subprocess.run([*_PYTHON, str(tmp_path), "3", "4"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    where, last, cwd_on_path, argv = result.stdout.split(" ", 3)
    assert not where.startswith(str(tmp_path)) and (last, cwd_on_path) == ("True", "False")
    assert argv.strip() == "['3', '4']"


def test_the_spawner_imports_no_typing() -> None:
    """A cold queue's first job waits for the spawner's imports; `typing` was 4 ms of them, for
    annotations only."""
    root = str(Path(zygote.__file__).resolve().parent.parent.parent)
    probe = "import sys; sys.path[:] = [p for p in sys.path if p] + [sys.argv[1]]; import gpubox.queue.zygote"
    result = subprocess.run(
        [_PYTHON[0], "-S", "-X", "importtime", "-c", probe, root], capture_output=True, text=True, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "gpubox.queue.supervise" in imported and "typing" not in imported


def test_a_fifo_in_the_way_of_an_exit_record_fails_it_instead_of_hanging(tmp_path: Path) -> None:
    path = tmp_path / "7.1.exit"
    os.mkfifo(f"{path}.tmp")
    failed: list[BaseException] = []

    def write() -> None:
        try:
            supervise.write_exit(path, 1, supervise.Outcome(0, "succeeded", None))
        except OSError as exc:
            failed.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(30)
    if writer.is_alive():
        os.close(os.open(f"{path}.tmp", os.O_RDONLY | os.O_NONBLOCK))  # let the hung open go
        pytest.fail("write_exit hung opening a FIFO")
    assert failed and failed[0].errno == errno.ENXIO and not path.exists()


def test_a_command_that_cannot_be_bytes_fails_its_job_instead_of_losing_it(tmp_path: Path) -> None:
    # `queue add` refuses it now; a job stored before (or written by hand) must still end with a reason.
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        _hand_over(spare, _launch(tmp_path, ("echo", "\ud800")))
        number, attempt, outcome = _done(done_r)
        assert (number, attempt, outcome.outcome, outcome.exit_code) == (7, 1, "failed", supervise.NOT_EXECUTABLE)
        assert outcome.reason is not None and "cannot be run" in outcome.reason
        assert "cannot be run" in (tmp_path / "7.1.err").read_text()
        supervise.discard(spare)


def test_logs_that_cannot_be_opened_fail_the_job_with_the_reason(tmp_path: Path) -> None:
    # A read-only or full file system, here a file where the logs folder should be: the job does
    # not run, and ends failed with the reason, instead of its supervisor dying (`lost`).
    (tmp_path / "logs").write_text("not a folder")
    launch = dataclasses.replace(
        _launch(tmp_path, ("touch", str(tmp_path / "ran"))), log_prefix=tmp_path / "logs" / "7.1"
    )
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        _hand_over(spare, launch)
        number, attempt, outcome = _done(done_r)
        assert (number, attempt, outcome.outcome, outcome.exit_code) == (7, 1, "failed", None)
        assert outcome.reason == f"its logs cannot be opened in {tmp_path / 'logs'}: Not a directory"
        assert not (tmp_path / "ran").exists()
        assert supervise.recorded(spare)
        supervise.discard(spare)


def test_a_logs_folder_removed_meanwhile_is_made_again(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    folder = tmp_path / "state" / "logs"  # removed by someone freeing space, say
    launch = dataclasses.replace(_launch(tmp_path, ("echo", "hi")), log_prefix=folder / "7.1")
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        _hand_over(spare, launch)
        assert _done(done_r)[2].outcome == "succeeded"
        assert (folder / "7.1.out").read_text() == "hi\n"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        supervise.discard(spare)


def test_an_exit_record_that_cannot_be_written_is_tried_again_until_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk: until the record is on disk the outcome lives only in the supervisor; giving
    # up would leave the job `lost` with its exit code unknown.
    real = supervise.write_exit
    tries: list[int] = []

    def full_twice(path: Path, attempt: int, result: supervise.Outcome) -> None:
        tries.append(1)
        if len(tries) <= 2:
            raise OSError(28, "No space left on device")
        real(path, attempt, result)

    monkeypatch.setattr(supervise, "write_exit", full_twice)
    monkeypatch.setattr(supervise, "EXIT_RETRY_S", 0.01)
    launch = _launch(tmp_path, ("true",))
    supervise._leave_exit_record(launch, supervise.Outcome(0, "succeeded", None, 5.0))
    assert len(tries) == 3
    found = supervise.read_exit(tmp_path / "7.1.exit", 1)
    assert found is not None and (found.exit_code, found.outcome) == (0, "succeeded")
    assert not (tmp_path / "7.1.exit.tmp").exists()


def test_an_exit_record_cut_short_leaves_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "write", lambda fd, data: len(data) // 2)  # the disk filled mid-write
    with pytest.raises(OSError):
        supervise.write_exit(tmp_path / "7.1.exit", 1, supervise.Outcome(0, "succeeded", None))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_spawner_whose_daemon_is_gone_leaves_quietly(tmp_path: Path) -> None:
    # The daemon asked for a spare, then died (SIGKILL): the spare cannot be handed over. The
    # spawner exits without a traceback in the daemon's log, and the spare runs nothing.
    log = tmp_path / "daemon.log"
    saved = os.dup(2)
    with open(log, "wb") as fh:
        os.dup2(fh.fileno(), 2)  # the spawner writes where the daemon's stderr goes
        try:
            done_r, done_w = os.pipe2(os.O_CLOEXEC)
            spawner = Spawner(done_w)
            spawner.ask()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    proc = spawner.proc
    assert proc is not None and spawner.control is not None
    spawner.control.close()  # the daemon's end, gone right after asking
    spawner.control = None
    assert proc.wait(timeout=10) == 0
    os.close(done_r)
    os.close(done_w)
    assert log.read_text() == ""


def test_logs_that_could_not_be_opened_when_prepared_are_tried_again_at_go(tmp_path: Path) -> None:
    # Prepared while the disk was full (or read-only) for a moment: what counts is the start.
    blocker = tmp_path / "logs"
    blocker.write_text("not a folder yet")
    launch = dataclasses.replace(_launch(tmp_path, ("echo", "ran")), log_prefix=blocker / "7.1")
    with _spawner() as (spawner, done_r):
        spawner.ask()
        spare = spawner.receive()
        supervise.prepare(spare, launch)
        wait_until(lambda: _waits_for_go(spare.pid, 7), 10, "the spare to try its logs, then wait for go")
        blocker.unlink()
        blocker.mkdir()
        supervise.go(spare)
        assert _done(done_r)[2].outcome == "succeeded"
        assert (blocker / "7.1.out").read_text() == "ran\n"
        supervise.discard(spare)


def _waits_for_go(pid: int, job_id: int) -> bool:
    """The spare has read its launch (it took the job's name, then prepared it) and is back
    reading its pipe, for "go"."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        return name == f"gpubox-job{job_id}" and blocked_in(pid, "pipe")
    except OSError:
        return False


def _returns(call: Callable[[], None], within: float = 10.0) -> None:
    """Run `call`; fail, rather than hang, when it has not returned in time."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), "it did not return"


@pytest.mark.parametrize("error", [errno.EROFS, errno.EACCES])
def test_an_exit_record_is_not_tried_again_past_an_error_freed_space_does_not_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    tries: list[int] = []

    def refused(path: Path, attempt: int, result: supervise.Outcome) -> None:
        tries.append(1)
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(supervise, "write_exit", refused)
    monkeypatch.setattr(supervise, "EXIT_RETRY_S", 0.01)
    _returns(
        lambda: supervise._leave_exit_record(_launch(tmp_path, ("true",)), supervise.Outcome(0, "succeeded", None))
    )
    assert len(tries) == 1


def test_a_full_disk_is_waited_out_only_until_a_stop_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[int] = []

    def full(path: Path, attempt: int, result: supervise.Outcome) -> None:
        tries.append(1)
        if len(tries) == 3:
            supervise._stops.append(signal.SIGTERM)  # a cancel, while it waits
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(supervise, "write_exit", full)
    monkeypatch.setattr(supervise, "EXIT_RETRY_S", 0.01)
    monkeypatch.setattr(supervise, "_stops", [])
    _returns(
        lambda: supervise._leave_exit_record(_launch(tmp_path, ("true",)), supervise.Outcome(0, "succeeded", None))
    )
    assert len(tries) == 3


def test_a_state_folder_removed_on_purpose_is_not_made_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    launch = dataclasses.replace(_launch(tmp_path, ("true",)), log_prefix=state / "logs" / "7.1")
    _returns(lambda: supervise._leave_exit_record(launch, supervise.Outcome(0, "succeeded", None)))
    assert not state.exists()
    state.mkdir()  # only the logs folder is gone: made again, and the record left
    supervise._leave_exit_record(launch, supervise.Outcome(0, "succeeded", None))
    assert supervise.read_exit(state / "logs" / "7.1.exit", 1) is not None
