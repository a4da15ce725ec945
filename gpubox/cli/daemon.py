"""`gpubox daemon`: run the queue daemon in the foreground; `status` and `stop` talk to it."""

from __future__ import annotations

import math
import sys
import time
from typing import Annotated, Any

import typer

from gpubox.exit_codes import ExitCode, GpuboxError

app = typer.Typer(
    help="The queue daemon: starts jobs as GPUs free up (clients start it when it is not running).\n\n"
    "`gpubox daemon` alone runs it in the foreground, as systemd does; `gpubox daemon start`, or the first queue "
    "command that needs it, starts it in the background.",
    invoke_without_command=True,
    rich_markup_mode=None,
)

JSON = Annotated[bool, typer.Option("--json", help="Print one JSON document (schema 1) instead of text.")]


@app.callback()
def daemon(ctx: typer.Context) -> None:
    """Run the queue daemon in the foreground (for systemd); stop it with SIGTERM or `daemon stop`.

    Running jobs do not depend on the daemon: stop, kill or restart it and they go on, and their
    exit codes are recorded when it is back.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpubox.cli.daemon_run import serve

    raise typer.Exit(serve())


STARTING_S = 5.0  # how long `status` waits for a daemon that holds its lock but does not listen yet


def _ask_status(paths: Any) -> dict[str, Any]:
    """The daemon's status; Unreachable when none answers. One that a client just started (it
    holds daemon.starting, then its lock, before it listens) is worth a moment's wait."""
    from gpubox.queue.client import daemon_starting
    from gpubox.queue.layout import lock_holder, socket_path
    from gpubox.queue.wire import Unreachable, ask

    deadline = time.monotonic() + STARTING_S
    while True:
        try:
            return ask(socket_path(paths), "status", timeout=3.0)
        except Unreachable:
            on_its_way = lock_holder(paths) is not None or daemon_starting(paths)  # launched, no lock yet
            if not on_its_way or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@app.command("status")
def status(as_json: JSON = False) -> None:
    """Say whether the daemon runs, with its pid and queue counts; exit 4 when it does not."""
    from gpubox.cli.settings import settings_paths
    from gpubox.queue.layout import lock_holder, socket_path
    from gpubox.queue.wire import Unreachable

    paths = settings_paths()
    try:
        info = _ask_status(paths)
    except Unreachable as exc:
        holder = lock_holder(paths)
        if holder is None:
            why = str(exc)
            message = f"the daemon is not running (gpubox daemon start starts it): {exc}"
        else:  # it runs, but not where this client looks for its socket
            why = message = (
                f"a daemon (pid {holder}) holds {paths.state_dir} but does not answer on {socket_path(paths)}:"
                " is GPUBOX_RUNTIME_DIR the one it was started with?"
            )
        if as_json:
            from gpubox.cli.output import print_json_failure

            print_json_failure("daemon status", ExitCode.DAEMON_UNREACHABLE, [why], data={"running": False})
        raise GpuboxError(message, ExitCode.DAEMON_UNREACHABLE) from None
    if as_json:
        from gpubox.cli.output import print_json

        print_json("daemon status", {**info, "running": True})
        return
    up = time.time() - float(info.get("started_at", time.time()))
    paused = ", ".join(info.get("paused_labels") or info.get("paused") or []) or "nothing"
    sys.stdout.write(
        f"running: pid {info.get('pid')}, up {int(up)}s, {info.get('queued_jobs')} queued, "
        f"{info.get('running_jobs')} running, paused: {paused}\n"
        f"state {info.get('state_dir')}\nsocket {info.get('socket')}\n"
    )


@app.command("start")
def start(
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for it to answer.")] = 10.0,
) -> None:
    """Start the daemon in the background, as the first queue command that needs it does.
    Succeeds when one runs already."""
    from gpubox.cli.settings import settings_paths
    from gpubox.queue.client import start_daemon
    from gpubox.queue.layout import DAEMON_LOG, lock_holder
    from gpubox.queue.proctree import is_alive
    from gpubox.queue.wire import Unreachable

    _check_timeout(timeout)
    paths = settings_paths()
    try:
        info = _ask_status(paths)
        sys.stdout.write(f"the daemon runs already (pid {info.get('pid')})\n")
        return
    except Unreachable:
        if lock_holder(paths) is not None:
            raise GpuboxError("the daemon holds its lock but does not answer", ExitCode.DAEMON_UNREACHABLE) from None
    try:
        pid = start_daemon(paths)  # None: another command is starting one right now
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise GpuboxError(f"could not start the daemon: {why}", ExitCode.FAILED) from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = _ask_status(paths)
            break
        except Unreachable:
            gone = pid is not None and not is_alive(pid, None) and lock_holder(paths) is None
            if gone or time.monotonic() > deadline:
                said = _last_line(paths.state_dir / DAEMON_LOG)
                what = "stopped at once" if gone else f"did not answer within {timeout:g}s"
                raise GpuboxError(
                    f"the daemon {what}" + (f": {said}" if said else f" (see {paths.state_dir / DAEMON_LOG})"),
                    ExitCode.FAILED,
                ) from None
            time.sleep(0.05)
    sys.stdout.write(f"started the daemon (pid {info.get('pid')})\n")


def _last_line(path: Any) -> str:
    """The last line a daemon wrote to its log, without its prefix; empty when there is none."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].removeprefix("gpubox daemon: ").removeprefix("gpubox: ") if lines else ""


def _check_timeout(timeout: float) -> None:
    if not (timeout > 0 and math.isfinite(timeout)):
        raise GpuboxError(f"invalid --timeout {timeout:g}: expected a number of seconds above 0", ExitCode.USAGE)


@app.command("stop")
def stop(
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for it to exit.")] = 10.0,
) -> None:
    """Stop the daemon; running jobs keep running. Succeeds when none was running."""
    from gpubox.cli.settings import settings_paths
    from gpubox.queue.client import daemon_starting
    from gpubox.queue.layout import lock_holder, socket_path
    from gpubox.queue.wire import Unreachable, ask

    _check_timeout(timeout)
    paths = settings_paths()
    # A daemon a client has just started (`queue add; daemon stop`) may not hold its lock or
    # listen yet: it is worth a moment's wait, or it would run on after this said it was stopped.
    deadline = time.monotonic() + STARTING_S
    while True:
        try:
            answer = ask(socket_path(paths), "stop", timeout=3.0)
            break
        except Unreachable:
            holder = lock_holder(paths)
            if holder is None and not daemon_starting(paths):
                sys.stdout.write("the daemon was not running\n")
                return
            if time.monotonic() >= deadline:
                what = "a daemon is starting" if holder is None else "the daemon holds its lock"
                raise GpuboxError(f"{what} but does not answer", ExitCode.DAEMON_UNREACHABLE) from None
            time.sleep(0.05)
    from gpubox.queue.proctree import is_alive

    deadline = time.monotonic() + timeout
    pid = answer.get("pid")
    # Stopped means gone: the lock released and the process ended (as systemd's ExecStop expects).
    while lock_holder(paths) is not None or (isinstance(pid, int) and is_alive(pid, None)):
        if time.monotonic() > deadline:
            raise GpuboxError(f"the daemon (pid {answer.get('pid')}) did not stop within {timeout:g}s", ExitCode.FAILED)
        time.sleep(0.05)
    sys.stdout.write(f"stopped the daemon (pid {answer.get('pid')}); running jobs go on\n")
