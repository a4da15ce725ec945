"""The spawner: a small process that forks the queue's supervisors, so the daemon never forks.

Forking the daemon itself is dear: a copy of a large process, and copy-on-write faults in the
daemon for every page it then touches. The daemon starts this module once, as a fresh Python
that imports only what a supervisor needs, and asks it over a socket pair for spare
supervisors: for each `S` it forks one and sends back "<pid> <start ticks>" with the spare's
launch pipe attached (SCM_RIGHTS), so the daemon hands the job to the spare directly. It exits
when the daemon's end of the socket closes; supervisors, in their own sessions, run on.

    python -m gpubox.queue.zygote CONTROL_FD DONE_FD [ok]  (started without `site` by spawner.py, the daemon's end)
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from contextlib import suppress

from gpubox.queue import proctree, supervise
from gpubox.queue.spawner import SHORT_SUCCESS


def _serve(control: socket.socket, done_w: int, short_success: bool) -> int:
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the daemon's terminal is the daemon's
    proctree.load_libc()  # once here, not in every supervisor
    while True:
        proctree.reap_children()  # supervisors report through the done pipe and their exit records
        with suppress(InterruptedError):
            ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            with suppress(OSError):
                os.read(wake_r, 4096)
        if control.fileno() not in ready:
            continue
        try:
            request = control.recv(64)
        except OSError:
            return 0
        if not request:
            return 0  # the daemon is gone
        for _ in request:  # one spare per byte asked for
            try:
                try:
                    spare = supervise.fork_spare(done_w, short_success)
                except OSError as exc:  # no fork (a process limit): say so; the daemon tries later
                    control.send(f"E {exc}".encode())
                    continue
                try:
                    socket.send_fds(control, [f"{spare.pid} {spare.pid_start or 0}\n".encode()], [spare.launch_w])
                finally:
                    os.close(spare.launch_w)  # the spare, never handed over, reads EOF and exits
            except (BrokenPipeError, ConnectionResetError):
                return 0  # the daemon is gone (killed, say): so is this, quietly


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[0]))
    done_w = int(argv[1])
    os.set_inheritable(done_w, False)  # passed to us inheritable; it must not reach the jobs
    return _serve(control, done_w, short_success=SHORT_SUCCESS in argv[2:])  # what the daemon reads


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
