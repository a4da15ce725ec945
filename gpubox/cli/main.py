"""The `gpubox` entry point.

`gpubox --version` answers before Typer is imported: scripts call it to probe for gpubox, and
it should cost little more than starting Python. So does a plain `gpubox queue add`, which
scripts and cron call in loops (gpubox/cli/queue_add_fast.py), and a plain `gpubox daemon`,
which the first client starts when none runs (gpubox/cli/daemon_run.py).
"""

from __future__ import annotations

import sys

from gpubox import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["daemon"]:
        from gpubox.cli.daemon_run import run_daemon_plain

        return run_daemon_plain()  # its signals are its own (gpubox/queue/daemon.py)
    import signal

    from gpubox.cli.plain import ReaderLeft, on_sigpipe, reader_left

    signal.signal(signal.SIGPIPE, on_sigpipe)  # Python ignores it, and so misses a write cut short
    try:
        return _command(args)
    except (BrokenPipeError, ReaderLeft):  # stderr's reader, say, gone while an error was said
        return reader_left()


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
    sys.stdout.write(f"gpubox {__version__}\n")
    return 0
