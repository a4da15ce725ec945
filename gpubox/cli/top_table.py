"""`gpubox top --once` as text: a GPU table and a process table."""

from __future__ import annotations

from typing import Any

from gpubox import format as fmt
from gpubox.telemetry.loader_wait import wait_level
from gpubox.telemetry.model import BoxSnapshot, ProcessSnapshot

_LOADER_STYLES = {"high": "yellow", "severe": "bold red"}

GPU_COLUMNS = (
    "GPU",
    "Name",
    "Busy",
    "SM act",
    "SM occ",
    "Mem",
    "PCIe RX",
    "PCIe TX",
    "Link",
    "Power",
    "Temp",
    "SM clk",
)
PROCESS_COLUMNS = ("PID", "GPU", "User", "SM", "GPU mem", "CPU", "RSS", "Loader wait", "Uptime", "Job", "Command")


def loader_cell(p: ProcessSnapshot, threshold: float) -> str:
    """Loader wait with how it is known, as rich markup: coloured above the threshold."""
    if p.loader_wait is None:
        return fmt.DASH
    source = p.loader_wait_source or ""
    if source == "sampled" and p.loader_wait_samples is not None:
        source += f" n={p.loader_wait_samples}"
    text = f"{fmt.fraction_pct(p.loader_wait)} [dim]{source}[/]"
    level = wait_level(p.loader_wait, threshold)
    return f"[{_LOADER_STYLES[level]}]{text}[/]" if level else text


def render_tables(snap: BoxSnapshot, console: Any, loader_threshold: float = 0.2) -> None:
    from rich.markup import escape
    from rich.table import Table

    host = snap.host
    console.print(
        f"[bold]{escape(host.hostname)}[/]  driver {escape(host.driver_version or fmt.DASH)}  "
        f"CUDA {host.cuda_driver_version or fmt.DASH}  CPU {fmt.pct(host.cpu_percent)}  "
        f"RAM {fmt.size(host.mem_used_bytes)}/{fmt.size(host.mem_total_bytes)}"
        + ("  [yellow](simulated)[/]" if snap.backend == "simulated" else "")
    )
    gpus = Table(box=None, pad_edge=False, header_style="bold")
    for col in (*GPU_COLUMNS, "Events"):
        gpus.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            max_width=22 if col == "Name" else None,
            justify="left" if col in {"Name", "Link", "Events"} else "right",
        )
    for g in snap.gpus:
        if g.lost:
            gpus.add_row(g.label, escape(g.name), "[red]GPU lost[/]", *[""] * 10)
            continue
        gpus.add_row(
            g.label,
            escape(g.name),
            fmt.pct(g.gpu_busy),
            fmt.pct(g.sm_active),
            fmt.pct(g.sm_occupancy),
            f"{fmt.size(g.mem_used_bytes)}/{fmt.size(g.mem_total_bytes)}",
            fmt.rate(g.pcie_rx_Bps),
            fmt.rate(g.pcie_tx_Bps),
            fmt.link(g.pcie_link_gen, g.pcie_link_width, g.pcie_link_gen_max, g.pcie_link_width_max),
            f"{fmt.watts(g.power_w)}/{fmt.watts(g.power_limit_w)}",
            fmt.temp(g.temperature_c),
            fmt.mhz(g.clock_sm_mhz),
            fmt.events(g.clock_event_reasons),
        )
    console.print(gpus)
    procs = Table(box=None, pad_edge=False, header_style="bold")
    for col in PROCESS_COLUMNS:
        procs.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            ratio=1 if col == "Command" else None,
            justify="left" if col in {"User", "Job", "Command"} else "right",
        )
    labels = {g.uuid: g.label for g in snap.gpus}
    for p in sorted(snap.processes, key=lambda p: (p.gpu_index, -(p.gpu_mem_bytes or 0))):
        procs.add_row(
            str(p.pid),
            labels.get(p.gpu_uuid, str(p.gpu_index)),
            escape(p.user or fmt.DASH),
            fmt.pct(p.sm_util),
            fmt.size(p.gpu_mem_bytes),
            fmt.pct(p.cpu_percent),
            fmt.size(p.rss_bytes),
            loader_cell(p, loader_threshold),
            fmt.uptime(p.start_time, snap.taken_at),
            fmt.job(p.job_id, p.job_kind),
            escape(fmt.one_line(p.command or fmt.DASH)),  # one line, and no escape sequence reaches the terminal
        )
    if snap.processes:
        console.print(procs)
    else:
        console.print("no GPU processes")
    for err in snap.errors:
        console.print(err, style="red", markup=False)
