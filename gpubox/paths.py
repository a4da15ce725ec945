"""Where gpubox keeps state, config and runtime files (XDG, with a cron-safe fallback).

Cron and systemd timers often run without XDG_RUNTIME_DIR. The runtime directory must still be
the one the daemon and `gpubox top` use, so the fallback does not depend on the environment:
it is /run/user/<uid> when that exists and belongs to us (as systemd-logind creates it), and a
private /tmp/gpubox-<uid> otherwise.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    state_dir: Path
    runtime_dir: Path
    system_config_file: Path

    @property
    def user_config_file(self) -> Path:
        return self.config_dir / "config.toml"


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _xdg(env: Mapping[str, str], name: str, default: Path) -> Path:
    value = env.get(name, "")
    # The XDG spec says relative paths are invalid and must be ignored.
    return Path(value) if value and os.path.isabs(value) else default


def runtime_base(env: Mapping[str, str], uid: int) -> Path:
    explicit = env.get("XDG_RUNTIME_DIR", "")
    if explicit and os.path.isabs(explicit):
        return Path(explicit)
    run_user = Path(f"/run/user/{uid}")
    try:
        if run_user.is_dir() and run_user.stat().st_uid == uid:
            return run_user
    except OSError:
        pass
    return Path(f"/tmp/gpubox-{uid}")


def resolve_paths(env: Mapping[str, str] | None = None, uid: int | None = None) -> Paths:
    env = os.environ if env is None else env
    uid = os.getuid() if uid is None else uid
    home = _home(env)
    config_dir = _xdg(env, "XDG_CONFIG_HOME", home / ".config") / "gpubox"
    state_dir = _xdg(env, "XDG_STATE_HOME", home / ".local" / "state") / "gpubox"
    base = runtime_base(env, uid)
    # /tmp/gpubox-<uid> is already ours alone; elsewhere add the gpubox folder.
    runtime_dir = base if base.name.startswith("gpubox-") else base / "gpubox"
    if env.get("GPUBOX_STATE_DIR"):
        state_dir = Path(env["GPUBOX_STATE_DIR"])
    if env.get("GPUBOX_RUNTIME_DIR"):
        runtime_dir = Path(env["GPUBOX_RUNTIME_DIR"])
    system = Path(env.get("GPUBOX_SYSTEM_CONFIG") or "/etc/gpubox/config.toml")
    return Paths(config_dir, state_dir, runtime_dir, system)


def absolute(paths: Paths) -> Paths:
    """The same folders, relative ones taken from this process's working directory: for a
    daemon, whose supervisors (and the daemon a client starts) work from /."""
    return Paths(
        paths.config_dir.absolute(),
        paths.state_dir.absolute(),
        paths.runtime_dir.absolute(),
        paths.system_config_file.absolute(),
    )


def ensure_private_dir(path: Path) -> Path:
    """Create a directory readable by its owner alone; refuse one that another user owns, or one
    that others may write to (made beforehand by hand): whoever can write there can replace the
    queue's database or socket, and so run commands as its owner (ssh's StrictModes refuses such
    a folder too). Its mode is not changed here: that folder may be someone's $HOME."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # "File exists" for /dev/null/queue.db says nothing useful: name what is in the way.
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise NotADirectoryError(errno.ENOTDIR, f"{blocker} is not a folder") from None
    problem = private_dir_problem(path)
    if problem is not None:
        raise PermissionError(problem)
    return path


def private_dir_problem(path: Path) -> str | None:
    """Why an existing folder is not fit to be gpubox's (ensure_private_dir); None when it is, or
    when nothing is there yet (it will be made private)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to us"
    if st.st_mode & 0o022:
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        return f"{path} is writable by other users (mode {mode}): make it yours alone (chmod go-w {path})"
    return None
