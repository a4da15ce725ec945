"""The daemon's fast way from one CPU-only job to the next: while a job runs, the next one is
prepared by a spare ("armed"); at the end, the end and the next start are committed together,
and only then does the spare run it. These tests run the daemon in this process (its loop in the
main thread, as it needs for signals) so that they can see that the fast way was taken, and
check that what a client does meanwhile (add ahead, pause, cancel) still decides."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import gpubox.queue.daemon as daemon_module
from gpubox.paths import Paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.layout import socket_path
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import JobSpec, JobStore
from gpubox.queue.wire import poke
from tests.queue.conftest import NoGpus, QueueBox, wait_until

HANG = 60.0


def run_daemon(
    paths: Paths,
    scenario: Callable[[Daemon, JobStore], None],
    log: Callable[[str], None] = lambda line: None,
    gpu_source: object = None,
    config: QueueConfig | None = None,
) -> int:
    """Run a daemon in this thread while `scenario(daemon, store)` runs in another; how often the
    fast way started a job (an armed spare told to go, or a job handed on that started)."""
    config = config or QueueConfig(poll_interval_s=2.0)
    daemon = Daemon(paths, config, gpu_source=gpu_source or NoGpus(), log=log)
    fast = 0
    original = daemon._finish_and_start_next
    original_on = daemon._on

    def counted(*args: object) -> bool:
        nonlocal fast
        armed = daemon._armed
        taken = original(*args)  # type: ignore[arg-type]
        fast += taken and armed is not None and daemon._armed is not armed  # its armed spare went
        return taken

    def counted_on(store: JobStore, job_id: int, attempt: int, started_at: float) -> None:
        nonlocal fast
        handed = daemon._handed
        fast += handed is not None and (handed.job.id, handed.job.attempt + 1) == (job_id, attempt)
        original_on(store, job_id, attempt, started_at)

    daemon._finish_and_start_next = counted  # type: ignore[method-assign]
    daemon._on = counted_on  # type: ignore[method-assign]
    failure: list[BaseException] = []

    def side() -> None:
        try:
            wait_until(lambda: socket_path(paths).exists(), HANG, "the daemon to listen")
            with JobStore(paths.state_dir / "queue.db") as store:
                scenario(daemon, store)
        except BaseException as exc:
            failure.append(exc)
        finally:
            daemon._stop = True
            poke(socket_path(paths))

    thread = threading.Thread(target=side)
    thread.start()
    try:
        daemon.run()
    finally:
        daemon._stop = True
        thread.join(HANG)
    if failure:
        raise failure[0]
    return fast


def spec(command: str, **kw: object) -> JobSpec:
    return JobSpec(argv=(command,), shell=True, cwd="/", env=dict(os.environ), gpus=0, probe=False, **kw)  # type: ignore[arg-type]


def hold(go: Path) -> str:
    return f"while [ ! -e {go} ]; do sleep 0.02; done"


def wait_done(store: JobStore, ids: list[int]) -> None:
    def done() -> bool:
        jobs = [store.get(i) for i in ids]
        return all(j is not None and j.state not in ("queued", "running") for j in jobs)

    wait_until(done, HANG, f"jobs {ids} to end")


def armed_for(daemon: Daemon, job_id: int) -> Callable[[], bool]:
    return lambda: daemon._armed is not None and daemon._armed.guess.job.id == job_id


def test_each_job_runs_once_after_its_start_is_committed(paths: Paths, tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    db = paths.state_dir / "queue.db"
    # Each job reads its own row: it must already be running, attempt 1, under its supervisor.
    script = tmp_path / "check.py"
    script.write_text(
        "import os, sqlite3\n"
        "job = os.environ['GPUBOX_JOB_ID']\n"
        f"db = sqlite3.connect('file:{db}?mode=ro', uri=True)\n"
        "state, attempt, pid = db.execute('SELECT state, attempt, pid FROM jobs WHERE id = ?', (job,)).fetchone()\n"
        f"with open('{seen}', 'a') as fh:\n"
        "    fh.write(f'{job} {state} {attempt} {pid == os.getppid()}\\n')\n"
    )
    check = f"exec {sys.executable} {script}"
    ids: list[int] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids.extend(j.id for j in store.add_many([spec(check) for _ in range(12)]))
        poke(socket_path(paths))
        wait_done(store, ids)
        assert [store.require(i).state for i in ids] == ["succeeded"] * len(ids)

    fast = run_daemon(paths, scenario)
    assert seen.read_text().splitlines() == [f"{i} running 1 True" for i in ids]  # in order, once each
    assert fast >= 6, f"the fast way started only {fast} of {len(ids)} jobs"


def test_a_job_added_ahead_of_the_prepared_one_starts_first(paths: Paths, tmp_path: Path) -> None:
    order = tmp_path / "order"

    def mark(name: str) -> str:
        return f"echo {name} >> {order}"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, second, third = store.add_many(
            [spec(f"{mark('a')}; {hold(tmp_path / 'go')}"), spec(mark("b")), spec(mark("c"))]
        )
        poke(socket_path(paths))
        wait_until(armed_for(daemon, second.id), HANG, "the next job to be prepared")
        urgent = store.add(spec(mark("urgent"), priority=5))
        (tmp_path / "go").touch()
        wait_done(store, [first.id, second.id, third.id, urgent.id])

    run_daemon(paths, scenario)
    assert order.read_text().split() == ["a", "urgent", "b", "c"]


def test_a_pause_holds_the_prepared_job_and_a_cancel_drops_it(paths: Paths, tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, second, third = store.add_many(
            [spec(hold(tmp_path / "go")), spec(f"echo second >> {ran}"), spec(f"echo third >> {ran}")]
        )
        poke(socket_path(paths))
        wait_until(armed_for(daemon, second.id), HANG, "the next job to be prepared")
        store.pause()
        (tmp_path / "go").touch()
        wait_until(lambda: store.require(first.id).state == "succeeded", HANG, "the first job to end")
        time.sleep(0.5)
        assert store.require(second.id).state == "queued"
        assert not ran.exists()
        store.cancel(second.id)
        store.resume()
        poke(socket_path(paths))
        wait_done(store, [third.id])
        assert (store.require(second.id).state, store.require(third.id).state) == ("cancelled", "succeeded")

    run_daemon(paths, scenario)
    assert ran.read_text() == "third\n"


def test_a_failed_job_with_a_retry_goes_before_the_prepared_one(paths: Paths, tmp_path: Path) -> None:
    order = tmp_path / "order"

    def scenario(daemon: Daemon, store: JobStore) -> None:
        again = tmp_path / "again"
        flaky = f"echo flaky >> {order}; {hold(tmp_path / 'go')}; [ -e {again} ] || {{ touch {again}; exit 3; }}"
        first, second = store.add_many([spec(flaky, retries=1), spec(f"echo second >> {order}")])
        poke(socket_path(paths))
        wait_until(armed_for(daemon, second.id), HANG, "the next job to be prepared")
        (tmp_path / "go").touch()
        wait_done(store, [first.id, second.id])
        assert store.require(first.id).state == "succeeded" and store.require(first.id).attempt == 2

    run_daemon(paths, scenario)
    assert order.read_text().split() == ["flaky", "flaky", "second"]


def test_nothing_is_left_queued_or_running_in_the_database_after_a_stream(paths: Paths) -> None:
    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(30)])]
        poke(socket_path(paths))
        wait_done(store, ids)

    run_daemon(paths, scenario)
    db = sqlite3.connect(paths.state_dir / "queue.db")
    try:
        assert db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall() == [("succeeded", 30)]
        assert db.execute("SELECT count(*) FROM attempts WHERE outcome = 'succeeded'").fetchone() == (30,)
    finally:
        db.close()


def test_each_job_started_the_fast_way_records_its_own_logs(paths: Paths) -> None:
    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec('echo "job $GPUBOX_JOB_ID"') for _ in range(12)])]
        poke(socket_path(paths))
        wait_done(store, ids)

    assert run_daemon(paths, scenario) >= 5
    db = sqlite3.connect(paths.state_dir / "queue.db")
    try:
        rows = db.execute("SELECT job_id, number, log_path FROM attempts ORDER BY job_id").fetchall()
    finally:
        db.close()
    assert len(rows) == 12
    for job_id, number, log_path in rows:
        assert (number, log_path) == (1, str(paths.state_dir / "logs" / f"{job_id}.1"))
        assert Path(f"{log_path}.out").read_text() == f"job {job_id}\n"


def test_a_stream_does_not_look_for_a_replaced_state_folder_at_each_job(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stats a wake-up, on the way from one job to the next: looked at once every
    STATE_CHECK_S instead (here longer than the stream), and still at the first wake-up."""
    monkeypatch.setattr(daemon_module, "STATE_CHECK_S", 3600.0)
    looks: list[float] = []
    original = Daemon._state_replaced

    def counted(self: Daemon, store: JobStore) -> str | None:
        looks.append(time.monotonic())
        return original(self, store)

    monkeypatch.setattr(Daemon, "_state_replaced", counted)

    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(20)])]
        poke(socket_path(paths))
        wait_done(store, ids)

    assert run_daemon(paths, scenario) >= 10
    assert len(looks) == 1


def test_a_prepared_job_does_not_run_when_the_daemon_is_killed_and_runs_once_later(
    queue: QueueBox, tmp_path: Path
) -> None:
    daemon = queue.start_daemon()
    ran = tmp_path / "ran"
    first = queue.add("--gpus", "0", "--shell", "--", f"echo first >> {ran}; {hold(tmp_path / 'go')}")
    second = queue.add("--gpus", "0", "--shell", "--", f"echo second >> {ran}")
    queue.wait_state(first, ("running",), timeout=HANG)
    # A spare prepares the second job while the first runs: it takes the job's name.
    logs = queue.state_dir / "logs"
    wait_until(lambda: f"gpubox-job{second}" in queue.processes().values(), HANG, "the second job to be prepared")
    daemon.kill()  # SIGKILL: no go, no discard
    daemon.wait(timeout=HANG)
    (tmp_path / "go").touch()
    wait_until(lambda: (logs / f"{first}.1.exit").exists(), HANG, "the first job's exit record")
    wait_until(lambda: f"gpubox-job{second}" not in queue.processes().values(), HANG, "the prepared spare to exit")
    assert ran.read_text().split() == ["first"]  # its start was never recorded: it never ran
    assert queue.job(second)["state"] == "queued"

    waited = queue("queue", "wait", str(second), timeout=HANG)  # starts a daemon
    assert waited.returncode == 0, waited.stderr
    assert ran.read_text().split() == ["first", "second"]
    assert (queue.job(first)["state"], queue.job(second)["attempt"]) == ("succeeded", 1)


@pytest.mark.parametrize("how", ["made", "replaced"])
def test_the_prepared_job_enters_its_directory_when_it_starts_not_before(
    paths: Paths, tmp_path: Path, how: str
) -> None:
    """The job before may make, remove or replace the next job's directory: the next job runs in
    the directory as it is when it starts, as it would without the preparation."""
    where = tmp_path / "where"
    if how == "replaced":
        where.mkdir()
    states: list[str] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, second = store.add_many(
            [
                spec(f"{hold(tmp_path / 'go')}; rm -rf {where}; mkdir {where}"),
                JobSpec(
                    argv=("echo hi > marker",), shell=True, cwd=str(where), env=dict(os.environ), gpus=0, probe=False
                ),
            ]
        )
        poke(socket_path(paths))
        wait_until(armed_for(daemon, second.id), HANG, "the next job to be prepared")
        (tmp_path / "go").touch()
        wait_done(store, [first.id, second.id])
        states.extend(store.require(i).state for i in (first.id, second.id))

    run_daemon(paths, scenario)
    assert states == ["succeeded", "succeeded"]
    assert (where / "marker").read_text() == "hi\n"


def test_a_log_line_that_fails_after_the_start_is_committed_never_strands_the_job(paths: Paths, tmp_path: Path) -> None:
    """Logging a failed job can raise (stderr closed, disk full); the next job's start is committed
    by then and must still be told to go."""

    def log(line: str) -> None:
        if ": failed" in line:
            raise BrokenPipeError(32, "Broken pipe")

    found: list[tuple[str, str | None]] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, second = store.add_many(
            [spec(f"{hold(tmp_path / 'go')}; exit 3"), spec(f"echo ran > {tmp_path / 'ran'}")]
        )
        poke(socket_path(paths))
        wait_until(armed_for(daemon, second.id), HANG, "the next job to be prepared")
        (tmp_path / "go").touch()
        wait_done(store, [first.id, second.id])
        found.extend((store.require(i).state, store.require(i).reason) for i in (first.id, second.id))

    run_daemon(paths, scenario, log=log)
    assert [state for state, _ in found] == ["failed", "succeeded"], found
    assert (tmp_path / "ran").read_text() == "ran\n"


def test_in_a_stream_the_daemon_reads_no_job_between_one_and_the_next(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From one CPU-only job to the next the daemon does not read the job that ended: the
    transaction that records its end checks its state and attempt."""
    daemon_thread = threading.get_ident()
    reads = 0
    real_get = JobStore.get

    def get(self: JobStore, job_id: int) -> object:
        nonlocal reads
        reads += threading.get_ident() == daemon_thread
        return real_get(self, job_id)

    monkeypatch.setattr(JobStore, "get", get)
    n = 40

    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(n)])]
        poke(socket_path(paths))
        wait_done(store, ids)
        assert {store.require(i).state for i in ids} == {"succeeded"}

    fast = run_daemon(paths, scenario)
    assert fast >= n // 2, f"the fast way started only {fast} of {n} jobs"
    assert reads <= n - fast + 2, f"the daemon read a job {reads} times for {n} jobs ({fast} started the fast way)"
