"""The `gpubox` entry point.

`gpubox --version` answers before Typer is imported: scripts call it to probe for gpubox, and
it should cost little more than starting Python.
"""

from __future__ import annotations

import sys

from gpubox import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--version"], ["-V"]):
        sys.stdout.write(f"gpubox {__version__}\n")
        return 0
    from gpubox.cli.app import run

    return run(args)
