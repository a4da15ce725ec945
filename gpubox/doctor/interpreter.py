"""Run one of gpubox.doctor's standalone scripts (torch_bench.py) under the interpreter of the
user's training environment, with a time limit, and read its one JSON answer.

What can go wrong becomes one sentence in `ScriptRun.failure` (torch missing there, timed out,
crashed with the last words of its stderr), except a `--python` that names no usable interpreter:
that is `InterpreterUnusable`, a usage error (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.doctor.loader_bench import raised_in
from gpubox.exit_codes import ExitCode, GpuboxError

SCRIPTS = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 120.0
KILL_WAIT_S = 5.0  # after SIGKILL; a process stuck in the GPU driver may never go
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


class InterpreterUnusable(GpuboxError):
    """`--python PATH` names nothing that can be run."""

    def __init__(self, python: str, why: str) -> None:
        super().__init__(f"--python {python}: {why}", ExitCode.USAGE)
        self.python = python
        self.why = why


@dataclass(frozen=True)
class ScriptRun:
    python: str
    argv: tuple[str, ...]  # the script's name and its arguments
    data: Mapping[str, Any] | None  # the JSON object it printed; None when there was none
    failure: str | None  # one sentence; None when it measured what it was asked
    returncode: int | None  # None when it was killed for running too long
    seconds: float

    @property
    def ok(self) -> bool:
        return self.failure is None


def check_interpreter(python: str) -> str:
    """The interpreter `--python` names, as a path to run; InterpreterUnusable when it cannot be.
    Symlinks are kept: a virtual environment's python is one, and resolving it leaves the venv."""
    if not python.strip():
        raise InterpreterUnusable(repr(python), "an empty path")
    if os.sep not in python:
        found = shutil.which(python)
        if found is None:
            raise InterpreterUnusable(python, "not found on PATH")
        return found
    path = os.path.abspath(os.path.expanduser(python))
    if os.path.isdir(path):
        inside = os.path.join(path, "bin", "python")
        hint = f"; did you mean {inside}?" if os.access(inside, os.X_OK) else ""
        raise InterpreterUnusable(python, f"is a directory, not an interpreter{hint}")
    if not os.path.exists(path):
        raise InterpreterUnusable(python, "no such file")
    if not os.access(path, os.X_OK):
        raise InterpreterUnusable(python, "not executable")
    return path


def run_script(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    python: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ScriptRun:
    """Run SCRIPT (a name in gpubox/doctor, or a path) with ARGS under PYTHON (default: this
    interpreter) in ENV (default: this environment), and read the JSON object it prints last."""
    interpreter = sys.executable if python is None else check_interpreter(python)
    path = Path(script) if isinstance(script, Path) else SCRIPTS / script
    argv = (path.name, *args)
    what = " ".join(argv[:2])
    started = clock()
    try:
        child = subprocess.Popen(
            [interpreter, str(path), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ if env is None else env),
            start_new_session=True,  # its own process group, so a timeout ends whatever it started
            preexec_fn=_dies_with_parent(),
        )
    except OSError as exc:  # exists but cannot be executed (not a program, no permission)
        raise InterpreterUnusable(python or interpreter, exc.strerror or str(exc)) from None
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stuck = _kill(child)
        why = f"{what} timed out after {timeout_s:g} s under {interpreter}"
        if stuck:
            why += " and did not end when killed (a GPU call may hang: see nvidia-smi)"
        return ScriptRun(interpreter, argv, None, why, None, clock() - started)
    except BaseException:  # Ctrl-C reaches only gpubox (the child has its own process group): end the child too
        _kill(child)
        raise
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    data = _answer(stdout)
    failure = _failure(what, interpreter, child.returncode, data, stderr)
    return ScriptRun(interpreter, argv, data, failure, child.returncode, clock() - started)


def _dies_with_parent() -> Callable[[], None] | None:
    """A preexec_fn after which the kernel SIGKILLs the child when gpubox ends, even by a SIGTERM
    that no except clause sees; None without prctl (not Linux). The kernel watches the thread that
    started the child, and run_script's thread waits for the child, so it outlives it."""
    from gpubox.queue.proctree import load_libc

    libc = load_libc()
    prctl = getattr(libc, "prctl", None) if libc else None
    if prctl is None:
        return None
    parent, kill = os.getpid(), int(signal.SIGKILL)  # looked up before the fork: the child only calls

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # gpubox ended before prctl took hold: no signal will come
            os._exit(1)

    return preexec


def _kill(child: subprocess.Popen[bytes]) -> bool:
    """Kill the child's process group; True when it is still there afterwards."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # it may have ended meanwhile
        os.killpg(child.pid, signal.SIGKILL)
    try:
        child.communicate(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        return True
    return False


def _answer(stdout: str) -> Mapping[str, Any] | None:
    """The last line of stdout that is a JSON object (anything the environment prints before it is ignored)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            return parsed
    return None


def _failure(what: str, python: str, code: int, data: Mapping[str, Any] | None, stderr: str) -> str | None:
    if data is not None:
        if data.get("torch_missing") is True:
            own = " (gpubox's own)" if python == sys.executable else ""
            return (
                f"torch is not installed in {python}{own}; "
                "pass --python with the interpreter of your training environment"
            )
        if data.get("torch_error"):
            return f"torch is installed in {python} but cannot be imported: {data['torch_error']}"
        error = data.get("error")
        return str(error) if error else None
    last = _last_words(stderr)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{what} was killed by {name} under {python}" + (f": {last}" if last else "")
    ended = f"{what} exited with code {code} under {python} without an answer"
    return f"{ended}: {last}" if last else ended


def _last_words(stderr: str) -> str:
    """What a crash said last: the exception line when it ended in a traceback (the message of a
    torch CUDA error goes on for lines of advice after it), else the last line."""
    cause = raised_in(stderr)
    if cause is not None:
        return cause
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
