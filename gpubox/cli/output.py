"""Where results go: one JSON envelope on stdout, or a human rendering; diagnostics on stderr."""

from __future__ import annotations

import sys
from typing import Any

from gpubox.cli.plain import ReaderLeft
from gpubox.envelope import dumps, envelope
from gpubox.exit_codes import ExitCode


def print_json(command: str, data: Any, code: int = ExitCode.OK, errors: list[str] | None = None) -> None:
    sys.stdout.write(dumps(envelope(command, data, code=code, errors=errors)) + "\n")


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
