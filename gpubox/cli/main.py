"""The `gpubox` entry point.

`gpubox --version` answers before Typer is imported: scripts call it to probe for gpubox, and
it should cost little more than starting Python. So does a plain `gpubox queue add`, which
scripts and cron call in loops (gpubox/cli/queue_add_fast.py), a plain `gpubox queue wait`
(gpubox/cli/queue_wait_fast.py), and a plain `gpubox daemon`,
which the first client starts when none runs (gpubox/cli/daemon_run.py).

Ctrl-C ends every command with nothing said (the terminal shows ^C), whenever it comes: also
while Typer and the command's modules are imported, which is most of a short command's time. So
this module imports nothing of its own before main() runs. It ends by SIGINT, as a program that
does not catch it: a shell reports 130, and a script that runs gpubox in a loop stops too (bash
goes on after a child that exits 130, taking the Ctrl-C as handled by it).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import NoReturn

INTERRUPTED = 130  # ExitCode.INTERRUPTED, known before anything is imported


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: this program's). Given `argv`, gpubox runs inside
    another program (a test), whose signal handling it leaves as it found it."""
    try:
        if argv is None:
            from gpubox.cli.plain import fill_closed_streams

            fill_closed_streams()  # before any file is opened, which would take a closed stream's fd
            from gpubox.cli.user_env import drop_odd_sizes

            drop_odd_sizes()  # before Rich reads them
        args = sys.argv[1:] if argv is None else list(argv)
        if args == ["daemon"]:
            from gpubox.cli.daemon_run import run_daemon_plain

            return run_daemon_plain()  # its signals are its own (gpubox/queue/daemon.py)
        return _with_signals(args, the_program=argv is None)
    except KeyboardInterrupt:
        if argv is None:
            die_by_sigint()
        return INTERRUPTED


def die_by_sigint() -> NoReturn:
    """End this process by SIGINT, its default action (no cleanup: that was done, or a second
    Ctrl-C asked not to wait for it)."""
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(INTERRUPTED)  # SIGINT blocked in another way: the code a shell would show


def _with_signals(args: list[str], the_program: bool) -> int:
    import signal

    from gpubox.cli import plain

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGPIPE), sys.unraisablehook
    # Started with Ctrl-C ignored (`cmd &` in a script): it stays ignored, for gpubox and what it runs.
    ignored = before[0] == signal.SIG_IGN
    if not ignored:
        plain.catch_interrupts()
    signal.signal(signal.SIGPIPE, plain.on_sigpipe)  # Python ignores it, and so misses a write cut short
    try:
        code = _command(args)
    except KeyboardInterrupt:
        code = INTERRUPTED
        plain.note_interrupted()  # raised before the handler above was set, say
    except (BrokenPipeError, plain.ReaderLeft):  # stderr's reader, say, gone while an error was said
        return plain.reader_left()
    finally:
        if the_program and not ignored:
            # The command is over: a Ctrl-C while Python exits (and waits for threads) ends it at once.
            signal.signal(signal.SIGINT, plain.exit_interrupted)
        else:
            for signum, handler in ((signal.SIGINT, before[0]), (signal.SIGPIPE, before[1])):
                if handler is not None:  # None: not set from Python, and not to be set from it
                    signal.signal(signum, handler)
            sys.unraisablehook = before[2]
    if the_program and plain.interrupted():
        die_by_sigint()
    return code


def _command(args: list[str]) -> int:
    from gpubox.cli.plain import written

    if args in (["--version"], ["-V"]):
        return written(_print_version) or 0
    if args[:2] == ["queue", "add"]:
        from gpubox.cli.queue_add_fast import run_fast

        code = written(lambda: run_fast(args[2:]))  # ids that cannot be written: the jobs are stored
        if code is not None:
            return code
    if args[:2] == ["queue", "wait"]:
        from gpubox.cli import queue_wait_fast

        code = written(lambda: queue_wait_fast.run_fast(args[2:]))
        if code is not None:
            return code
    from gpubox.cli.app import run

    return run(args)


def _print_version() -> int:
    from gpubox import __version__

    sys.stdout.write(f"gpubox {__version__}\n")
    return 0
