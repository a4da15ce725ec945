"""`gpubox run`: a command with the dataloader probe attached, no change to its code."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.models import TyperPath

# Options end at the command's name: `gpubox run python train.py --lr 3` needs no `--`.
COMMAND_SETTINGS: dict[str, Any] = {
    "context_settings": {"allow_interspersed_args": False},
    "options_metavar": "[OPTIONS] [--]",
}
# Path-typed, so the shell completions offer file names (train.py); the words stay as typed
# and are never checked (readable=False), since they belong to the command.
_WORD = TyperPath(readable=False)


def run(
    cmd: Annotated[str, typer.Argument(metavar="CMD", click_type=_WORD, help="The command to run.")],
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="ARGS", click_type=_WORD, help="The command's own arguments.", show_default=False),
    ] = None,
) -> int:
    """Run a command with the dataloader probe attached, so `gpubox top` shows its loader_wait.

    Every Python program the command starts times each batch its PyTorch DataLoaders deliver
    (through a sitecustomize put first on PYTHONPATH, which then runs any sitecustomize of your
    own) and publishes it for `gpubox top`. The program's code does not change, and a program
    that never uses a DataLoader runs as it would without gpubox. The same probe attaches from
    inside a script with `import gpubox.probe; gpubox.probe.install()`.

    The command replaces gpubox, so its exit code and signals are its own. Its options may
    follow its name without `--`, as in `gpubox run python train.py --lr 3`. A command that is
    not found exits 127, one that cannot be run 126, as in a shell.
    """
    from gpubox.cli.user_env import user_environment
    from gpubox.probe.launch import LaunchError, exec_with_probe

    try:
        exec_with_probe([cmd, *(args or [])], user_environment())
    except LaunchError as exc:
        from gpubox.format import one_line

        sys.stderr.write(f"gpubox: {one_line(exc.message)}\n")
        return exc.code
