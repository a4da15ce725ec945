"""A cold queue: the first `queue add` starts the daemon before it stores the jobs (so that the
daemon gets ready while they are written), but never for input it refuses; and the daemon
starts its ledger sampler only after its first pass, so the first job does not wait for it."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpubox.queue.client as client
import gpubox.queue.daemon as daemon_module
from gpubox.cli.queue_support import add_jobs
from gpubox.exit_codes import GpuboxError
from gpubox.paths import Paths, resolve_paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.layout import db_path
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.spawner import EarlyStart
from gpubox.queue.store import JobSpec, JobStore
from gpubox.queue.submit import AddOptions, SpecBuilder
from gpubox.queue.wire import poke
from tests.queue.conftest import NoGpus, QueueBox, alive, wait_until

HANG = 60.0


@pytest.fixture
def starts(queue: QueueBox, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Each daemon start this process asks for, as the number of jobs stored at that moment; no
    daemon really starts."""
    seen: list[int] = []
    alive: list[int] = []  # held like a launched daemon holds it: "one is on its way"

    def start(paths: Paths, env: Any = None) -> int:
        with sqlite3.connect(db_path(paths)) as db:
            seen.append(db.execute("SELECT count(*) FROM jobs").fetchone()[0])
        if not alive:
            alive.append(os.open(paths.state_dir / client.STARTING_NAME, os.O_RDWR | os.O_CREAT, 0o600))
            fcntl.flock(alive[0], fcntl.LOCK_EX)
        return 0

    monkeypatch.setattr(client, "start_daemon", start)
    monkeypatch.setattr(client, "poke", lambda path: False)  # nobody listens, nor will
    yield seen
    for fd in alive:
        os.close(fd)


def test_a_cold_add_starts_the_daemon_once_before_the_jobs_are_stored(starts: list[int], queue: QueueBox) -> None:
    add_jobs(["true"], AddOptions(gpus=0), None, False)
    assert starts == [0]
    jobs = queue.home / "jobs.txt"
    jobs.write_text("true\ntrue\n")
    add_jobs(None, AddOptions(gpus=0), jobs, False)  # still no daemon holds the lock: started again
    assert starts == [0, 1]


def test_jobs_with_dependencies_start_the_daemon_only_once_stored(starts: list[int], queue: QueueBox) -> None:
    add_jobs(["true"], AddOptions(gpus=0), None, False)
    add_jobs(["true"], AddOptions(gpus=0, after="1"), None, False)
    assert starts == [0, 2]


@pytest.mark.parametrize(
    ("command", "opts", "message"),
    [
        (["true"], AddOptions(gpus=0, after="7"), "job 7 (named in --after) does not exist"),
        (["true"], AddOptions(kind="nope"), "unknown kind 'nope'"),
        ([" "], AddOptions(gpus=0), "no command given"),
        (["a\0b"], AddOptions(gpus=0), "the command contains a NUL byte"),
        (["true"], AddOptions(gpus=0, retries=10**6), "invalid retries"),
        (["true"], AddOptions(gpus=0, env=("A=\0",)), "a NUL"),
        (["true"], AddOptions(gpus=0, priority=10**9), "invalid priority"),
    ],
)
def test_refused_input_starts_no_daemon(
    starts: list[int], queue: QueueBox, command: list[str], opts: AddOptions, message: str
) -> None:
    with pytest.raises(GpuboxError) as refused:
        add_jobs(command, opts, None, False)
    assert message in refused.value.message and refused.value.code == 2
    assert starts == []
    assert not db_path(resolve_paths()).exists() or not queue.rows()


def test_a_refused_line_of_a_file_starts_no_daemon(starts: list[int], queue: QueueBox) -> None:
    jobs = queue.home / "jobs.txt"
    jobs.write_text('true\n{"argv": ["true"], "after": [9]}\n')
    with pytest.raises(GpuboxError) as refused:
        add_jobs(None, AddOptions(gpus=0), jobs, False)
    assert "jobs.txt:2: job 9 (named in after) does not exist" in refused.value.message
    assert starts == [] and not queue.rows()


def test_a_job_file_starts_the_daemon_before_its_lines_are_built(
    starts: list[int], queue: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building a thousand lines takes tens of milliseconds that a cold queue's first job waited
    for: the daemon gets ready meanwhile. A line refused then stores nothing."""
    built_after: list[int] = []
    original = SpecBuilder.__call__

    def build(self: SpecBuilder, argv: Any, opts: AddOptions) -> Any:
        built_after.append(len(starts))
        return original(self, argv, opts)

    monkeypatch.setattr(SpecBuilder, "__call__", build)
    jobs = queue.home / "jobs.txt"
    jobs.write_text("true\ntrue\n")
    add_jobs(None, AddOptions(gpus=0), jobs, False)
    assert starts == [0] and built_after == [1, 1]
    jobs.write_text('true\n{"argv": ["true"], "kind": "nope"}\n')
    with pytest.raises(GpuboxError) as refused:
        add_jobs(None, AddOptions(gpus=0), jobs, False)
    assert "jobs.txt:2: unknown kind 'nope'" in refused.value.message
    assert len(queue.rows()) == 2


def test_a_plain_add_builds_no_json_records_while_the_daemon_starts(
    starts: list[int], queue: QueueBox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ids are what a plain add prints: the JSON records of a thousand jobs took 8 ms of the
    CPU a cold queue's daemon starts with. --json still gets them."""
    import gpubox.queue.records as records

    built: list[int] = []
    original = records.job_record

    def record(job: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(job.id)
        return original(job, *args, **kwargs)

    monkeypatch.setattr(records, "job_record", record)
    jobs = queue.home / "jobs.txt"
    jobs.write_text("true\n" * 5)
    add_jobs(None, AddOptions(gpus=0), jobs, False)
    assert capsys.readouterr().out.split() == ["1", "2", "3", "4", "5"]
    assert built == []
    add_jobs(None, AddOptions(gpus=0), jobs, True)
    assert '"id": 10' in capsys.readouterr().out
    assert built == [6, 7, 8, 9, 10]


def test_a_client_that_started_the_daemon_does_not_start_another(
    queue: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its daemon may not hold the lock yet when the jobs are stored: no second one (which would
    only fail on the lock) is started then."""
    started: list[Paths] = []
    monkeypatch.setattr(client, "start_daemon", lambda paths, env=None: started.append(paths) or 0)
    monkeypatch.setattr(client, "poke", lambda path: False)
    paths = resolve_paths()
    paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    on_its_way = os.open(paths.state_dir / client.STARTING_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(on_its_way, fcntl.LOCK_EX)  # as a launched daemon holds it, until it ends
        assert client.wake_daemon(paths, started=True) == "started" and started == []
        assert client.wake_daemon(paths) == "started" and len(started) == 1
    finally:
        os.close(on_its_way)


def test_a_daemon_that_cannot_start_is_one_line_after_the_ids_of_the_stored_jobs(
    queue: QueueBox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tries: list[int] = []

    def cannot(paths: Paths, env: Any = None) -> int:
        tries.append(1)
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(client, "start_daemon", cannot)
    monkeypatch.setattr(client, "poke", lambda path: False)
    with pytest.raises(GpuboxError) as failed:
        add_jobs(["true"], AddOptions(gpus=0), None, False)
    assert failed.value.code == 4 and failed.value.message == (
        "could not start the daemon (Resource temporarily unavailable): queued jobs wait until `gpubox daemon` runs"
    )
    assert capsys.readouterr().out == "1\n"  # the job is stored, and its id said
    assert [row[0] for row in queue.rows("SELECT state FROM jobs")] == ["queued"]
    assert len(tries) == 2  # before the jobs were stored, and again after


def test_a_daemon_that_fails_to_start_early_is_started_after_the_jobs_are_stored(
    starts: list[int], queue: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = client.start_daemon
    failed: list[int] = []

    def once(paths: Paths, env: Any = None) -> int:
        if not failed:
            failed.append(1)
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return counted(paths)

    monkeypatch.setattr(client, "start_daemon", once)
    add_jobs(["true"], AddOptions(gpus=0), None, False)
    assert failed == [1] and starts == [1]


def test_a_daemon_that_ends_before_it_listens_is_started_again_once_the_jobs_are_stored(
    queue: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started early, the daemon can end before it listens (its log says why): the jobs would
    wait for the next command that starts one."""
    seen: list[int] = []

    def ends_at_once(paths: Paths, env: Any = None) -> int:
        with sqlite3.connect(db_path(paths)) as db:
            seen.append(db.execute("SELECT count(*) FROM jobs").fetchone()[0])
        return 0  # and holds nothing: it has ended

    monkeypatch.setattr(client, "start_daemon", ends_at_once)
    monkeypatch.setattr(client, "poke", lambda path: False)
    add_jobs(["true"], AddOptions(gpus=0), None, False)
    assert seen == [0, 1]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"GPUBOX_QUEUE_PREEMPT": "2"},
            "environment variable GPUBOX_QUEUE_PREEMPT: queue.preempt: expected true or false",
        ),
        ({"GPUBOX_QUEUE_POLL_INTERVAL": "0"}, "queue.poll_interval: must be more than 0"),
        ({"GPUBOX_LEDGER_INTERVAL": "soon"}, "GPUBOX_LEDGER_INTERVAL"),
    ],
)
def test_settings_the_daemon_would_refuse_refuse_the_add_that_would_start_it(
    queue: QueueBox, setting: dict[str, str], message: str
) -> None:
    """Else the daemon would say so only in its log and exit, and the job would wait for ever."""
    result = queue("queue", "add", "--gpus", "0", "--", "true", env=setting)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpubox: ") and message in result.stderr and result.stderr.count("\n") == 1
    assert not queue.rows() and queue.daemon_pid() is None


def test_the_real_first_add_runs_its_jobs_with_one_daemon(queue: QueueBox) -> None:
    jobs = queue.home / "jobs.txt"
    jobs.write_text("true\n" * 5)
    done = queue("queue", "add", "--gpus", "0", "--file", str(jobs))
    assert done.returncode == 0, done.stderr
    ids = [int(i) for i in done.stdout.split()]
    for job_id in ids:
        assert queue.wait_state(job_id, ("succeeded", "failed"), timeout=HANG)["state"] == "succeeded"
    log = (queue.state_dir / "daemon.log").read_text()
    assert log.count("pid ") == 1 and "already runs" not in log, log


def test_waiting_for_jobs_that_ended_starts_no_daemon(queue: QueueBox) -> None:
    """A daemon stopped for maintenance stays stopped: nothing is left for one to do."""
    done = queue.add("--gpus", "0", "--", "sh", "-c", "exit 3")
    assert queue.wait_state(done, ("failed",), timeout=HANG)["exit_code"] == 3
    assert queue("daemon", "stop").returncode == 0
    assert queue.daemon_pid() is None
    result = queue("queue", "wait", str(done))
    assert (result.returncode, result.stdout) == (3, f"job {done}: failed (exit 3)\n")
    no_daemon_for_a_while(queue)


def test_waiting_for_a_job_that_does_not_exist_starts_no_daemon(queue: QueueBox) -> None:
    queue.start_daemon()
    assert queue("queue", "pause").returncode == 0
    waiting = queue.add("--gpus", "0", "--", "true")
    assert queue("daemon", "stop").returncode == 0
    result = queue("queue", "wait", str(waiting), "999")
    assert (result.returncode, result.stderr) == (2, "gpubox: job 999 does not exist\n")
    no_daemon_for_a_while(queue)


def no_daemon_for_a_while(queue: QueueBox) -> None:
    deadline = time.monotonic() + 2.0  # a daemon started now would hold its lock well within this
    while time.monotonic() < deadline:
        assert queue.daemon_pid() is None
        time.sleep(0.05)


@pytest.mark.parametrize("problem", ["long", "folder"])
def test_a_socket_no_daemon_could_listen_on_is_said_by_the_client(queue: QueueBox, problem: str) -> None:
    """Else the daemon would die at once, saying why only in its log, and the jobs wait for ever."""
    if problem == "long":
        runtime = queue.home / ("r" * 110)
        queue.extra_env["GPUBOX_RUNTIME_DIR"] = str(runtime)
        message = "is longer than 107 bytes: set a shorter GPUBOX_RUNTIME_DIR"
    else:
        queue.socket.mkdir(parents=True)
        message = f"a folder is in the way of the daemon's socket {queue.socket}: remove it"
    result = queue("queue", "add", "--gpus", "0", "--", "true")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("gpubox: ") and result.stderr.endswith(message + "\n")
    assert result.stderr.count("\n") == 1
    assert not queue.rows() and queue.daemon_pid() is None
    daemon = queue("daemon")  # in the foreground: one line, not a traceback in its log
    assert daemon.returncode == 1 and daemon.stderr.count("\n") == 1 and message in daemon.stderr


def test_clients_that_find_no_daemon_at_once_start_one_between_them(queue: QueueBox) -> None:
    """Twelve cold adds at the same moment: one daemon, not one each that then exits because
    another holds the lock (each a Python started for nothing, and a line in the log)."""
    env = {**os.environ, **queue.env}
    clients = [
        subprocess.Popen(
            [sys.executable, "-m", "gpubox", "queue", "add", "--gpus", "0", "--", "true"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(12)
    ]
    ids = []
    for adder in clients:
        out, err = adder.communicate(timeout=HANG)
        assert adder.returncode == 0, err
        ids.append(int(out))
    for job_id in ids:
        assert queue.wait_state(job_id, ("succeeded", "failed"), timeout=HANG)["state"] == "succeeded"
    log = (queue.state_dir / "daemon.log").read_text()
    assert log.count("gpubox daemon: pid ") == 1 and "already runs" not in log, log


# The ledger's sampler


class Sampler:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def start(self) -> None:
        self.seen.append("started")

    def stop(self) -> None:
        self.seen.append("stopped")


def run_daemon(
    tmp_path: Path,
    recording: Any,
    log: list[str],
    stop_when: Callable[[], bool] = lambda: True,
    argv: tuple[str, ...] = ("true",),
) -> JobStore:
    """A daemon in this thread, with two CPU-only jobs queued before it starts; it stops once they
    have ended and `stop_when()` holds. No timed pass comes meanwhile (a poll interval of 60 s)."""
    base = tmp_path / "box"
    paths = resolve_paths(
        {"HOME": str(base), "GPUBOX_STATE_DIR": str(base / "state"), "GPUBOX_RUNTIME_DIR": str(base / "run")}
    )
    store = JobStore(db_path(paths))
    spec = JobSpec(argv=argv, cwd="/", env=dict(os.environ), gpus=0, probe=False)
    store.add_many([spec, spec])
    config = QueueConfig(poll_interval_s=60.0)
    daemon = Daemon(paths, config, gpu_source=NoGpus(), log=log.append, recording=recording)

    def done() -> bool:
        return all(j.state == "succeeded" for j in store.list()) and stop_when()

    def stop_when_done() -> None:
        try:
            wait_until(done, HANG, "the jobs to end")
        finally:  # also when that never comes: the test then fails on what it saw, not hangs
            daemon._stop = True
            poke(daemon.socket_path)  # it sees the stop once something wakes it

    watcher = threading.Thread(target=stop_when_done)
    watcher.start()
    daemon.run()
    watcher.join(HANG)
    return store


def test_the_sampler_starts_once_no_job_waits_and_stops_with_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not with the first jobs of a cold queue: its imports and first samples held them back.
    monkeypatch.setattr(daemon_module, "RECORDING_AFTER_S", HANG)
    seen: list[str] = []
    states: list[list[str]] = []

    def recording(daemon: Daemon) -> Sampler:
        with JobStore(daemon.db_path) as store:  # what the passes did before the sampler
            states.append([j.state for j in store.list()])
        return Sampler(seen)

    log: list[str] = []
    store = run_daemon(tmp_path, recording, log, stop_when=lambda: bool(seen))
    assert states == [["succeeded", "succeeded"]]
    assert seen == ["started", "stopped"]
    assert [j.state for j in store.list()] == ["succeeded", "succeeded"]


def test_the_sampler_starts_a_while_after_the_daemon_even_while_jobs_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However long the poll interval: GPU use is recorded from early on, whatever runs.
    monkeypatch.setattr(daemon_module, "RECORDING_AFTER_S", 0.3)
    go = tmp_path / "go"
    seen: list[str] = []
    states: list[list[str]] = []
    after: list[float] = []

    def recording(daemon: Daemon) -> Sampler:
        after.append(time.monotonic() - daemon.started_mono)
        with JobStore(daemon.db_path) as store:
            states.append([j.state for j in store.list()])
        go.touch()  # the jobs end only once the sampler has started
        return Sampler(seen)

    log: list[str] = []
    hold = ("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    store = run_daemon(tmp_path, recording, log, stop_when=lambda: bool(seen), argv=hold)
    assert len(after) == 1 and after[0] < 10, after  # not at the timed pass, 60 s in
    assert states == [["running", "queued"]]
    assert seen == ["started", "stopped"]
    assert [j.state for j in store.list()] == ["succeeded", "succeeded"]


def test_a_sampler_that_cannot_start_is_said_once_and_the_queue_runs_on(tmp_path: Path) -> None:
    calls: list[int] = []

    def recording(daemon: Daemon) -> Sampler:
        calls.append(1)
        raise OSError("no ledger here")

    log: list[str] = []
    store = run_daemon(tmp_path, recording, log, stop_when=lambda: bool(calls))
    assert [j.state for j in store.list()] == ["succeeded", "succeeded"]
    assert calls == [1]
    assert [line for line in log if "not recorded" in line] == ["GPU use is not recorded: OSError: no ledger here"]


# `gpubox daemon` with the spawner's start recorded: whether the daemon's module was imported by
# then, and the spawner's pid; then the real start.
RECORD_SPAWNER_START = r"""
import sys
import gpubox.queue.spawner as spawner
real = spawner.Spawner.start
record = sys.argv[1]
def start(self):
    real(self)
    with open(record, "a") as out:
        out.write(f"{'gpubox.queue.daemon' in sys.modules} {self.proc.pid}\n")
spawner.Spawner.start = start
sys.argv = ["gpubox", "daemon"]
from gpubox.cli.main import main
raise SystemExit(main())
"""


def _daemon_recording_spawner_start(queue: QueueBox, record: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", RECORD_SPAWNER_START, str(record)],
        env={**os.environ, **queue.env, **queue.extra_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def test_the_daemon_starts_its_spawner_before_it_imports_the_daemon(queue: QueueBox, tmp_path: Path) -> None:
    """A cold queue's first job waits for the daemon's Python and the spawner's: they start side by
    side, and the daemon runs its jobs with the spawner it started first."""
    record = tmp_path / "starts"
    daemon = _daemon_recording_spawner_start(queue, record)
    try:
        wait_until(lambda: queue.daemon_pid() == daemon.pid and queue.socket.exists(), HANG, "the daemon to listen")
        go = tmp_path / "go"
        job = queue.add("--gpus", "0", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
        supervisor = queue.wait_state(job, ("running",), timeout=HANG)["pid"]
        starts = record.read_text().split()
        assert starts[0] == "False" and len(starts) == 2, starts  # once, before the daemon's imports
        assert _parent_of(supervisor) == int(starts[1])  # the job's supervisor came from that spawner
        go.touch()
        assert queue.wait_state(job, ("succeeded", "failed"), timeout=HANG)["state"] == "succeeded"
    finally:
        daemon.terminate()
        daemon.wait(HANG)


def test_a_daemon_that_cannot_run_leaves_no_spawner_behind(queue: QueueBox, tmp_path: Path) -> None:
    """Started while another daemon runs, it stops at once, and so does the spawner it started."""
    first = queue.start_daemon()
    try:
        record = tmp_path / "starts"
        second = _daemon_recording_spawner_start(queue, record)
        _, err = second.communicate(timeout=HANG)
        assert second.returncode == 1 and b"already runs" in err, err
        spawner_pid = int(record.read_text().split()[1])
        wait_until(lambda: not alive(spawner_pid), HANG, "the spawner to end")
        assert queue.daemon_pid() == first.pid
    finally:
        first.terminate()
        first.wait(HANG)


def test_the_spawner_module_imports_little(tmp_path: Path) -> None:
    """What `gpubox daemon` imports before it starts the spawner: not the daemon, nor the
    supervisor's modules or dataclasses (14 ms on their own)."""
    probe = "import sys, gpubox.queue.spawner; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded = set(result.stdout.split())
    assert "gpubox.queue.spawner" in loaded
    assert not loaded & {"gpubox.queue.daemon", "gpubox.queue.supervise", "dataclasses", "typing"}, loaded


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_spare_that_comes_before_the_first_pass_runs_the_first_job(tmp_path: Path) -> None:
    """The daemon asks for a spare at start when jobs are queued; one that arrives before its
    first pass has planned is kept for the first job, not sent away for another fork."""
    base = tmp_path / "box"
    paths = resolve_paths(
        {"HOME": str(base), "GPUBOX_STATE_DIR": str(base / "state"), "GPUBOX_RUNTIME_DIR": str(base / "run")}
    )
    store = JobStore(db_path(paths))
    go = tmp_path / "go"
    (job,) = store.add_many(
        [JobSpec(argv=("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"), cwd="/", gpus=0, probe=False)]
    )
    early = EarlyStart()
    spawner = early.spawner
    assert spawner is not None and spawner.control is not None and early.failure is None
    spawner.ask()  # as the daemon does for queued jobs: here, answered before the daemon runs
    ready, _, _ = select.select([spawner.control], [], [], HANG)
    assert ready, "the spawner did not answer"
    first_spare = int(spawner.control.recv(64, socket.MSG_PEEK).split()[0])
    daemon = Daemon(paths, QueueConfig(poll_interval_s=60.0), gpu_source=NoGpus(), log=lambda line: None, early=early)

    def stop_when_running() -> None:
        try:
            wait_until(lambda: store.get(job.id).state == "running", HANG, "the job to start")  # type: ignore[union-attr]
        finally:
            daemon._stop = True
            poke(daemon.socket_path)

    watcher = threading.Thread(target=stop_when_running)
    watcher.start()
    try:
        daemon.run()
    finally:
        watcher.join(HANG)
        go.touch()
        early.close()
    assert store.get(job.id).pid == first_spare  # type: ignore[union-attr]


def _spawner_of(daemon: int) -> int | None:
    """The daemon's spawner (its child running gpubox.queue.zygote), or None."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == daemon and b"gpubox.queue.zygote" in Path(f"/proc/{name}/cmdline").read_bytes():
                return int(name)
        except (OSError, ValueError):
            continue
    return None


def test_ctrl_c_while_the_daemon_starts_ends_it_without_a_word(queue: QueueBox) -> None:
    """Ctrl-C goes to the terminal's whole process group. The spawner, in a group of its own, is
    left to end with the daemon: caught while it still imported, it said so with a traceback."""
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "daemon"],
        env={**os.environ, **queue.env, **queue.extra_env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group, as a terminal's foreground job has
    )
    deadline = time.monotonic() + HANG
    while (spawner := _spawner_of(daemon.pid)) is None:
        assert daemon.poll() is None and time.monotonic() < deadline, "no spawner started"
        time.sleep(0.001)
    assert os.getpgid(spawner) == spawner != os.getpgid(daemon.pid)
    os.killpg(daemon.pid, signal.SIGINT)  # as soon as the spawner runs: it is still importing
    _, err = daemon.communicate(timeout=HANG)
    # Stopped (0), or caught before its handlers were set: 130, or ended by SIGINT as gpubox ends on Ctrl-C.
    assert daemon.returncode in (0, 130, -signal.SIGINT) and b"Traceback" not in err, (daemon.returncode, err)
    wait_until(lambda: not alive(spawner), HANG, "the spawner to end with the daemon")


def test_a_daemon_started_for_queued_jobs_asks_for_a_spare_for_the_next_one_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One spare for the first job and one to prepare the second while the first runs: asked for
    only after the first start, it came once a short first job had ended, and the second start
    took the slow way (5 to 7 ms)."""
    seen: list[int] = []
    original = Daemon._pass

    def first_pass(self: Daemon, store: JobStore, full: bool = True) -> None:
        if not seen and self.pool is not None:
            seen.append(len(self.pool.ready) + self.pool.spawner.asked)
        original(self, store, full)

    monkeypatch.setattr(Daemon, "_pass", first_pass)
    log: list[str] = []
    store = run_daemon(tmp_path, None, log)
    assert seen == [2]
    assert [j.state for j in store.list()] == ["succeeded", "succeeded"]
