"""The daemon's end of the supervisor spawner (zygote.py): it starts the spawner and asks it for
spare supervisors.

This module imports little (no dataclasses, no supervise.py): a daemon starts its spawner with
it before its own imports (`EarlyStart`), so that the spawner's Python starts while the daemon's
does. A cold queue's first job waits for both; one after the other, that was half its wait.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import suppress

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    import subprocess

    from gpubox.queue.supervise import Spare

# The spawner needs only the standard library and gpubox: a Python without `site` (-S) starts in
# a third of the time, and the first job of a cold queue waits for it. Otherwise it starts as the
# daemon did (the same environment, so the same UTF-8 mode for paths and commands). gpubox's
# folder goes last on its path (a site-packages folder must not shadow the standard library),
# and the working directory ("" for -c) not at all.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
_PYTHON = (
    sys.executable,
    "-S",
    "-c",
    "import sys; sys.path[:] = [p for p in sys.path if p] + [sys.argv[1]]; "
    "from gpubox.queue.zygote import main; sys.exit(main(sys.argv[2:]))",
)
# What this daemon reads besides what every daemon does, passed to the spawner and by it to the
# supervisors: SHORT_SUCCESS, a success said in a short line (supervise.done_message). A spawner
# started by an older daemon (after an upgrade in place, when its spawner died) is not given it,
# and its supervisors say every end in JSON, which that daemon reads.
SHORT_SUCCESS = "ok"
_READS = (SHORT_SUCCESS,)


class Spawner:
    """The daemon's end: starts the spawner and asks it for spares. `done_w`: the pipe on which
    the supervisors it forks report their jobs' ends."""

    def __init__(self, done_w: int) -> None:
        self.done_w = done_w
        self.control: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.asked = 0  # spares asked for and not received yet

    def start(self) -> None:
        # Imported here, in the daemon: subprocess brings threading, whose fork handlers every
        # supervisor forked by the spawner would run (about 0.6 ms of CPU a job).
        import subprocess

        # SEQPACKET: each reply (and the descriptor it carries) arrives as one message.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*_PYTHON, _ROOT, str(theirs.fileno()), str(self.done_w), *_READS],
                pass_fds=(theirs.fileno(), self.done_w),
                stdin=subprocess.DEVNULL,
                cwd="/",
                # A process group of its own: Ctrl-C (or a hang-up) in the terminal of a daemon
                # run in the foreground is the daemon's, which then closes this socket. Sent to
                # the spawner too, it killed it with a traceback while it was still importing.
                process_group=0,
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

    def receive(self, timeout: float = 10.0) -> Spare:
        """The next spare asked for (blocks up to `timeout`; 0: only when one is there already)."""
        from gpubox.queue.supervise import Spare

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
        return Spare(pid, ticks or None, fds[0])

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


class EarlyStart:
    """The pipe on which supervisors report their jobs' ends, and a spawner started on it, made by
    `gpubox daemon` before it imports the daemon. The daemon takes them over (`hand_over`); what
    it did not take, `close` closes (a daemon that stopped before it ran: its spawner reads EOF
    and exits). A spawner that could not start (a process limit) is left for the daemon to start
    again, with the error it met (`failure`)."""

    def __init__(self) -> None:
        self.done_r, self.done_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.spawner: Spawner | None = Spawner(self.done_w)
        self.failure: OSError | None = None
        try:
            self.spawner.start()
        except OSError as exc:
            self.failure = exc

    def hand_over(self) -> tuple[int, int, Spawner]:
        """The pipe's ends and the spawner, now the caller's to close."""
        assert self.spawner is not None, "handed over already"
        taken = (self.done_r, self.done_w, self.spawner)
        self.done_r = self.done_w = -1
        self.spawner = None
        return taken

    def close(self) -> None:
        if self.spawner is not None:
            self.spawner.close()
            self.spawner = None
        for fd in (self.done_r, self.done_w):
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)
        self.done_r = self.done_w = -1
