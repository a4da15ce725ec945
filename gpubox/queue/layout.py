"""Where the queue keeps its files, and who holds the daemon's lock. Imported by every client,
so it stays light: no scheduling, no process handling."""

from __future__ import annotations

import fcntl
import os
import zlib
from pathlib import Path

from gpubox.paths import Paths

DB_NAME = "queue.db"  # in the state directory
LOCK_NAME = "daemon.lock"  # in the state directory: one daemon per database
# In the state directory: held by a client that starts a daemon, then by that daemon for its life,
# so that clients which find no daemon at the same moment start one, not one each.
STARTING_NAME = "daemon.starting"
DAEMON_LOG = "daemon.log"  # in the state directory, for daemons that clients start


def db_path(paths: Paths) -> Path:
    return paths.state_dir / DB_NAME


def socket_path(paths: Paths) -> Path:
    """The daemon's socket, in the runtime directory, named after the state directory it serves:
    two queues of one user (another GPUBOX_STATE_DIR, an XDG_STATE_HOME that cron lacks) never
    answer for each other."""
    # crc32, not a cryptographic hash: a name, not a secret, and hashlib costs `queue add` 2 ms.
    digest = zlib.crc32(os.fsencode(os.path.realpath(paths.state_dir)))
    return paths.runtime_dir / f"queue-{digest:08x}.sock"


SOCKET_PATH_MAX = 107  # bytes in a Unix socket's path (sun_path holds 108, with its NUL)


def socket_problem(paths: Paths) -> str | None:
    """Why no daemon could listen on its socket, or None: said by the client that would start
    one (the daemon itself could only say it in its log)."""
    path = socket_path(paths)
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        return f"the daemon's socket {path} is longer than {SOCKET_PATH_MAX} bytes: set a shorter GPUBOX_RUNTIME_DIR"
    if path.is_dir() and not path.is_symlink():
        return f"a folder is in the way of the daemon's socket {path}: remove it"
    return None


def logs_dir(paths: Paths) -> Path:
    return paths.state_dir / "logs"


def attempt_prefix(logs: Path, job_id: int, attempt: int) -> Path:
    """Where an attempt's files live: `<prefix>.out`, `<prefix>.err` and `<prefix>.exit`.

    One folder for all jobs (`logs/12.1.out`): no folder to create for each attempt."""
    return logs / f"{job_id}.{attempt}"


def log_paths(prefix: Path) -> tuple[Path, Path, Path]:
    """The attempt's stdout log, stderr log and exit record."""
    return Path(f"{prefix}.out"), Path(f"{prefix}.err"), Path(f"{prefix}.exit")


def lock_holder(paths: Paths) -> int | None:
    """The pid of the daemon holding this state directory, or None when none does."""
    return lock_holder_at(paths.state_dir / LOCK_NAME)


def lock_holder_at(path: Path) -> int | None:
    """The pid written in a daemon lock file that is held, or None when it is not held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
