"""How a command ends, with Typer or without (a plain `queue add`, a plain `daemon`): an error in
one line with its exit code, as the full command line says it (gpubox/cli/app.py); output that
cannot be written (also to a closed stdout); a reader that went away (exit 141); Ctrl-C (exit
130). Nothing here imports Typer."""

from __future__ import annotations

import sys
from collections.abc import Callable

from gpubox.exit_codes import ExitCode, GpuboxError


class ReaderLeft(BaseException):
    """The output's reader went away. Raised from a signal handler, which may run anywhere, so a
    BaseException, as KeyboardInterrupt is: no `except OSError` or `except Exception` (Typer's,
    which would exit 1, or a command's) takes it for a failure of its own."""


def run_plain(command: Callable[[], int]) -> int:
    try:
        return command()
    except GpuboxError as exc:
        from gpubox.format import one_line

        flush_before_failure()
        sys.stderr.write(f"gpubox: {one_line(exc.message)}\n")
        return int(exc.code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)  # nothing said: the terminal shows ^C
    except (BrokenPipeError, ReaderLeft):
        return reader_left()


def flush_before_failure() -> None:
    """Write out what a failing command printed (its --json envelope) now: left buffered, it would
    fail at exit on a closed stdout with a traceback of Python's and exit 120. Output that cannot
    be written is dropped; the failure's own line and exit code say what went wrong."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader left: exit 141, as for any output
    except (OSError, ValueError):
        _discard_output()


def _discard_output() -> None:
    """Point stdout at /dev/null: what is still buffered there would fail again when Python
    flushes it on the way out, and say so on stderr."""
    import os
    from contextlib import suppress

    with suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def reader_left() -> int:
    """The reader of the output went away (`| head` read what it wanted): nothing more is said,
    and the exit status is what a shell reports for a tool that SIGPIPE ended."""
    _discard_output()
    return int(ExitCode.READER_LEFT)


_interrupted: list[bool] = []  # a Ctrl-C came: however the command ended since, it ends by it


def catch_interrupts() -> None:
    """Ctrl-C from now on: the command unwinds (KeyboardInterrupt, so its cleanup runs) and ends
    by SIGINT (interrupted()). A second one, while it unwinds, ends it at once."""
    import signal

    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _interrupted_in_callback(sys.unraisablehook)


def _on_sigint(signum: int, frame: object) -> None:
    import signal

    note_interrupted()
    signal.signal(signal.SIGINT, exit_interrupted)
    raise KeyboardInterrupt


def note_interrupted() -> None:
    _interrupted.append(True)


def interrupted() -> bool:
    """Whether a Ctrl-C came (the command's own exit code may not say so: Typer makes it 130,
    which `queue wait` also gives for a job that exited 130)."""
    return bool(_interrupted)


def exit_interrupted(signum: int = 0, frame: object = None) -> None:
    from gpubox.cli.main import die_by_sigint

    die_by_sigint()


def _interrupted_in_callback(
    previous: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], object]:
    """A KeyboardInterrupt raised where Python cannot pass it on (a weakref callback in the
    import machinery, __del__, Python's wait for threads at exit) would be printed as "Exception
    ignored", with a traceback, and the command would go on: it ends the command instead."""

    def hook(unraisable: sys.UnraisableHookArgs) -> object:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            exit_interrupted()
        return previous(unraisable)

    return hook


def on_sigpipe(signum: int, frame: object) -> None:
    """SIGPIPE, for a write the reader's leaving cut short: the write returns part of its count,
    and Python's text layer drops the rest without a word. This signal is the only sign of it;
    one from a socket to the daemon is that code's own business (it gets EPIPE)."""
    if output_unread():
        raise ReaderLeft


def output_unread() -> bool:
    """Whether stdout is a pipe or socket that no one reads any more."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are reported unasked
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


_stdout_closed: list[bool] = []  # gpubox started with no stdout at all (`gpubox ... >&-`)
_stdin_closed: list[bool] = []  # nor stdin (`<&-`)


def stdin_closed() -> bool:
    return bool(_stdin_closed)


def fill_closed_streams() -> None:
    """Put /dev/null on each of fds 0, 1 and 2 that gpubox started without (`gpubox ls >&-`).

    Else the first file gpubox opens (its database, a log) takes that fd, and what is written to
    "stdout" or "stderr" lands in it. Stdin and stdout get /dev/null opened the other way round
    (write-only, read-only), so reading stdin or writing stdout fails as on a closed fd (EBADF)
    and a command's output fails in one line (output_failed); stderr gets it for writing, so a
    diagnostic goes nowhere and the exit code stays the command's. Close-on-exec: a command that
    gpubox runs (`gpubox run`) starts with the streams as gpubox got them, closed."""
    import os

    for fd, flags, name in ((0, os.O_WRONLY, "stdin"), (1, os.O_RDONLY, "stdout"), (2, os.O_WRONLY, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        opened = os.open(os.devnull, flags | os.O_CLOEXEC)  # the lowest free fd: this one
        if opened != fd:
            os.dup2(opened, fd, inheritable=False)
            os.close(opened)
        if fd == 1:
            _stdout_closed.append(True)
        if fd == 0:
            _stdin_closed.append(True)
        # Python left the stream None. Stderr line-buffered, as Python's own.
        mode, buffering = ("r", -1) if fd == 0 else ("w", 1 if fd == 2 else -1)
        setattr(sys, name, open(fd, mode, buffering, errors="backslashreplace", closefd=False))  # noqa: SIM115


_done: list[str] = []  # what the command changed before its output, said if the output fails


def done_before_output(what: str) -> None:
    """Note what the command has changed ("job 12 was added"): a script whose output cannot be
    written learns it, and does not do it again."""
    _done[:] = [what]


def output_failed(exc: OSError) -> int:
    """Output that could not be written (a full disk, a closed stdout): one line, and nothing
    more tried on stdout, which Python would otherwise flush again on the way out."""
    import errno

    why = "standard output is closed" if _stdout_closed and exc.errno == errno.EBADF else exc.strerror or exc
    done = f" ({_done[0]})" if _done else ""
    sys.stderr.write(f"gpubox: cannot write the output: {why}{done}\n")
    _discard_output()
    return int(ExitCode.FAILED)


def written(command: Callable[[], int | None]) -> int | None:
    """`command`, its output flushed: a failed write is one line and exit 1, a closed pipe no
    line and exit 141 (reader_left)."""
    try:
        code = command()
        sys.stdout.flush()
    except (BrokenPipeError, ReaderLeft):
        return reader_left()
    except OSError as exc:
        return output_failed(exc)
    return code
