"""The Typer application: one Typer per noun, joined here; errors become one line and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer._click import exceptions as click  # typer 0.28 vendors click
from typer._click.core import Context
from typer.core import TyperGroup

from gpubox import __version__
from gpubox.cli import daemon, doctor, metrics, queue, report, top
from gpubox.cli import run as run_command
from gpubox.cli.plain import ReaderLeft, flush_before_failure, output_failed, reader_left
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.format import one_line


@contextmanager
def _reader_left() -> Iterator[None]:
    """A closed pipe carried past Typer, which would exit 1 on it."""
    try:
        yield
    except BrokenPipeError as exc:
        raise ReaderLeft from exc


class _Root(TyperGroup):
    """The `gpubox` group: everything that parses or runs a command, help included, runs in it."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        with _reader_left():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        with _reader_left():
            return super().invoke(ctx)


app = typer.Typer(
    cls=_Root,
    name="gpubox",
    help="See every GPU on this box, find the ones that starve, queue work onto them.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    # Plain help: Typer's boxed help imports rich and markdown-it and doubles `--help` time.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpubox {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """See every GPU on this box, find the ones that starve, queue work onto them."""


app.command("top")(top.top)
app.add_typer(queue.app, name="queue")
app.add_typer(daemon.app, name="daemon")
app.add_typer(doctor.app, name="doctor")
app.add_typer(metrics.app, name="metrics")
app.command("report")(report.report)
app.command("run", **run_command.COMMAND_SETTINGS)(run_command.run)


def _visible_message(exc: click.UsageError) -> str:
    """The error text, without suggesting options that --help does not show."""
    if isinstance(exc, click.NoSuchOption) and exc.ctx is not None:
        hidden = {name for p in exc.ctx.command.params if getattr(p, "hidden", False) for name in p.opts}
        if exc.possibilities and hidden:
            exc.possibilities = [p for p in exc.possibilities if p not in hidden]
    return exc.format_message()


def _command_path(command: Any, argv: list[str]) -> str:
    """The command that argv names (`gpubox queue ls`), for an error Click raised without saying
    where (an option without its value)."""
    words = ["gpubox"]
    for arg in argv:
        commands = getattr(command, "commands", None)  # a group's, by name
        sub = commands.get(arg) if isinstance(commands, dict) else None
        if sub is None:
            break
        words.append(arg)
        command = sub
    return " ".join(words)


def run(argv: list[str]) -> int:
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="gpubox", standalone_mode=False)
        sys.stdout.flush()  # a write that fails (a full disk) fails here, where it is said in one line
    except click.NoArgsIsHelpError as exc:
        sys.stderr.write(exc.format_message().rstrip("\n") + "\n")  # `gpubox queue`: its help, as is
        return int(ExitCode.USAGE)
    except click.UsageError as exc:
        if not exc.format_message():
            return int(ExitCode.USAGE)  # no arguments: the help was printed
        where = exc.ctx.command_path if exc.ctx else _command_path(command, argv)
        sys.stderr.write(f"gpubox: {one_line(_visible_message(exc))} (see '{where} --help')\n")
        return int(ExitCode.USAGE)
    except GpuboxError as exc:
        flush_before_failure()
        sys.stderr.write(f"gpubox: {one_line(exc.message)}\n")
        return int(exc.code)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)  # nothing said: the terminal shows ^C
    except typer.Abort:
        sys.stderr.write("gpubox: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    except click.ClickException as exc:
        sys.stderr.write(f"gpubox: {one_line(exc.format_message())}\n")
        return exc.exit_code
    except (ReaderLeft, BrokenPipeError):
        return reader_left()
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise  # not the output's: said where it happens, or a defect to see whole
        return output_failed(exc)
    return int(result) if isinstance(result, int) else int(ExitCode.OK)
