"""Where results go: one JSON envelope on stdout, or a human rendering; diagnostics on stderr."""

from __future__ import annotations

import sys
from typing import Any

from gpubox.cli.plain import ReaderLeft
from gpubox.envelope import dumps, envelope
from gpubox.exit_codes import ExitCode


def print_json(command: str, data: Any, code: int = ExitCode.OK, errors: list[str] | None = None) -> None:
    sys.stdout.write(dumps(envelope(command, data, code=code, errors=errors)) + "\n")


def print_json_failure(command: str, code: int, errors: list[str], data: Any = None) -> None:
    """The envelope of a command that fails. One that cannot be written (a full disk, a closed
    stdout) is dropped: the failure's own line and exit code must end the command, not an error
    about the output that hides them."""
    from gpubox.cli.plain import flush_before_failure

    try:
        print_json(command, data, code, errors)
    except BrokenPipeError:
        raise  # the reader left: exit 141, as for any output
    except OSError:
        pass  # written at once, and failed (a character device such as /dev/full)
    flush_before_failure()


def console(color: bool) -> Any:
    """A rich Console for stdout: colour only on a terminal, and never when turned off."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # Rich would exit 1 here: the reader leaving ends every command alike (plain.reader_left).
            self.quiet = True
            raise ReaderLeft

    # Piped output is read by scripts and people with wide pagers: do not squeeze it to 80.
    width = None if sys.stdout.isatty() else 240
    return _Console(no_color=not color, highlight=False, soft_wrap=False, width=width)


def fail(message: str) -> None:
    from gpubox.format import one_line

    sys.stderr.write(f"gpubox: {one_line(message)}\n")
