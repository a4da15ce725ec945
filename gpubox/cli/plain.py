"""Commands run without Typer (a plain `queue add`, a plain `daemon`): their errors said as the
full command line says them (gpubox/cli/app.py), in one line with the exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable

from gpubox.exit_codes import ExitCode, GpuboxError


def run_plain(command: Callable[[], int]) -> int:
    try:
        return command()
    except GpuboxError as exc:
        from gpubox.format import one_line

        sys.stderr.write(f"gpubox: {one_line(exc.message)}\n")
        return int(exc.code)
    except KeyboardInterrupt:
        sys.stderr.write("gpubox: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitCode.OK)  # output piped into `head`, say: not an error
