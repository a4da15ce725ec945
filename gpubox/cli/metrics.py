"""`gpubox metrics`: the box in the Prometheus exposition format, served over HTTP or printed once.
Thin: parse, call gpubox.metrics, print."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from gpubox.cli.output import fail
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.metrics.listen import DEFAULT_LISTEN

if TYPE_CHECKING:  # imported when a command runs, so that `gpubox --help` does not pay for prometheus_client
    from gpubox.metrics.exposition import BoxCollector

DUMP_WINDOW = 0.5  # seconds of rates in `dump` when --interval is not given, as `top --once`

app = typer.Typer(
    help="Prometheus metrics of this box: its GPUs, their processes, the queue and the GPU-hours ledger.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DEMO = Annotated[bool, typer.Option("--demo", help="Export a simulated box (no GPU needed).")]


@app.command("serve")
def serve(
    listen: Annotated[
        str,
        typer.Option(
            "--listen", "-l", metavar="HOST:PORT", help="Where to serve /metrics (:PORT: every IPv4 interface)."
        ),
    ] = DEFAULT_LISTEN,
    demo: DEMO = False,
) -> int:
    """Serve /metrics for Prometheus to scrape, in the foreground until SIGINT, SIGTERM or SIGHUP.

    Every scrape reads the GPUs, their processes and the queue's database afresh; rates cover
    the time since the previous scrape. Per GPU (labels gpu, uuid, name): gpubox_gpu_busy_ratio,
    gpubox_gpu_sm_active_ratio, gpubox_gpu_sm_occupancy_ratio, PCIe bytes per second and link,
    memory, power, temperature, energy and gpubox_gpu_lost. Per process (labels gpu, uuid, pid,
    user, job, kind): gpubox_process_sm_util_ratio, gpubox_process_gpu_memory_bytes and
    gpubox_process_loader_wait_ratio. Queue: gpubox_queue_jobs by kind and state. Ledger, once
    the daemon has recorded GPU use (not with --demo), per GPU since the ledger began:
    gpubox_gpu_allocated_seconds_total, gpubox_gpu_busy_seconds_total and
    gpubox_gpu_starved_seconds_total. A figure the GPU does not give is left out of the scrape,
    never exported as 0.

    Exit codes: 0 stopped by a signal, 1 cannot listen, 2 bad --listen, 3 no NVIDIA driver.
    """
    from gpubox.metrics.listen import parse_listen
    from gpubox.metrics.server import ListenError
    from gpubox.metrics.server import serve as serve_metrics

    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise GpuboxError(str(exc), ExitCode.USAGE) from None
    collector = _open_collector(demo, "serve")
    collector.on_new_error = fail  # once when it starts, not at every scrape while it lasts
    try:
        collector.warm_up()  # so that the first scrape has rates too, over the time since the start
        serve_metrics(collector, address, ready=lambda: sys.stderr.write(f"gpubox: serving {address.url}\n"))
    except ListenError as exc:
        raise GpuboxError(exc.message, ExitCode.USAGE if exc.bad_input else ExitCode.FAILED) from None
    finally:
        collector.close()
    return int(ExitCode.OK)


@app.command("dump")
def dump(
    demo: DEMO = False,
    interval: Annotated[
        float,
        typer.Option("--interval", "-i", metavar="SECONDS", help="Seconds the rates are averaged over (at most 60)."),
    ] = DUMP_WINDOW,
) -> int:
    """Print the metrics once in the Prometheus text format, as `serve` would answer a scrape.

    For cron, or node_exporter's textfile collector (write to a temporary file, then rename it
    into the collector's directory). Exit codes: 0 printed, 2 bad input, 3 no NVIDIA driver.
    """
    from gpubox.metrics.exposition import dump as dump_text

    if not (math.isfinite(interval) and 0 < interval <= 60):
        raise GpuboxError("--interval must be more than 0 and at most 60 seconds", ExitCode.USAGE)
    collector = _open_collector(demo, "dump")
    try:
        text = dump_text(collector, interval)
    finally:
        collector.close()
    for error in collector.errors:
        fail(error)
    sys.stdout.write(text)
    return int(ExitCode.OK)


def _open_collector(demo: bool, command: str) -> BoxCollector:
    from gpubox.cli.settings import load_settings
    from gpubox.metrics.exposition import open_box_collector
    from gpubox.telemetry.backend import BackendUnavailable

    cfg = load_settings()
    try:
        return open_box_collector(demo, cfg.get("top.loader_window"), cfg.get("top.loader_sampling"))
    except BackendUnavailable as exc:
        raise GpuboxError(
            f"{exc}; `gpubox metrics {command} --demo` exports a simulated box", ExitCode.NO_GPU
        ) from None
