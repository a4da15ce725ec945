"""Ctrl-C (SIGINT) ends every command by SIGINT (a shell shows 130) and nothing on stderr, whenever it comes:
while Python imports Typer and the command's modules (most of a short command's time) as much
as while the command waits. Real processes, real signals (`interrupted`); the queue's commands
in tests/queue/test_queue_interrupt.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.exit_codes import ExitCode
from tests.helpers import KILLED_BY_SIGINT, MOMENTS, interrupted, sigint_as_in_a_terminal


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_while_the_command_starts(moment: str) -> None:
    code, stderr = interrupted(["top", "--once", "--demo", "--interval", "30"], after_module=moment)
    assert "Traceback" not in stderr, stderr
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_while_a_help_starts(moment: str) -> None:
    """A help is printed a moment after its modules are imported: the Ctrl-C ends it, or comes
    too late to (exit 0); never a traceback."""
    code, stderr = interrupted(["report", "--help"], after_module=moment)
    assert stderr == "" and code in (KILLED_BY_SIGINT, ExitCode.OK), (code, stderr)


def test_ctrl_c_while_top_once_samples_over_its_interval() -> None:
    """The interval's wait: the snapshot's first sample is taken, the second is 30 s away."""
    code, stderr = interrupted(["top", "--once", "--demo", "--interval", "30"], after_s=1.5)
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


def test_ctrl_c_while_a_json_top_waits() -> None:
    code, stderr = interrupted(["top", "--json", "--demo", "--interval", "30"], after_s=1.5)
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


def test_ctrl_c_before_the_version_is_printed() -> None:
    """`--version` answers before Typer: a Ctrl-C as main() begins ends it the same way, or comes
    too late to (exit 0)."""
    code, stderr = interrupted(["--version"], after_module="gpubox.cli.main")
    assert stderr == "" and code in (KILLED_BY_SIGINT, ExitCode.OK)


def test_a_ctrl_c_that_python_cannot_raise_still_ends_the_command(tmp_path: Path) -> None:
    """Python prints "Exception ignored" and a traceback for a KeyboardInterrupt raised in a
    callback (a weakref callback of the import machinery, a __del__), and goes on."""
    code = (
        "from gpubox.cli import plain\n"
        "plain.catch_interrupts()\n"
        "class Callback:\n"
        "    def __del__(self):\n"
        "        raise KeyboardInterrupt\n"
        "Callback()\n"
        "print('went on')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (KILLED_BY_SIGINT, "", "")


def test_a_ctrl_c_stops_the_script_that_runs_gpubox_in_a_loop() -> None:
    """A terminal sends SIGINT to the whole foreground group: the shell running a loop of gpubox
    stops only if gpubox ends by the signal (bash goes on after a child that exits 130)."""
    import os
    import signal
    import time

    script = f"for i in 1 2 3; do {sys.executable} -m gpubox top --once --demo --interval 30; done; echo went on"
    shell = subprocess.Popen(
        ["bash", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        time.sleep(3.0)  # the first gpubox waits out its 30 s interval
        os.killpg(shell.pid, signal.SIGINT)
        out, err = shell.communicate(timeout=30)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    assert "went on" not in out, "the loop went on after Ctrl-C"
    assert shell.returncode == KILLED_BY_SIGINT and "Traceback" not in err, (shell.returncode, err)


def test_a_gpubox_started_with_ctrl_c_ignored_keeps_it_ignored() -> None:
    """A script's `gpubox run -- train.py &`: the shell ignores SIGINT in background commands, so
    that a Ctrl-C meant for the script does not stop them; gpubox and what it runs keep that."""
    import signal
    import time

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    status = subprocess.run(
        [sys.executable, "-m", "gpubox", "run", "--", "grep", "SigIgn", "/proc/self/status"],
        preexec_fn=ignore_sigint,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert int(status.stdout.split()[-1], 16) & (1 << (signal.SIGINT - 1)), status.stdout
    sleeper = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "run", "--", "sleep", "2"],
        preexec_fn=ignore_sigint,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    sleeper.send_signal(signal.SIGINT)
    _, err = sleeper.communicate(timeout=30)
    assert (sleeper.returncode, err) == (0, "")


def test_gpubox_run_gives_the_command_the_signals_python_ignores_back() -> None:
    """Python ignores SIGPIPE and SIGXFSZ at start, and exec keeps an ignored signal ignored: a
    command run by `gpubox run` must get them as a shell starts it, or `yes | head` and a file
    past its size limit would behave otherwise under gpubox."""
    import signal

    status = subprocess.run(
        [sys.executable, "-m", "gpubox", "run", "--", "grep", "SigIgn", "/proc/self/status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    ignored = int(status.stdout.split()[-1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), (sig, status.stdout)
