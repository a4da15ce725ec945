"""The spawner: a small process that forks the queue's supervisors, so the daemon never forks.

Forking the daemon itself is dear: a copy of a large process, and copy-on-write faults in the
daemon for every page it then touches. The daemon starts this module once, as a fresh Python
that imports only what a supervisor needs, and asks it over a socket pair for spare
supervisors: for each `S` it forks one and sends back "<pid> <start ticks>" with the spare's
launch pipe attached (SCM_RIGHTS), so the daemon hands the job to the spare directly. It exits
when the daemon's end of the socket closes; supervisors, in their own sessions, run on.

    python -m gpubox.queue.zygote CONTROL_FD DONE_FD  (the daemon starts it without `site`: see _PYTHON)
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from gpubox.queue import proctree, supervise

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    import subprocess


def _serve(control: socket.socket, done_w: int) -> int:
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
                    spare = supervise.fork_spare(done_w)
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
    return _serve(control, done_w)


# The spawner needs only the standard library and gpubox: a Python without `site` (-S) starts in
# a third of the time, and the first job of a cold queue waits for it. Otherwise it starts as the
# daemon did (the same environment, so the same UTF-8 mode for paths and commands). gpubox's
# folder goes last on its path (a site-packages folder must not shadow the standard library),
# and the working directory ("" for -c) not at all.
_ROOT = str(Path(__file__).resolve().parent.parent.parent)
_PYTHON = (
    sys.executable,
    "-S",
    "-c",
    "import sys; sys.path[:] = [p for p in sys.path if p] + [sys.argv[1]]; "
    "from gpubox.queue.zygote import main; sys.exit(main(sys.argv[2:]))",
)


@dataclass
class Spawner:
    """The daemon's end: starts the spawner and asks it for spares."""

    done_w: int
    control: socket.socket | None = None
    proc: subprocess.Popen[bytes] | None = None
    asked: int = 0  # spares asked for and not received yet

    def start(self) -> None:
        # Imported here, in the daemon: subprocess brings threading, whose fork handlers every
        # supervisor forked by the spawner would run (about 0.6 ms of CPU a job).
        import subprocess

        # SEQPACKET: each reply (and the descriptor it carries) arrives as one message.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*_PYTHON, _ROOT, str(theirs.fileno()), str(self.done_w)],
                pass_fds=(theirs.fileno(), self.done_w),
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours

    def ask(self) -> None:
        """Ask for one spare; `receive` collects it."""
        if self.control is None or self.proc is None or self.proc.poll() is not None:
            self.close()
            self.start()
        assert self.control is not None
        self.control.sendall(b"S")
        self.asked += 1

    def receive(self, timeout: float = 10.0) -> supervise.Spare:
        """The next spare asked for (blocks up to `timeout`; 0: only when one is there already)."""
        assert self.control is not None
        self.control.settimeout(timeout)
        try:
            data, fds, _, _ = socket.recv_fds(self.control, 64, 1)
        finally:
            if self.control is not None:
                self.control.settimeout(None)
        if data.startswith(b"E "):
            self.asked -= 1
            raise OSError(f"the supervisor spawner could not fork: {data[2:].decode(errors='replace')}")
        if not data or not fds:
            self.close()
            raise OSError("the supervisor spawner stopped")
        self.asked -= 1
        pid, ticks = (int(x) for x in data.split())
        return supervise.Spare(pid, ticks or None, fds[0])

    def close(self) -> None:
        self.asked = 0
        if self.control is not None:
            self.control.close()  # the spawner reads EOF and exits
            self.control = None
        if self.proc is not None:
            import subprocess

            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.proc = None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
