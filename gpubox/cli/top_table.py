"""`gpubox top --once` as text: a GPU table and a process table."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import JustifyMethod

from gpubox import format as fmt
from gpubox.column_fit import PROCESS_DROP_ORDER, fit_columns
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
# On a narrow terminal the least needed columns leave first, as in the live view; a figure is never
# cut, only the GPU's name and the command (with an ellipsis), which take the width that is left.
GPU_DROP_ORDER = ("SM clk", "Link", "Temp", "Events", "PCIe TX", "Power", "SM occ")
_PROCESS_LABELS = {"uptime": "Uptime", "rss": "RSS", "job": "Job", "cpu": "CPU", "user": "User", "gpu": "GPU"}
PROCESS_DROP_ORDER_LABELS = tuple(_PROCESS_LABELS[k] for k in PROCESS_DROP_ORDER)
_LEFT = {"Name", "Link", "Events", "User", "Job", "Command"}
_NAME_WIDTH = 22  # the longest a GPU's name is shown
_MIN_CUT = {"Name": 10, "Command": 12}  # the least the column that is cut keeps


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


def _lines(parts: list[str], width: int) -> list[str]:
    """Parts of markup joined by two spaces, a new line before one that would pass `width`:
    a label is never parted from its figure."""
    from rich.text import Text

    lines: list[str] = []
    for part in parts:
        joined = f"{lines[-1]}  {part}" if lines else part
        if lines and Text.from_markup(joined).cell_len <= width:
            lines[-1] = joined
        else:
            lines.append(part)
    return lines


def fitted_table(headers: tuple[str, ...], rows: list[list[str]], drop: tuple[str, ...], cut: str, width: int) -> Any:
    """A table of rows of markup that fits `width`: columns in `drop` leave, first to last, and
    the `cut` column takes the width left, cut with an ellipsis."""
    from rich.table import Table
    from rich.text import Text

    natural = {h: cell_len(h) for h in headers}
    for row in rows:
        for h, cell in zip(headers, row, strict=True):
            natural[h] = max(natural[h], Text.from_markup(cell).cell_len)
    if cut == "Name":
        natural[cut] = min(natural[cut], _NAME_WIDTH)
    widths = {h: min(w, _MIN_CUT[cut]) if h == cut else w for h, w in natural.items()}
    kept = fit_columns(widths, drop, width, gap=2)  # Rich puts 2 cells between columns
    room = width - sum(natural[h] for h in kept if h != cut) - 2 * (len(kept) - 1)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for h in kept:
        cut_to = max(_MIN_CUT[cut], min(room, natural[h])) if h == cut else None
        justify: JustifyMethod = "left" if h in _LEFT else "right"
        table.add_column(h, no_wrap=True, overflow="ellipsis", width=cut_to, justify=justify)
    for row in rows:
        table.add_row(*(cell for h, cell in zip(headers, row, strict=True) if h in kept))
    return table


def render_tables(snap: BoxSnapshot, console: Any, loader_threshold: float = 0.2) -> None:
    from rich.markup import escape

    host = snap.host
    parts = [
        f"[bold]{escape(host.hostname)}[/]",
        f"driver {escape(host.driver_version or fmt.DASH)}",
        f"CUDA {escape(host.cuda_driver_version or fmt.DASH)}",
        f"CPU {fmt.pct(host.cpu_percent)}",
        f"RAM {fmt.size(host.mem_used_bytes)}/{fmt.size(host.mem_total_bytes)}",
    ] + (["[yellow](simulated)[/]"] if snap.backend == "simulated" else [])
    for line in _lines(parts, console.width):
        console.print(line)
    gpu_rows = []
    for g in snap.gpus:
        if g.lost:
            gpu_rows.append([g.label, escape(g.name), "[red]GPU lost[/]", *[""] * 10])
            continue
        gpu_rows.append(
            [
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
            ]
        )
    console.print(fitted_table((*GPU_COLUMNS, "Events"), gpu_rows, GPU_DROP_ORDER, "Name", console.width))
    labels = {g.uuid: g.label for g in snap.gpus}
    proc_rows = [
        [
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
        ]
        for p in sorted(snap.processes, key=lambda p: (p.gpu_index, -(p.gpu_mem_bytes or 0)))
    ]
    if snap.processes:
        procs = fitted_table(PROCESS_COLUMNS, proc_rows, PROCESS_DROP_ORDER_LABELS, "Command", console.width)
        console.print(procs)
    else:
        console.print("no GPU processes")
    for err in snap.errors:
        console.print(err, style="red", markup=False)
