"""`gpubox top`: the live view, or one snapshot as a table or JSON."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from gpubox.cli.output import console, fail, print_json, print_json_failure
from gpubox.digits import ascii_int
from gpubox.exit_codes import ExitCode, GpuboxError

if TYPE_CHECKING:  # imported when `top` runs, so that other commands do not pay for them
    from gpubox.telemetry.backend import TelemetryBackend

ONCE_WINDOW = 0.5  # seconds of rates for --once when --interval is not given


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON (implies --once).")] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            "-i",
            metavar="SECONDS",
            help="Seconds between refreshes (0.05 to 3600); with --once, the window rates cover.",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", "-g", metavar="GPUS", help="Only these GPUs: indices, UUIDs or UUID prefixes, like 0,2."),
    ] = None,
    demo: Annotated[bool, typer.Option("--demo", help="Show a simulated box (no GPU needed).")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help="No colour, even on a terminal.")] = False,
    demo_gpus: Annotated[int, typer.Option("--demo-gpus", hidden=True)] = 4,
    demo_processes: Annotated[int, typer.Option("--demo-processes", hidden=True)] = 12,
) -> int:
    """Every GPU and GPU process, live: SM activity, PCIe traffic, memory, dataloader wait.

    One panel per GPU (per MIG instance in MIG mode) shows gpu_busy (time any kernel ran),
    sm_active and sm_occupancy (from GPM on Hopper and newer; "–" where the GPU has no GPM),
    PCIe RX/TX with the link's current and maximum generation and width, memory, power,
    temperature, clocks and throttle reasons. The process table joins every GPU's processes
    with their user, CPU, RSS and command line, and the queue job (id and kind) of those the
    gpubox queue started. A figure the GPU or driver does not give is shown as "–" and, in
    --json, as null with its reason: never as 0.

    Loader wait is the share of time a process spent waiting for its next batch over the last
    top.loader_window seconds: exact ("probe") for processes started with `gpubox run` or that
    call gpubox.probe.install(), estimated from py-spy stack samples ("sampled") for other
    processes where ptrace is allowed, and unknown otherwise.

    With --once, rates are averaged over --interval seconds (default 0.5). When stdin or
    stdout is not a terminal, top prints one snapshot as with --once.
    """
    try:
        return _top(once, json_out, interval, gpu, demo, no_color, demo_gpus, demo_processes)
    except GpuboxError as exc:
        if json_out:  # a script asked for JSON: it gets an envelope on failure too
            print_json_failure("top", exc.code, [exc.message])
        raise


def _top(
    once: bool,
    json_out: bool,
    interval: float | None,
    gpu: str | None,
    demo: bool,
    no_color: bool,
    demo_gpus: int,
    demo_processes: int,
) -> int:
    from gpubox.telemetry.backend import BackendUnavailable
    from gpubox.telemetry.sources import open_backend, snapshot_over

    flags = {"top.interval": interval, "color": False if no_color else None}
    from gpubox.cli.settings import load_settings

    cfg = load_settings(flags)
    # A live view needs a terminal; `gpubox top > file` or `| grep` gets one snapshot instead.
    once = once or json_out or not (sys.stdout.isatty() and sys.stdin.isatty())
    if not 1 <= demo_gpus <= 64 or not 0 <= demo_processes <= 10_000:
        raise GpuboxError("--demo-gpus must be 1-64 and --demo-processes 0-10000", ExitCode.USAGE)
    try:
        backend = open_backend(
            demo, demo_gpus, demo_processes, cfg.get("top.loader_window"), cfg.get("top.loader_sampling")
        )
    except BackendUnavailable as exc:
        if json_out:
            print_json_failure("top", ExitCode.NO_GPU, [str(exc)])
        fail(f"{exc}; `gpubox top --demo` shows a simulated box")
        return int(ExitCode.NO_GPU)
    try:
        # Checked against the GPUs as opened: a bad --gpu is refused at once, not after the
        # sampling window of --once, nor once the live view has taken over the screen.
        chosen = _gpus(gpu, backend) if gpu is not None else None
    except GpuboxError:
        backend.close()
        raise
    if not once:
        from gpubox.tui.top_app import run_live

        # run_live closes the backend once no sample is running.
        interval_s, threshold = cfg.get("top.interval"), cfg.get("top.loader_wait_threshold")
        return int(run_live(backend, interval_s, gpu_filter=gpu, color=cfg.get("color"), loader_threshold=threshold))
    try:
        snap = snapshot_over(backend, interval if interval is not None else ONCE_WINDOW)
    finally:
        backend.close()
    if chosen is not None:
        snap = snap.only_gpus(chosen)
    for notice in snap.notices:  # advice, such as how to allow stack sampling: stderr, once
        sys.stderr.write(f"gpubox: {notice}\n")
    if json_out:
        print_json("top", snap, errors=list(snap.errors))
    else:
        from gpubox.cli.top_table import render_tables

        out = console(cfg.get("color"))
        out.width = _columns() or out.width  # `COLUMNS=80 gpubox top --once | less` fits 80, piped too
        render_tables(snap, out, cfg.get("top.loader_wait_threshold"))
    return int(ExitCode.OK)


def _columns() -> int | None:
    """COLUMNS from the environment, where it is a sensible width."""
    text = os.environ.get("COLUMNS", "")
    width = ascii_int(text)
    return width if width is not None and 20 <= width <= 1000 else None


def _gpus(text: str, backend: TelemetryBackend) -> frozenset[str]:
    from gpubox.telemetry.sources import parse_gpu_selection

    try:
        return parse_gpu_selection(text, backend.gpus())
    except ValueError as exc:
        raise GpuboxError(str(exc), ExitCode.USAGE) from exc
