"""A plain `gpubox daemon` (what a client starts when none runs) skips Typer, and says what the
full command line would."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

from gpubox.queue.layout import LOCK_NAME
from tests.queue.conftest import QueueBox


def test_a_plain_daemon_does_without_typer_and_a_second_one_says_why_it_stops(queue: QueueBox) -> None:
    queue.start_daemon()
    pid = queue.daemon_pid()
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpubox", "daemon"],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" not in imported and "click" not in imported
    assert "gpubox.queue.daemon" in imported and "typing" not in imported  # a cold queue's first job waits
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert said == [f"gpubox: a gpubox daemon (pid {pid}) already runs for {queue.state_dir}"]
    assert result.returncode == 1
    # Through Typer, the same line and code.
    code = "import sys; from gpubox.cli.app import run; sys.exit(run(sys.argv[1:]))"
    full = subprocess.run(
        [sys.executable, "-c", code, "daemon"],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (full.returncode, full.stderr.splitlines()) == (1, said)


def test_a_daemon_warns_of_an_unknown_variable_once_when_it_starts(queue: QueueBox) -> None:
    """In its log (a client started it), before it says it is up, and not at every pass."""
    typo = {"GPUBOX_STAT_DIR": str(queue.home / "elsewhere"), "GPUBOX_QUEUE_POLL_INTERVAL": "0.05"}
    said = "GPUBOX_STAT_DIR is not a gpubox variable (did you mean GPUBOX_STATE_DIR?)"
    added = queue("queue", "add", "--gpus", "0", "--", "sleep", "1", env=typo)
    assert added.returncode == 0 and added.stderr == f"gpubox: warning: {said}\n"
    queue.wait_state(int(added.stdout), ("succeeded",))
    assert queue("daemon", "stop").returncode == 0
    log = (queue.state_dir / "daemon.log").read_text().splitlines()
    warned = [i for i, line in enumerate(log) if "warning" in line]
    assert [log[i] for i in warned] == [f"gpubox daemon: warning: {said}"], log
    assert log[warned[0] + 1].startswith("gpubox daemon: pid ")


def test_a_daemon_waits_out_a_client_held_up_with_its_lock(queue: QueueBox) -> None:
    """A client checks for a daemon by holding the lock shared for a moment; on a loaded box that
    moment can last. The daemon waits it out rather than exit as if another daemon ran."""
    queue.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = os.open(queue.state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_SH)
    release = threading.Timer(2.0, os.close, (held,))  # and with the descriptor, the lock
    release.start()
    try:
        proc = queue.start_daemon()
    finally:
        release.join()
    assert queue.daemon_pid() == proc.pid
