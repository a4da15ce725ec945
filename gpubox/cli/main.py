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
        from gpubox.cli.plain import written

        return written(_print_version) or 0
    if args == ["daemon"]:
        from gpubox.cli.daemon_run import run_daemon_plain

        return run_daemon_plain()
    if args[:2] == ["queue", "add"]:
        from gpubox.cli.plain import written
        from gpubox.cli.queue_add_fast import run_fast

        code = written(lambda: run_fast(args[2:]))  # ids that cannot be written: the jobs are stored
        if code is not None:
            return code
    from gpubox.cli.app import run

    return run(args)


def _print_version() -> int:
    sys.stdout.write(f"gpubox {__version__}\n")
    return 0
