"""`gpubox queue`: the local GPU job queue. Thin: parse, call gpubox.queue, render.

Queue modules are imported inside each command so that `gpubox top` and the help screens do
not pay for them, and `queue add` pays only for what it uses.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpubox.cli.queue_support import (
    add_jobs,
    box_gpus,
    check_daemon_could_start,
    emit,
    emit_then_fail,
    errors,
    gpu_index,
    joined,
    json_command,
    keep_daemon,
    live_reasons,
    open_queue_store,
    queue_paths,
    wait_jobs_command,
    wake,
)
from gpubox.exit_codes import ExitCode, GpuboxError

app = typer.Typer(
    help="A local queue that runs training, quantization and inference jobs on the GPUs.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

JSON = Annotated[bool, typer.Option("--json", help="Print one JSON document (schema 1) instead of text.")]
IDS = Annotated[
    list[int],
    # Each id once, in the order given: `cancel 4 4` cancels job 4, and says so once.
    typer.Argument(metavar="ID...", help="Job ids.", show_default=False, callback=lambda ids: list(dict.fromkeys(ids))),
]


@app.command("add", context_settings={"allow_interspersed_args": False}, options_metavar="[OPTIONS] [--]")
def add(
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="COMMAND", help="The command and its arguments.", show_default=False),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A name to show in listings.")] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help="infer, quantize, train, batch or other (default: other).")
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="How many GPUs (default: 1 on a box with GPUs; 0 makes a CPU-only job)."),
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu", help="These GPUs: indexes or UUIDs, as 0,2 (repeatable: they add up).", show_default=False
        ),
    ] = None,
    gpu_mem: Annotated[
        str | None, typer.Option("--gpu-mem", help="Free memory needed on each GPU, as 40G (GiB; also M, or bytes).")
    ] = None,
    priority: Annotated[int | None, typer.Option("--priority", help="Higher runs first (default 0).")] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after",
            help="Run when these jobs have succeeded: ID[,ID...] (repeatable: they add up).",
            show_default=False,
        ),
    ] = None,
    time_limit: Annotated[
        str | None, typer.Option("--time-limit", help="Stop the job after this long, as 90m or 2h.")
    ] = None,
    retries: Annotated[int | None, typer.Option("--retries", help="Queue a failed job again, up to N times.")] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="key=value, for reports (repeatable; one value per key).", show_default=False),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="NAME=value to set for the job (repeatable; one value per name).", show_default=False
        ),
    ] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Run there (default: the current directory).")] = None,
    shell: Annotated[
        bool,
        typer.Option(
            "--shell", help="Run the command through /bin/sh -c; its words are joined with spaces, so quote it whole."
        ),
    ] = False,
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Do not attach the dataloader probe.")] = False,
    share: Annotated[
        bool, typer.Option("--share", help="May share GPUs with other --share jobs where memory fits.")
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="Add every job in this file: a command or a JSON object per line ('-': stdin)."),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Then wait for the job(s) to end and exit as queue wait does (the first failed job's own code).",
        ),
    ] = False,
    as_json: JSON = False,
) -> None:
    """Queue a command; print its job id.

    The command's working directory and environment are captured now. Its options may follow
    its name, after --: gpubox queue add --gpus 2 -- python train.py --lr 3e-4.
    """
    from gpubox.queue.submit import AddOptions

    opts = AddOptions(
        name=name,
        kind=kind,
        gpus=gpus,
        gpu=joined(gpu),
        gpu_mem=gpu_mem,
        priority=priority,
        after=joined(after),
        time_limit=time_limit,
        retries=retries,
        tags=tuple(tag or ()),
        env=tuple(env or ()),
        cwd=cwd,
        shell=shell,
        probe=not no_probe,
        share=share,
    )
    code = add_jobs(command, opts, file, as_json, wait)
    if code:
        raise typer.Exit(code)


@app.command("ls")
@json_command("queue ls")
def ls(
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Also list jobs that have ended.")] = False,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", help="Only jobs in this state (repeatable): queued, running, succeeded, ...", show_default=False
        ),
    ] = None,
    as_json: JSON = False,
) -> None:
    """List jobs: queued and running ones, and why each queued job waits."""
    from gpubox.cli.queue_view import job_table
    from gpubox.queue.client import daemon_view
    from gpubox.queue.records import gpu_request, job_record

    paths = queue_paths()
    with errors(), open_queue_store(paths) as store:
        # Any case, as --kind takes it: QUEUED is queued.
        states = [s.lower() for s in state] if state else (None if show_all else ["queued", "running"])
        jobs = store.list(states)
    view = daemon_view(paths)
    index, live = gpu_index(view, jobs), live_reasons(view)
    records = [job_record(j, live, index) for j in jobs]
    text = job_table(records, {j.id: gpu_request(j, index) for j in jobs}) if records else "no jobs"
    emit("queue ls", {"daemon": view is not None, "jobs": records}, as_json, text)
    if view is None and not as_json and any(j.state == "running" for j in jobs):
        # Their ends are recorded by a daemon: a job shown running may have ended meanwhile.
        sys.stderr.write("gpubox: the daemon is not running: running jobs' ends are recorded once it runs\n")


@app.command("show")
@json_command("queue show")
def show(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job id.")],
    as_json: JSON = False,
) -> None:
    """Everything about one job, with every attempt and its logs."""
    from gpubox.cli.queue_view import job_details
    from gpubox.cli.report import job_usage_record
    from gpubox.queue.client import daemon_view
    from gpubox.queue.records import attempt_record, gpu_request, job_record

    paths = queue_paths()
    with errors(), open_queue_store(paths) as store:
        job = store.require(job_id)
        attempts = store.attempts(job_id)
    # The daemon says why a queued job waits, and names GPUs by index.
    held = job.gpu_uuids or any(a.gpu_uuids for a in attempts)
    view = daemon_view(paths) if job.state == "queued" or held else {}
    index = gpu_index(view, [job, *attempts])
    record = job_record(job, live_reasons(view) if job.state == "queued" else {}, index, with_env=as_json)
    tries = [attempt_record(a, index) for a in attempts]
    usage, unread = job_usage_record(job_id)
    text = job_details(record, tries, gpu_request(job, index), usage, usage_unread=unread is not None)
    emit("queue show", {"job": record, "attempts": tries, "usage": usage}, as_json, text, [unread] if unread else [])


@app.command("logs")
def logs(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="The job's stderr instead of its stdout.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", help="This attempt (default: the latest).")] = None,
) -> None:
    """Print a job's output (the latest attempt's, unless --attempt)."""
    from gpubox.cli.plain import ReaderLeft, output_unread
    from gpubox.queue.client import attempt_log, each_attempt
    from gpubox.queue.client import follow as follow_log
    from gpubox.queue.jobs import END_STATES

    paths = queue_paths()
    with errors():
        store = open_queue_store(paths)
        job = store.require(job_id)
        if attempt is not None and not 1 <= attempt <= job.attempt:
            raise ValueError(f"job {job_id} has no attempt {attempt} (it has {job.attempt})")
        if job.attempt == 0 and job.state in END_STATES:
            store.close()
            raise GpuboxError(f"job {job_id} never ran ({job.state}): no log", ExitCode.FAILED)
        if not follow:
            store.close()
            if job.attempt == 0:
                raise GpuboxError(f"job {job_id} has not started yet: no log", ExitCode.FAILED)
            path = attempt_log(paths, job, attempt, stderr)
            import shutil

            try:
                with open(path, "rb") as fh:
                    shutil.copyfileobj(fh, sys.stdout.buffer, 1 << 20)  # a log may be large: stream it
            except FileNotFoundError:
                pass
            except OSError as exc:
                if isinstance(exc, BrokenPipeError):
                    raise
                raise GpuboxError(f"cannot read {path}: {exc.strerror}", ExitCode.FAILED) from None
            return

        current = each_attempt(
            lambda: store.require(job_id).attempt if attempt is None else attempt,
            lambda number: attempt_log(paths, job, number, stderr),
        )

        keep = keep_daemon(paths)

        def ended() -> bool:
            if output_unread():  # as tail -f: a reader gone is noticed while the job is quiet too
                raise ReaderLeft
            keep()
            store.check_current()
            latest = store.require(job_id)
            if latest.state in END_STATES:
                return True
            # --attempt N: its log is whole once it is not the one running (a retry may follow).
            return attempt is not None and (latest.attempt > attempt or latest.state != "running")

        try:
            for chunk in follow_log(current, ended):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
        finally:
            store.close()


@app.command("cancel")
@json_command("queue cancel")
def cancel(ids: IDS, as_json: JSON = False) -> None:
    """Cancel queued jobs; stop running ones (SIGTERM to the whole tree, SIGKILL after a grace period)."""
    from gpubox.queue.client import cancel_jobs
    from gpubox.queue.records import job_record

    paths = queue_paths()
    failure = None
    with errors(), open_queue_store(paths) as store:
        if any(store.require(job_id).state == "running" for job_id in ids):
            # A daemon records a stopped job's end: one runs before the signal (a job that
            # cancels itself is stopped with this client in it).
            failure = wake(paths, waits="the end of a job stopped here is recorded once `gpubox daemon` runs")
        results = cancel_jobs(store, ids)
    ended = [f"job {r.job.id} ended already ({r.job.state})" for r in results if r.action == "ended already"]
    lines = [f"job {r.job.id}: {r.action}" for r in results if r.action != "ended already"]
    index = gpu_index(None, [r.job for r in results]) if as_json else {}  # only the JSON names GPUs
    data = {"jobs": [{**job_record(r.job, None if failure else {}, index), "action": r.action} for r in results]}
    for message in ended:
        sys.stderr.write(f"gpubox: {message}\n")
    code = ExitCode.FAILED if ended else ExitCode.OK
    emit_then_fail("queue cancel", data, as_json, "\n".join(lines), failure, ended, code)
    if ended:
        raise typer.Exit(int(code))


@app.command("wait")
@json_command("queue wait")
def wait(
    ids: IDS,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="Give up after this long (exit 124), as 30s or 2h; 0 only looks.")
    ] = None,
    as_json: JSON = False,
) -> None:
    """Wait for jobs to end; exit with the job's own exit code (the first failed one's, for several)."""
    raise typer.Exit(wait_jobs_command(ids, timeout, as_json))


@app.command("retry")
@json_command("queue retry")
def retry(ids: IDS, as_json: JSON = False) -> None:
    """Queue finished jobs again (failed, cancelled, timed out, lost or succeeded)."""
    from gpubox.queue.records import job_record

    paths = queue_paths()
    with errors(), open_queue_store(paths) as store:
        store.check_retry(ids)  # a missing or running job is said first: no setting would help
        check_daemon_could_start(paths)  # a daemon that cannot start would never run them: nothing is queued
        jobs = store.requeue_all(ids)
    failure = wake(paths)
    index = gpu_index(None, jobs) if as_json else {}  # a retried job keeps the GPUs it held last
    emit_then_fail(
        "queue retry",
        {"jobs": [job_record(j, None if failure else {}, index) for j in jobs]},
        as_json,
        "\n".join(f"job {j.id}: queued" for j in jobs),
        failure,
    )


def _one_gpu(given: list[str] | None) -> str | None:
    """The one GPU --gpu names; a pause or resume is for one GPU at a time."""
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"--gpu is given {len(given)} times: one GPU a command (gpubox queue pause --gpu 0)")
    return given[0]


def _pause_target(gpu: str | None) -> tuple[str, str]:
    from gpubox.queue.gpus import resolve_gpus
    from gpubox.queue.store import QUEUE

    if gpu is None:
        return QUEUE, "the queue"
    if not gpu.strip():
        raise ValueError("--gpu is empty: expected one GPU, by index or UUID")
    if "," in gpu:
        raise ValueError(f"--gpu takes one GPU (an index or a UUID), not the list {gpu!r}: one command each")
    box = box_gpus(f"--gpu {gpu} names a GPU")
    (uuid,) = resolve_gpus([gpu], box)
    index = next(g.index for g in box if g.uuid == uuid)
    return uuid, f"GPU {index}"


@app.command("pause")
def pause(
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="Only this GPU (index or UUID), for maintenance.", show_default=False),
    ] = None,
) -> None:
    """Start no new jobs (on one GPU, with --gpu); running jobs keep running."""
    paths = queue_paths()
    with errors():
        target, label = _pause_target(_one_gpu(gpu))
        with open_queue_store(paths) as store:
            changed = store.pause(target)
    sys.stdout.write(f"{label}: paused\n" if changed else f"{label}: paused already\n")


@app.command("resume")
def resume(
    gpu: Annotated[
        list[str] | None, typer.Option("--gpu", help="Only this GPU (index or UUID).", show_default=False)
    ] = None,
) -> None:
    """Start jobs again (on one GPU, with --gpu)."""
    from gpubox.queue.store import QUEUE

    paths = queue_paths()
    with errors(), open_queue_store(paths) as store:
        one = _one_gpu(gpu)
        try:
            target, label = _pause_target(one)
        except (ValueError, GpuboxError):
            # A GPU paused, then taken out of the box (or NVML gone): its UUID still resumes it.
            gone = [t for t in store.paused() if t != QUEUE and one and t.lower().startswith(one.strip().lower())]
            if len(gone) != 1:
                raise
            target, label = gone[0], f"GPU {gone[0]}"
        if target in store.paused():
            check_daemon_could_start(paths)  # a daemon that cannot start would start nothing: it stays paused
        changed = store.resume(target)
        still = sorted(t for t in store.paused() if t != QUEUE) if target == QUEUE else []
    failure = wake(paths) if changed else None  # nothing was paused: nothing new to start
    sys.stdout.write(f"{label}: resumed\n" if changed else f"{label}: was not paused\n")
    if still:
        # Paused one by one, GPUs stay paused when the queue resumes: say so, or jobs seem stuck.
        try:
            index = {g.uuid: str(g.index) for g in box_gpus("GPUs are paused")}
        except GpuboxError:
            index = {}
        named = ", ".join(index.get(u, u) for u in still)
        sys.stderr.write(f"gpubox: still paused: GPU {named} (gpubox queue resume --gpu ID, for each)\n")
    if failure is not None:
        raise failure


@app.command("clean")
@json_command("queue clean")
def clean(
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Only jobs that ended longer ago than this, as 7d.")
    ] = None,
    as_json: JSON = False,
) -> None:
    """Forget finished jobs, with their logs."""
    from gpubox.queue.client import remove_logs
    from gpubox.queue.parse import parse_duration

    paths = queue_paths()
    with errors():
        age = parse_duration(older_than, zero=True) if older_than is not None else 0.0
        with open_queue_store(paths) as store:
            removed = store.clean(age)
    remove_logs(paths, removed)
    emit("queue clean", {"removed": removed}, as_json, f"removed {len(removed)} finished job(s)")


@app.command("edit")
@json_command("queue edit")
def edit(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="A queued job's id.")],
    priority: Annotated[int | None, typer.Option("--priority", help="New priority.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="New GPU count (0: CPU-only).")] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="New GPUs: indexes or UUIDs, as 0,2 (repeatable: they add up).", show_default=False),
    ] = None,
    gpu_mem: Annotated[
        str | None, typer.Option("--gpu-mem", help="New free memory needed per GPU, as 40G (GiB).")
    ] = None,
    time_limit: Annotated[str | None, typer.Option("--time-limit", help="New time limit, as 2h.")] = None,
    no_time_limit: Annotated[bool, typer.Option("--no-time-limit", help="Remove the time limit.")] = False,
    as_json: JSON = False,
) -> None:
    """Change a queued job's priority, GPUs or time limit."""
    from gpubox.queue.parse import parse_duration, parse_size
    from gpubox.queue.records import job_record
    from gpubox.queue.store import not_editable
    from gpubox.queue.submit import AddOptions, GpuLookup, build_spec

    paths = queue_paths()
    with errors():
        if time_limit is not None and no_time_limit:
            raise ValueError("give --time-limit or --no-time-limit, not both")
        changes: dict[str, Any] = {}
        if priority is not None:
            changes["priority"] = priority
        if time_limit is not None:
            changes["time_limit_s"] = parse_duration(time_limit)
        if no_time_limit:
            changes["time_limit_s"] = None
        with open_queue_store(paths) as store:
            # A job that does not exist or cannot be edited says so first: no option would help,
            # and the GPUs need not be asked about.
            refusal = not_editable(job_id, store.require(job_id).state)
            if refusal:
                raise ValueError(refusal)
            if gpus is not None or gpu or gpu_mem is not None:
                # The same checks as `queue add`, against this box's GPUs.
                opts = AddOptions(gpus=gpus, gpu=joined(gpu), gpu_mem=gpu_mem)
                probe = build_spec(["-"], opts, {}, "/", GpuLookup(box_gpus))
                if gpus is not None or gpu:
                    changes["gpus"], changes["gpu_ids"] = probe.gpus, probe.gpu_ids
                if gpu_mem is not None:
                    changes["gpu_mem_bytes"] = parse_size(gpu_mem)
                elif gpus == 0:
                    changes["gpu_mem_bytes"] = None
            if not changes:
                raise ValueError(
                    "nothing to change: give --priority, --gpus, --gpu, --gpu-mem, --time-limit or --no-time-limit"
                )
            check_daemon_could_start(paths)  # a daemon that cannot start would never run it: it is left as it was
            job = store.edit(job_id, changes)
    failure = wake(paths)
    index = gpu_index(None, [job]) if as_json else {}  # only the JSON names GPUs
    emit_then_fail(
        "queue edit",
        {"job": job_record(job, None if failure else {}, index)},
        as_json,
        f"job {job.id}: updated",
        failure,
    )
