"""The `gpubox` entry point.

`gpubox --version` answers before Typer is imported: scripts call it to probe for gpubox, and
it should cost little more than starting Python. So does a plain `gpubox queue add`, which
scripts and cron call in loops (gpubox/cli/queue_add_fast.py), and a plain `gpubox daemon`,
which the first client starts when none runs (gpubox/cli/daemon_run.py).

Ctrl-C ends every command with exit 130 and nothing said (the terminal shows ^C), whenever it
comes: also while Typer and the command's modules are imported, which is most of a short
command's time. So this module imports nothing of its own before main() runs.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # ExitCode.INTERRUPTED, known before anything is imported


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: this program's). Given `argv`, gpubox runs inside
    another program (a test), whose signal handling it leaves as it found it."""
    try:
        args = sys.argv[1:] if argv is None else list(argv)
        if args == ["daemon"]:
            from gpubox.cli.daemon_run import run_daemon_plain

            return run_daemon_plain()  # its signals are its own (gpubox/queue/daemon.py)
        return _with_signals(args, the_program=argv is None)
    except KeyboardInterrupt:
        return INTERRUPTED


def _with_signals(args: list[str], the_program: bool) -> int:
    import signal

    from gpubox.cli import plain

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGPIPE), sys.unraisablehook
    plain.catch_interrupts()
    signal.signal(signal.SIGPIPE, plain.on_sigpipe)  # Python ignores it, and so misses a write cut short
    try:
        return _command(args)
    except KeyboardInterrupt:
        return INTERRUPTED
    except (BrokenPipeError, plain.ReaderLeft):  # stderr's reader, say, gone while an error was said
        return plain.reader_left()
    finally:
        if the_program:
            # The command is over: a Ctrl-C while Python exits (and waits for threads) ends it at once.
            signal.signal(signal.SIGINT, plain.exit_interrupted)
        else:
            for signum, handler in ((signal.SIGINT, before[0]), (signal.SIGPIPE, before[1])):
                if handler is not None:  # None: not set from Python, and not to be set from it
                    signal.signal(signum, handler)
            sys.unraisablehook = before[2]


def _command(args: list[str]) -> int:
    from gpubox.cli.plain import written

    if args in (["--version"], ["-V"]):
        return written(_print_version) or 0
    if args[:2] == ["queue", "add"]:
        from gpubox.cli.queue_add_fast import run_fast

        code = written(lambda: run_fast(args[2:]))  # ids that cannot be written: the jobs are stored
        if code is not None:
            return code
    from gpubox.cli.app import run

    return run(args)


def _print_version() -> int:
    from gpubox import __version__

    sys.stdout.write(f"gpubox {__version__}\n")
    return 0
