"""`gpubox daemon` itself: the daemon in the foreground.

A plain `gpubox daemon` (what clients start when no daemon runs, and what the systemd units
run) comes here before Typer is imported (gpubox/cli/main.py): the first job of a cold queue
waits for the daemon to start, and Typer's import was a fifth of that.
"""

from __future__ import annotations

from gpubox.cli.plain import run_plain
from gpubox.exit_codes import ExitCode, GpuboxError

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

    from gpubox.queue.spawner import EarlyStart


def serve() -> int:
    """Run the queue daemon until it is stopped; its exit code. GpuboxError when it cannot."""
    from gpubox.queue.spawner import EarlyStart

    # The supervisor spawner first, a Python of its own that starts while this one imports the
    # daemon: a cold queue's first job waits for both (one after the other, 15 to 40 ms more here).
    try:
        early: EarlyStart | None = EarlyStart()
    except OSError:  # no descriptor left for its pipe: the daemon meets that too, and says so
        early = None
    try:
        return _serve(early)
    finally:
        if early is not None:
            early.close()  # what the daemon did not take over: a daemon that never ran


def _serve(early: EarlyStart | None) -> int:
    import os

    from gpubox.config import load_config
    from gpubox.env_vars import unknown_variables
    from gpubox.paths import absolute, resolve_paths
    from gpubox.queue.daemon import AlreadyRunning, CannotListen, Daemon
    from gpubox.queue.schedule import QueueConfig
    from gpubox.queue.store import StoreError

    paths = absolute(resolve_paths())  # its supervisors work from /
    values = load_config(paths=paths).values
    config = QueueConfig.from_values(values)
    try:
        daemon = Daemon(paths, config, recording=_recording(paths, values), early=early)
        for warning in unknown_variables(os.environ):  # in its log, once
            daemon.log(f"warning: {warning}")
        return daemon.run()
    except (AlreadyRunning, CannotListen) as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    except (StoreError, PermissionError) as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    except OSError as exc:  # a state or runtime folder that is a file, say
        where = f": {exc.filename}" if exc.filename else ""
        raise GpuboxError(f"cannot use the daemon's folders ({exc.strerror or exc}{where})", ExitCode.FAILED) from None


def run_daemon_plain() -> int:
    """`gpubox daemon` with no options, without Typer."""
    return run_plain(serve)


def _recording(paths: Any, values: Any) -> Any:
    """The ledger's sampler for this daemon: GPU use every ledger.interval seconds. Its modules
    are imported when the daemon starts it: once no job waits, or a while after it started."""

    def start(daemon: Any) -> Any:
        from gpubox.ledger.sampler import LedgerSampler
        from gpubox.ledger.store import ledger_path
        from gpubox.queue.ledger_feed import queue_user, running_allocations
        from gpubox.telemetry.sources import open_backend

        user = queue_user()
        return LedgerSampler(
            ledger_path(paths),
            interval_s=values["ledger.interval"],
            retention_days=values["ledger.retention_days"],
            minute_retention_days=values["ledger.minute_retention_days"],  # at most retention_days (config)
            # The probe gives queued jobs' loader wait; py-spy stack sampling is too dear for a daemon.
            open_backend=lambda: open_backend(False, loader_window=values["top.loader_window"], loader_sampling=False),
            allocations=lambda: running_allocations(daemon.running, user),
            waiting=lambda: daemon.waiting,
            log=daemon.log,
        )

    return start
