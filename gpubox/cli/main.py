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
    if args in (["--version"], ["-V"]):
        try:
            sys.stdout.write(f"gpubox {__version__}\n")
            sys.stdout.flush()
        except OSError as exc:  # a full disk, say (a closed pipe is no error)
            from gpubox.cli.app import output_failed

            return 0 if isinstance(exc, BrokenPipeError) else output_failed(exc)
        return 0
    if args == ["daemon"]:
        from gpubox.cli.daemon_run import run_daemon_plain

        return run_daemon_plain()
    if args[:2] == ["queue", "add"]:
        from gpubox.cli.queue_add_fast import run_fast

        try:
            code = run_fast(args[2:])
            sys.stdout.flush()
        except OSError as exc:  # the ids could not be written: the jobs are stored all the same
            from gpubox.cli.app import output_failed

            return 0 if isinstance(exc, BrokenPipeError) else output_failed(exc)
        if code is not None:
            return code
    from gpubox.cli.app import run

    return run(args)
