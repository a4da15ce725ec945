"""A daemon whose passes fail (a damaged or locked database) goes on trying, and says so in its
log once per failure, not once per try: a database that fails every pass for days must not fill
the disk with the same line every few seconds."""

from __future__ import annotations

import pytest

from gpubox.paths import Paths
from gpubox.queue import daemon as daemon_module
from gpubox.queue.daemon import Daemon
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import StoreError
from tests.queue.conftest import NoGpus

DAMAGED = StoreError("the job database x is damaged (database disk image is malformed)")


def run_failing(paths: Paths, failures: list[Exception]) -> list[str]:
    """Run a daemon whose passes raise `failures`, one a pass, then succeed once; its log."""
    log: list[str] = []
    daemon = Daemon(paths, QueueConfig(poll_interval_s=0.2), gpu_source=NoGpus(), log=log.append)
    left = list(failures)

    def failing_pass(*args: object, **kwargs: object) -> None:
        if left:
            raise left.pop(0)
        daemon._stop = True  # one pass that works, then stop

    daemon._pass = failing_pass  # type: ignore[method-assign]
    daemon.run()
    assert not left
    return [line for line in log if "trying again" in line or "working again" in line]


def test_the_same_failure_is_logged_once_then_its_end(paths: Paths) -> None:
    log = run_failing(paths, [DAMAGED] * 6 + [ValueError("something else")] + [DAMAGED] * 2)
    assert log == [
        f"StoreError: {DAMAGED}; trying again",
        "ValueError: something else; trying again",
        f"StoreError: {DAMAGED}; trying again",
        "working again",
    ]


def test_a_failure_that_lasts_is_said_again_now_and_then(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_module, "REPEAT_LOG_S", 0.0)
    log = run_failing(paths, [DAMAGED] * 3)
    assert log == [
        f"StoreError: {DAMAGED}; trying again",
        f"still failing: StoreError: {DAMAGED}; trying again",
        f"still failing: StoreError: {DAMAGED}; trying again",
        "working again",
    ]


def test_a_failure_that_lasts_past_a_thousand_passes_does_not_end_the_daemon(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait between tries doubles up to the poll interval: 2**1024 would overflow a float."""
    waits: list[float] = []
    monkeypatch.setattr(daemon_module.time, "sleep", waits.append)
    log = run_failing(paths, [DAMAGED] * 1100)
    assert log == [f"StoreError: {DAMAGED}; trying again", "working again"]
    assert len(waits) >= 1100 and max(waits) == 0.2
