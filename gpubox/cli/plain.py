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


def output_failed(exc: OSError) -> int:
    """Output that could not be written (a full disk, say): one line, and nothing more tried on
    stdout, which Python would otherwise flush again on the way out."""
    import os
    from contextlib import suppress

    sys.stderr.write(f"gpubox: cannot write the output: {exc.strerror or exc}\n")
    with suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return int(ExitCode.FAILED)


def written(command: Callable[[], int | None]) -> int | None:
    """`command`, its output flushed: a failed write is one line and exit 1 (a closed pipe, as
    `| head` closes it, is no error)."""
    try:
        code = command()
        sys.stdout.flush()
    except BrokenPipeError:
        return int(ExitCode.OK)
    except OSError as exc:
        return output_failed(exc)
    return code
