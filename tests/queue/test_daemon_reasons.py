"""Why each queued job waits, as the daemon keeps it between passes: for jobs that still wait, and
for no other. Between timed passes it reads only the best-ranked queued jobs (a window), so a job
that leaves the queue without starting (a dependency failed, a cancel) must not keep its reason:
the reasons decide whether a spare supervisor is kept, and the ledger counts them as waiting time.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpubox.paths import Paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.layout import socket_path
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import JobSpec, JobStore
from gpubox.queue.wire import poke
from tests.queue.conftest import wait_until
from tests.queue.test_queue_fast_start import HANG, hold, run_daemon

# No timed pass within a test: every pass after the first reads a window.
WINDOWED = QueueConfig(poll_interval_s=600.0)


def spec(command: str, **kw: object) -> JobSpec:
    return JobSpec(argv=(command,), shell=True, cwd="/", env=dict(os.environ), gpus=0, probe=False, **kw)  # type: ignore[arg-type]


def nothing_waits(daemon: Daemon) -> bool:
    assert daemon.pool is not None
    return not daemon.reasons and not daemon.pool.ready and not daemon.pool.spawner.asked


def test_a_dependant_that_fails_without_running_no_longer_waits(paths: Paths, tmp_path: Path) -> None:
    def scenario(daemon: Daemon, store: JobStore) -> None:
        first = store.add(spec(f"{hold(tmp_path / 'go')}; exit 1"))
        poke(socket_path(paths))
        wait_until(lambda: store.require(first.id).state == "running", HANG, "the first job to start")
        dependant = store.add(spec("true", after=(first.id,)))
        poke(socket_path(paths))
        wait_until(lambda: dependant.id in daemon.reasons, HANG, "the dependant to wait")
        (tmp_path / "go").touch()
        wait_until(lambda: store.require(dependant.id).state == "failed", HANG, "the dependant to fail")
        # The queue is empty: no reason left, no supervisor kept for a job to come.
        wait_until(lambda: nothing_waits(daemon), 10, "the daemon to see that nothing waits")

    run_daemon(paths, scenario, config=WINDOWED)


def test_a_queued_job_cancelled_by_a_client_no_longer_waits(paths: Paths, tmp_path: Path) -> None:
    def scenario(daemon: Daemon, store: JobStore) -> None:
        first, second = store.add_many([spec(hold(tmp_path / "go")), spec("true")])
        poke(socket_path(paths))
        wait_until(lambda: second.id in daemon.reasons, HANG, "the second job to wait")
        store.cancel(second.id)
        poke(socket_path(paths))
        (tmp_path / "go").touch()
        wait_until(lambda: store.require(first.id).state == "succeeded", HANG, "the first job to end")
        wait_until(lambda: nothing_waits(daemon), 10, "the daemon to see that nothing waits")

    run_daemon(paths, scenario, config=WINDOWED)
