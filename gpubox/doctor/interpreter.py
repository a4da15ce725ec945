"""Run one of gpubox.doctor's standalone scripts (torch_bench.py) under the interpreter of the
user's training environment, with a time limit, and read its one JSON answer.

What can go wrong becomes one sentence in `ScriptRun.failure` (torch missing there, timed out,
crashed with the last words of its stderr), except a `--python` that names no working Python
(check_interpreter asks it for its version first): that is `InterpreterUnusable`, a usage error
(exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
VERSION_TIMEOUT_S = 30.0  # a Python on a cold network disk can take seconds to start
MIN_PYTHON = (3, 8)  # torch 2's oldest: the scripts keep to it
# any Python answers this line, 2 included, so that an old one is named as such
_VERSION_CODE = "import sys; sys.stdout.write('gpubox-python %d.%d\\n' % sys.version_info[:2])"
KILL_WAIT_S = 5.0  # after SIGKILL; a process stuck in the GPU driver may never go
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


class InterpreterUnusable(GpuboxError):
    """`--python PATH` names nothing that can run the benchmarks: no program, or no working Python."""

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
    """The interpreter `--python` names, as a path to run; InterpreterUnusable when it cannot be,
    or when it is not a Python that can run the benchmarks (/bin/false, a Python 2). Symlinks are
    kept: a virtual environment's python is one, and resolving it leaves the venv."""
    path = _locate(python)
    _ask_version(python, path)
    return path


def _locate(python: str) -> str:
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


def _ask_version(python: str, path: str) -> None:
    """Run PATH -c with a line that any Python (2 included) answers, so that a program that is no
    Python, or a broken one, is refused before anything runs, instead of failing every benchmark."""
    try:
        child = subprocess.Popen(
            [path, "-c", _VERSION_CODE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # as run_script: a time-out ends whatever it started
            preexec_fn=_dies_with_parent(),
        )
    except OSError as exc:  # exists but cannot be executed (not a program, no permission)
        raise InterpreterUnusable(python, exc.strerror or str(exc)) from None
    try:
        out, err = child.communicate(timeout=VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(child)
        raise InterpreterUnusable(
            python, f"did not answer within {VERSION_TIMEOUT_S:g} s when asked for its version"
        ) from None
    except BaseException:
        _kill(child)
        raise
    found = re.search(r"^gpubox-python (\d+)\.(\d+)$", out.decode("utf-8", "replace"), re.MULTILINE)
    if found is not None and child.returncode == 0:
        version = (int(found[1]), int(found[2]))
        if version < MIN_PYTHON:
            need = ".".join(map(str, MIN_PYTHON))
            raise InterpreterUnusable(
                python, f"Python {found[1]}.{found[2]} is too old: the benchmarks need {need} or later"
            )
        return
    words = _last_words(err.decode("utf-8", "replace"))
    if child.returncode < 0:
        how = f"was killed by {_signal_name(-child.returncode)}"
    elif child.returncode != 0:
        how = f"exited with code {child.returncode}"
    else:
        how = "printed no version" if out.strip() else "printed nothing"
    how += f": {words}" if words else ""
    raise InterpreterUnusable(python, f"not a working Python interpreter (asked for its version, it {how})")


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
    interpreter = sys.executable if python is None else _locate(python)  # the options checked it runs
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
            if python == sys.executable:
                return (
                    f"torch is not installed in {python} (gpubox's own); "
                    "pass --python with the interpreter of your training environment"
                )
            # named with --python already: the advice is to check that choice, not to make one
            return f"torch is not installed in {python}; is it the interpreter of your training environment?"
        if data.get("torch_error"):
            return f"torch is installed in {python} but cannot be imported: {data['torch_error']}"
        error = data.get("error")
        return str(error) if error else None
    last = _last_words(stderr)
    if code < 0:
        return f"{what} was killed by {_signal_name(-code)} under {python}" + (f": {last}" if last else "")
    ended = f"{what} exited with code {code} under {python} without an answer"
    return f"{ended}: {last}" if last else ended


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_words(stderr: str) -> str:
    """What a crash said last: the exception line when it ended in a traceback (the message of a
    torch CUDA error goes on for lines of advice after it), else the last line."""
    cause = raised_in(stderr)
    if cause is not None:
        return cause
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
