"""A job's process tree, found through /proc, and how to stop all of it.

A job's supervisor is a child subreaper, so processes that its job orphans (daemonized helpers,
a shell's background children) are re-parented to the supervisor instead of init and stay in
its tree even when they leave the job's process group or session.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot; None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def job_processes(supervisor: int, job_id: int, log_prefix: str | None = None) -> set[int]:
    """What a supervisor that died left running: the processes in its session that carry the
    job's id in their environment, and, anywhere, those that carry the attempt's own mark
    (`GPUBOX_JOB_LOG`): a daemonized helper leaves the session, and its new parent is not the
    supervisor once that is gone."""
    marker = f"GPUBOX_JOB_ID={job_id}".encode()
    mark = None if log_prefix is None else os.fsencode(f"GPUBOX_JOB_LOG={log_prefix}")
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if not fields or fields[0] == b"Z":
            continue
        in_session = int(fields[3]) == supervisor  # field 6: the session
        if not in_session and mark is None:
            continue
        with suppress(OSError):
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            if (in_session and marker in env) or (mark is not None and mark in env):
                found.add(int(name))
    found.discard(os.getpid())
    return found


def is_alive(pid: int, ticks: int | None) -> bool:
    """True when `pid` runs and, when `ticks` is known, is the process that started then."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == b"Z":
        return False
    return ticks is None or int(fields[19]) == ticks


def _parents() -> dict[int, int]:
    """pid -> parent pid for every live (not zombie) process we can see."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields and fields[0] != b"Z":
            out[int(name)] = int(fields[1])
    return out


def _children() -> dict[int, list[int]]:
    """parent pid -> its live children, from one reading of /proc."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(root: int, spare: frozenset[int] = frozenset()) -> set[int]:
    """Every live process below `root`, less those in `spare` and everything below them."""
    children = _children()
    found: set[int] = set()
    pending = [p for p in children.get(root, []) if p not in spare]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(p for p in children.get(pid, []) if p not in spare)
    return found


def owners(roots: Mapping[int, int]) -> dict[int, int]:
    """pid -> owner, for each root pid (mapped to its owner) and every live process below it,
    from one reading of /proc."""
    children = _children()
    found: dict[int, int] = {}
    for root, owner in roots.items():
        pending = [root]
        while pending:
            pid = pending.pop()
            if pid not in found:
                found[pid] = owner
                pending.extend(children.get(pid, []))
    return found


def job_leader(supervisor: int) -> int | None:
    """The process a supervisor started for its job, while it runs: a child of the supervisor
    that leads its own process group in the supervisor's session (the supervisor is a session
    leader and starts each job as a new group). Orphans the job left to the supervisor can lead
    groups too: the first one started is the job's. None when it has ended or cannot be seen."""
    try:
        children = [int(p) for p in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]
    except (OSError, ValueError):  # a kernel without that file: every process's parent instead
        children = [pid for pid, ppid in _parents().items() if ppid == supervisor]
    found: tuple[int, int] | None = None  # (start ticks, pid)
    for pid in children:
        fields = _stat_fields(pid)
        if not fields or fields[0] == b"Z" or int(fields[2]) != pid or int(fields[3]) != supervisor:
            continue
        started = int(fields[19])
        if found is None or started < found[0]:
            found = (started, pid)
    return None if found is None else found[1]


_libc: Any = None


def load_libc() -> Any:
    """libc through ctypes, loaded once: the daemon loads it before forking supervisors."""
    global _libc
    if _libc is None:
        import ctypes  # here: clients that only signal a tree do not pay for it

        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    return _libc


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux); False where the kernel says no."""
    libc = load_libc()
    try:
        return bool(libc) and int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except AttributeError:
        return False


def set_name(name: str) -> None:
    """Name this process as `ps` and `top` show it (15 bytes at most)."""
    libc = load_libc()
    if libc:
        import ctypes

        with suppress(AttributeError):
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def reap_children() -> list[tuple[int, int]]:
    """Collect every child that has exited, without blocking: (pid, wait status) for each."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def has_children() -> bool:
    """True while this process has a child, exited or not (cheaper than a scan of /proc)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def signal_tree(root: int, pgid: int | None, sig: int, spare: frozenset[int] = frozenset()) -> int:
    """Send `sig` to the job's process group and to every descendant of `root` (but `spare` and
    what runs below it); how many got it."""
    sent = 0
    if pgid is not None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
            sent += 1
    for pid in descendants(root, spare):
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def stop_tree(
    root: int,
    pgid: int | None,
    grace_s: float,
    on_reaped: Callable[[int, int], None] = lambda pid, status: None,
    sleep: Callable[[float], None] = time.sleep,
    spare: frozenset[int] = frozenset(),
) -> bool:
    """SIGTERM the whole tree, wait up to `grace_s` for it to go, then SIGKILL what is left.

    `root` is this process (the subreaper); children that exit are reaped here and passed to
    `on_reaped`. Returns True when SIGKILL was needed.
    """
    signal_tree(root, pgid, signal.SIGTERM, spare)
    deadline = time.monotonic() + grace_s
    while True:
        for pid, status in reap_children():
            on_reaped(pid, status)
        if not descendants(root, spare):
            return False
        if time.monotonic() >= deadline:
            break
        sleep(0.05)
    signal_tree(root, pgid, signal.SIGKILL, spare)
    for _ in range(200):  # SIGKILL cannot be caught; the tree is gone within milliseconds
        for pid, status in reap_children():
            on_reaped(pid, status)
        if not descendants(root, spare):
            break
        sleep(0.01)
    return True


def exit_code_of(status: int) -> tuple[int, str | None]:
    """A wait status as a shell reports it (128 + N for signal N), with a note for signals."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return 128 + sig, f"killed by {name}"
    return os.waitstatus_to_exitcode(status), None
