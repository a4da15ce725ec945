"""What the `gpubox queue` commands share, without Typer: `queue add` also runs from a fast path
in gpubox/cli/main.py that does not import Typer at all (it would double the command's time)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpubox.cli.plain import done_before_output, stdin_closed
from gpubox.exit_codes import ExitCode, GpuboxError

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from gpubox.paths import Paths
    from gpubox.queue.gpus import GpuInfo
    from gpubox.queue.jobs import Job
    from gpubox.queue.store import JobStore
    from gpubox.queue.submit import AddOptions

    F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def errors() -> Iterator[None]:
    """Bad input is one line and exit 2; a database that cannot be used is one line and exit 1."""
    from gpubox.queue.store import StoreError

    try:
        yield
    except ValueError as exc:
        raise GpuboxError(str(exc), ExitCode.USAGE) from None
    except OverflowError:
        raise GpuboxError("a job id is too large (no such job)", ExitCode.USAGE) from None
    except StoreError as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None


def queue_paths() -> Paths:
    from gpubox.cli.settings import settings_paths

    return settings_paths()


def open_queue_store(paths: Paths) -> JobStore:
    from gpubox.queue.client import open_store

    return open_store(paths)


def box_gpus(why: str = "this job asks for GPUs") -> list[GpuInfo]:
    from gpubox.queue.gpus import NoNvml, NvmlGpus

    source = NvmlGpus()
    try:
        return source.read()
    except NoNvml as exc:
        raise GpuboxError(f"{why}, but {exc}", ExitCode.NO_GPU) from None
    finally:
        source.close()


def gpu_index(view: dict[str, Any] | None, jobs: Sequence[Any] = ()) -> dict[str, int]:
    """GPU indexes by UUID (a UUID is no name for a person to read): the daemon's, and NVML's for
    GPUs that `jobs` hold, held or name and the daemon has not read (none answered, or it has run
    only CPU-only jobs since it started); a UUID that neither knows stays out."""
    index = {g["uuid"]: g["index"] for g in (view or {}).get("gpus", []) if isinstance(g, dict)}
    named = {u for j in jobs for u in (*j.gpu_uuids, *(getattr(getattr(j, "spec", None), "gpu_ids", None) or ()))}
    if named - index.keys():
        try:
            return {**{g.uuid: g.index for g in box_gpus()}, **index}
        except GpuboxError:  # no NVML: the UUIDs it is
            pass
    return index


def live_reasons(view: dict[str, Any] | None) -> dict[int, str] | None:
    if view is None:
        return None
    return {int(k): v for k, v in (view.get("reasons") or {}).items()}


def keep_daemon(paths: Paths, every_s: float = 5.0) -> Any:
    """A callback for long waits: every few seconds, make sure a daemon runs (one that was
    stopped or killed meanwhile would leave the job recorded as running)."""
    import time

    from gpubox.queue.client import wake_daemon

    last = [time.monotonic()]

    def keep() -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            wake_daemon(paths)

    return keep


def emit(
    command: str, data: Any, as_json: bool, text: str, errors: list[str] | None = None, code: int = ExitCode.OK
) -> None:
    """`errors`: what could not be read or done beside the data (the JSON's errors; in text, said
    on stderr by the caller). `code`: the exit code the command ends with, which the JSON says."""
    if as_json:
        from gpubox.cli.output import print_json

        print_json(command, data, code, errors=errors)
    elif text:
        sys.stdout.write(text + "\n")


def json_command(command: str) -> Callable[[F], F]:
    """For a Typer command with an `as_json` parameter: the envelope of json_failure on failure."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with json_failure(command, bool(kwargs.get("as_json"))):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


class SaidAlready(GpuboxError):
    """A failure the command's output carries already (in its JSON envelope's errors)."""


def check_daemon_could_start(paths: Paths) -> None:
    """Before a change that only a daemon acts on (a job stored, queued again, edited, a queue
    resumed): when none runs, one that would stop at once on its settings or folders refuses
    the change, as GpuboxError, before it is made."""
    from gpubox.queue.client import check_daemon_start
    from gpubox.queue.layout import lock_holder

    if lock_holder(paths) is None:
        check_daemon_start(paths)


def wake(paths: Paths, started: bool = False, waits: str | None = None) -> GpuboxError | None:
    """Wake the daemon (start it when none runs) after a change that is committed: its failure,
    to be said after the change's own output, which must not be lost; None when it is up.
    `waits`: what waits for a daemon, said when none can start (queued jobs, by default)."""
    from gpubox.queue.client import WAITS_FOR_DAEMON, wake_daemon

    try:
        wake_daemon(paths, started, waits or WAITS_FOR_DAEMON)
    except GpuboxError as exc:
        return exc
    return None


def emit_then_fail(
    command: str,
    data: Any,
    as_json: bool,
    text: str,
    failure: GpuboxError | None,
    errors: Sequence[str] = (),
    code: int = ExitCode.OK,
) -> None:
    """emit, then end with `failure` (a daemon that could not be started), whose message the JSON
    carries too; `errors` and `code`: the command's own, when it has no failure."""
    said = [*errors, *([failure.message] if failure else [])]
    emit(command, data, as_json, text, said, failure.code if failure else code)
    if failure is not None:
        raise SaidAlready(failure.message, failure.code)


@contextmanager
def json_failure(command: str, as_json: bool) -> Iterator[None]:
    """A command asked for --json that fails still prints an envelope: `data` null, the message in
    `errors`, its exit code; the one line on stderr comes as for any failure."""
    try:
        yield
    except GpuboxError as exc:
        if as_json and not isinstance(exc, SaidAlready):
            from gpubox.cli.output import print_json_failure

            print_json_failure(command, exc.code, [exc.message])
        raise


def add_jobs(
    command: Sequence[str] | None, opts: AddOptions, file: Path | None, as_json: bool, wait: bool = False
) -> int:
    """`gpubox queue add`: build the specs, add them all or none, wake the daemon, print the ids;
    the exit code. `wait`: then wait for the jobs to end, as `queue wait` does, in this process."""
    with json_failure("queue add", as_json):
        jobs, paths, started = _store_jobs(command, opts, file)
    ids = [j.id for j in jobs]
    joint = " and " if len(ids) == 2 else " to "
    added = f"job {ids[0]} was added" if len(ids) == 1 else f"jobs {ids[0]}{joint}{ids[-1]} were added"
    done_before_output(added)
    failure = wake(paths, started)
    text = "\n".join(str(j.id) for j in jobs)
    if wait and failure is None:
        if not as_json:  # the ids as without --wait, before the jobs run: `id=$(gpubox queue add ...)`
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        with json_failure("queue add", as_json):
            ended, code = _wait_for("queue add", paths, ids, None, None, as_json)
        if not as_json:  # stdout holds the ids alone; how a job ended other than well, on stderr
            for job_id, (state, exit_code) in ended.items():
                if state != "succeeded":
                    sys.stderr.write(f"gpubox: {ended_line(job_id, state, exit_code)}\n")
        return code
    data = None
    if as_json:  # only then: a thousand records took 8 ms, while a cold queue's daemon starts
        from gpubox.queue.records import job_record

        # The daemon was woken: its next pass says why each job waits (or it could not be started).
        data = {"jobs": [job_record(j, None if failure else {}) for j in jobs]}
    emit_then_fail("queue add", data, as_json, text, failure)
    return int(ExitCode.OK)


def _store_jobs(command: Sequence[str] | None, opts: AddOptions, file: Path | None) -> tuple[list[Job], Paths, bool]:
    """The jobs of `queue add`, stored; the paths; whether a daemon was started for them."""
    from gpubox.cli.user_env import user_environment
    from gpubox.queue.client import start_daemon_early
    from gpubox.queue.jobs import KINDS, check_spec
    from gpubox.queue.submit import GpuLookup, SpecBuilder, build_spec, check_options, job_file_text, parse_job_file

    try:
        base_cwd = os.getcwd()
    except OSError:
        if opts.cwd is None or not os.path.isabs(opts.cwd):
            raise GpuboxError("the current directory no longer exists; give --cwd", ExitCode.USAGE) from None
        base_cwd = "/"
    lookup = GpuLookup(box_gpus)
    base_env = user_environment()
    paths = queue_paths()
    with errors():
        check_options(opts)
        entries: list[tuple[int, list[str], AddOptions]] | None = None
        if file is not None:
            if command:
                raise ValueError("give either --file or a command, not both")
            try:
                data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
            except OSError as exc:
                why = exc.strerror or exc
                if str(file) == "-" and stdin_closed():
                    why = "standard input is closed"
                raise ValueError(f"cannot read {file}: {why}") from None
            entries = parse_job_file(job_file_text(data, str(file)), str(file), opts)
        else:
            specs = [build_spec(list(command or []), opts, base_env, base_cwd, lookup)]
            check_spec(specs[0], KINDS)
        with open_queue_store(paths) as store:
            # A usable database and jobs that parse: a daemon that starts now gets ready while
            # they are built and written (a cold queue's first job waits for it, and building a
            # thousand lines of a job file took 30 ms). Not for jobs with dependencies, which
            # the check below (a read of the database) may still refuse. A line refused while
            # the jobs are built leaves the daemon running, idle, as a later add would start it.
            after = any(s.after for s in specs) if entries is None else any(o.after for _, _, o in entries)
            started = not after and start_daemon_early(paths)
            if not started:
                check_daemon_could_start(paths)
            if entries is not None:
                build = SpecBuilder(base_env, base_cwd, lookup)
                specs = []
                for number, argv, line_opts in entries:
                    try:
                        spec = build(argv, line_opts)
                        check_spec(spec, KINDS)  # (add_many checks again) named by its line
                    except ValueError as exc:
                        raise ValueError(f"{file}:{number}: {exc}") from None
                    except GpuboxError as exc:  # no NVML for this line's GPUs: name the line, keep the code
                        raise GpuboxError(f"{file}:{number}: {exc.message}", exc.code) from None
                    specs.append(spec)
                # name the line of a dependency that does not exist
                for (number, _, _), spec in zip(entries, specs, strict=True):
                    for dep in spec.after:
                        if store.get(dep) is None:
                            raise ValueError(f"{file}:{number}: job {dep} (named in after) does not exist")
            jobs = store.add_many(specs)
    return jobs, paths, started


def joined(values: list[str] | None) -> str | None:
    """A list option given several times (--gpu 0 --gpu 1): one list, as --gpu 0,1. An empty one
    among them is passed alone, so the message says that option is empty rather than naming a
    list the user never typed ('0,')."""
    if not values:
        return None
    blank = [v for v in values if not v.strip()]
    return blank[0] if blank else ",".join(values)


def wait_jobs_command(ids: Sequence[int], timeout: str | None, as_json: bool) -> int:
    """`gpubox queue wait`: block until the jobs end; the exit code (the first failed job's own).
    Typer's command and the fast path (gpubox/cli/queue_wait_fast.py) both run this."""
    from gpubox.queue.parse import parse_duration

    paths = queue_paths()
    with errors():
        limit = parse_duration(timeout, zero=True) if timeout is not None else None
    ended, code = _wait_for("queue wait", paths, ids, limit, timeout, as_json)
    if not as_json:
        sys.stdout.write("".join(ended_line(i, *end) + "\n" for i, end in ended.items()))
    return code


def ended_line(job_id: int, state: str, exit_code: int | None) -> str:
    return f"job {job_id}: {state}" + ("" if exit_code is None else f" (exit {exit_code})")


def _wait_for(
    command: str, paths: Paths, ids: Sequence[int], limit: float | None, timeout: str | None, as_json: bool
) -> tuple[dict[int, tuple[str, int | None]], int]:
    """Wait for the jobs to end (the JSON of `command` says how: printed here); each job's state
    and exit code, and the exit code (the first failed job's own). `limit`: seconds to wait at
    most, as `timeout` (the option's text) gave it."""
    from gpubox.format import span
    from gpubox.queue.client import exit_code_for, wait_jobs, wake_daemon
    from gpubox.queue.jobs import END_STATES
    from gpubox.queue.records import job_record

    jobs: list[Job] = []
    with errors(), open_queue_store(paths) as store:
        while True:
            # A job only moves on while a daemon runs: woken once every id is known to exist.
            ended = wait_jobs(store, ids, limit, on_poll=keep_daemon(paths), on_wait=lambda: wake_daemon(paths))
            if ended is None or not as_json:
                break
            # The JSON's records and its exit code from one read of the whole jobs (a retry or
            # a clean since the wait's last look: wait again, and it says so).
            found = [store.get(i) for i in ids]
            jobs = [j for j in found if j is not None]
            if len(jobs) == len(ids) and all(j.state in END_STATES for j in jobs):
                ended = {j.id: (j.state, j.exit_code) for j in jobs}
                break
    if ended is None:
        named = ", ".join(map(str, ids))
        said = f"job(s) {named} not ended yet (--timeout {timeout})" if limit == 0 else None
        waited = span(limit) if limit is not None else timeout  # as --timeout takes it: 1s, not a bare 1
        raise GpuboxError(said or f"timed out after {waited} waiting for job(s) {named}", ExitCode.TIMED_OUT)
    code = exit_code_for(ended.values())
    if as_json:
        index = gpu_index(None, jobs)  # only the JSON names GPUs
        emit(command, {"jobs": [job_record(j, {}, index) for j in jobs], "exit_code": code}, True, "", code=code)
    return ended, code
