"""Helpers shared by tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_gpubox(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (what a script or cron job sees)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpubox", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# Modules whose import ends at moments of a command's start: main() begins; Typer is half
# imported; the commands' modules are being imported.
# How a Ctrl-C ends gpubox: by SIGINT itself, as a program that does not catch it (a shell shows
# 130), so that a script running gpubox in a loop stops too.
KILLED_BY_SIGINT = -signal.SIGINT

MOMENTS = ("gpubox.cli.main", "typer._click.types", "gpubox.cli.daemon")


def sigint_as_in_a_terminal() -> None:
    """For preexec_fn: SIGINT at its default action, as a terminal's foreground job has it. A test
    run started in the background of a script inherits SIGINT ignored, and gpubox keeps an ignored
    SIGINT ignored (on purpose): the Ctrl-C a test sends would then do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    after_module: str | None = None,
    after_output: bool = False,
    after_s: float = 0.0,
) -> tuple[int, str]:
    """Run `gpubox ARGS` and send it SIGINT (a Ctrl-C) once `after_module` is imported, or once it
    printed a line (`after_output`), or `after_s` seconds after it started; return its exit code
    and stderr.

    For `after_module` it runs under `python -X importtime`, which writes a line on stderr as each
    module's import ends; those lines are left out of the stderr returned."""
    importtime = ["-X", "importtime"] if after_module is not None else []
    proc = subprocess.Popen(
        [sys.executable, *importtime, "-m", "gpubox", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if after_output else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=sigint_as_in_a_terminal,
    )
    assert proc.stderr is not None
    said: list[str] = []
    # Reading its stderr to the end waits for gpubox to exit: one that goes on after the Ctrl-C is
    # killed (exit -9, which fails the test) rather than left to hang the test run.
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        if after_module is not None:
            for line in proc.stderr:
                if not line.startswith("import time:"):
                    said.append(line)
                elif line.rstrip().endswith(f" {after_module}"):
                    break
            else:
                raise AssertionError(f"gpubox ended before it imported {after_module}: {''.join(said)}")
        elif after_output:
            assert proc.stdout is not None
            assert proc.stdout.readline(), f"gpubox printed nothing: {proc.stderr.read()}"
        else:
            time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        said += [line for line in proc.stderr if not line.startswith("import time:")]
        return proc.wait(timeout=30), "".join(said)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
