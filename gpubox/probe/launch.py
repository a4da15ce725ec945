"""`gpubox run`: start a command with the dataloader probe attached to every Python it runs.

The command replaces gpubox (exec), so its exit code and signals are its own. The probe comes
in through site/sitecustomize.py, put first on PYTHONPATH; the sitecustomize the user already
had still runs after it.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import NoReturn

SITE_DIR = Path(__file__).resolve().parent / "site"
NOT_FOUND = 127  # as a shell says "command not found"
NOT_EXECUTABLE = 126  # found, but it cannot be run


class LaunchError(Exception):
    """The command could not be started: one line for stderr, and the exit code a shell gives."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def probe_environment(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the probe's sitecustomize first on PYTHONPATH (once, however often nested)."""
    site = str(SITE_DIR)
    entries = env.get("PYTHONPATH", "")
    if entries == site or entries.startswith(site + os.pathsep):
        return dict(env)
    # An empty PYTHONPATH stays empty: a trailing separator would put the working directory on it.
    return {**env, "PYTHONPATH": site + (os.pathsep + entries if entries else "")}


def without_probe(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the probe's sitecustomize taken off PYTHONPATH: an environment captured inside
    a probed program (a job, `gpubox run`) carries it, and would attach the probe regardless."""
    site = str(SITE_DIR)
    entries = env.get("PYTHONPATH")
    if entries is None or site not in entries.split(os.pathsep):
        return dict(env)
    kept = [entry for entry in entries.split(os.pathsep) if entry != site]
    rest = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    # Only the probe's: PYTHONPATH goes whole (empty, it would put the working directory on it).
    return {**rest, "PYTHONPATH": os.pathsep.join(kept)} if kept else rest


def exec_with_probe(argv: list[str], env: Mapping[str, str] | None = None) -> NoReturn:
    """Replace this process with `argv`, found on PATH, the probe attached."""
    if not argv or not argv[0]:
        raise LaunchError("no command to run" if not argv else "the command is empty", 2)
    child_env = probe_environment(os.environ if env is None else env)
    # Python ignores these at start, and an ignored signal stays ignored across exec: the command
    # gets them back as a shell would start it (subprocess's restore_signals does the same). A
    # SIGINT ignored by whoever started gpubox is not Python's doing, and stays ignored.
    restore = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGPIPE, signal.SIGXFSZ)}
    try:
        _exec(argv, child_env)
    finally:  # reached only when no exec took place: gpubox goes on to say why
        for sig, handler in restore.items():
            signal.signal(sig, handler)


def _exec(argv: list[str], child_env: dict[str, str]) -> NoReturn:
    try:
        os.execvpe(argv[0], argv, child_env)
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]}: command not found", NOT_FOUND) from None
    except PermissionError:
        raise LaunchError(f"{argv[0]}: permission denied", NOT_EXECUTABLE) from None
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:  # an executable script without #!: a shell runs it with sh
            import shutil  # here: the queue's spawner imports this module, and shutil is slow to import

            path = shutil.which(argv[0], path=child_env.get("PATH")) or argv[0]
            with suppress(OSError):
                os.execve("/bin/sh", ["/bin/sh", path, *argv[1:]], child_env)
        raise LaunchError(f"{argv[0]}: {exc.strerror or exc}", NOT_EXECUTABLE) from None
