"""`gpubox queue`: the local GPU job queue (its commands join this Typer)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="A local queue that runs training, quantization and inference jobs on the GPUs.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
