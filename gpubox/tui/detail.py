"""Full-screen detail of one GPU or one process, with longer history graphs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Static

from gpubox import format as fmt
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, ProcessSnapshot
from gpubox.tui.charts import graph, scale_top
from gpubox.tui.gpu_panel import PCIE_FLOOR, below_best, downtrained
from gpubox.tui.history import BoxHistory, GpuHistory, ProcessHistory
from gpubox.tui.key_hints import KeyHints
from gpubox.tui.process_table import command_text
from gpubox.tui.reasons import why_missing

GRAPH_HEIGHT = 4
GUTTER = 11  # the axis labels left of each graph ("20.5GiB/s" and a rule)


def _last(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return present[-1] if present else None


def graph_block(
    text: Text,
    title: str,
    values: Iterable[float | None],
    top: float,
    show: Callable[[float | None], str],
    width: int,
    missing: str | None = None,
) -> None:
    """A titled graph: the figure now and its peak, then bars with the axis top and zero."""
    values = list(values)
    present = [v for v in values if v is not None]
    text.append(f"{title}", "bold")
    if not present:
        text.append(f"  {fmt.DASH} {missing or 'n/a'}\n\n", "dim")
        return
    text.append(f"  now {show(_last(values))}  peak {show(max(present))}\n", "dim")
    for n, row in enumerate(graph(values, max(1, width - GUTTER), GRAPH_HEIGHT, top)):
        axis = show(top) if n == 0 else "0" if n == GRAPH_HEIGHT - 1 else ""
        text.append(f"{axis:>{GUTTER - 1}}│", "dim")
        text.append(row + "\n", "cyan")
    text.append("\n")


# The title line and the body of a detail view, at a width.
RenderDetail = Callable[[BoxSnapshot, BoxHistory, int], tuple[Text, Text]]


class DetailScreen(Screen[None]):
    """Follows the live view: the app hands every applied snapshot to `follow`."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, render: RenderDetail) -> None:
        super().__init__(classes="detail")
        self._render_detail = render  # each kind of detail says what it shows
        self._snap: BoxSnapshot | None = None
        self._history: BoxHistory | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with VerticalScroll(id="detail-scroll"):
            yield Static(id="detail-body")
        yield KeyHints()

    def follow(self, snap: BoxSnapshot, history: BoxHistory) -> None:
        self._snap, self._history = snap, history
        self._rebuild()

    def on_resize(self, event: Resize) -> None:
        self._rebuild()

    def on_mount(self) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        if self._snap is None or self._history is None or not self.is_mounted:
            return
        body = self.query_one("#detail-body", Static)
        width = body.content_size.width or self.size.width - 2
        title, text = self._render_detail(self._snap, self._history, width)
        self.query_one("#detail-title", Static).update(title)
        body.update(text)


class GpuDetail(DetailScreen):
    def __init__(self, uuid: str) -> None:
        super().__init__(self.render_detail)
        self.uuid = uuid
        self._gpu: GpuSnapshot | None = None
        self._gpu_history: GpuHistory | None = None

    def render_detail(self, snap: BoxSnapshot, history: BoxHistory, width: int) -> tuple[Text, Text]:
        gpu = next((g for g in snap.gpus if g.uuid == self.uuid), None)
        self._gpu = gpu or self._gpu  # a GPU that left keeps its last figures on screen
        self._gpu_history = history.gpus.get(self.uuid, self._gpu_history)
        g, h = self._gpu, self._gpu_history
        if g is None or h is None:
            return Text(f"GPU {self.uuid}: gone"), Text()
        title = Text(f"GPU {g.label}  {g.name}", style="bold")
        title.append(f"  {g.uuid}  bus {g.pci_bus_id or fmt.DASH}", "dim")
        if gpu is None:
            title.append("  (gone)", "bold red")
        if g.lost:
            title.append("  LOST: fell off the bus or needs a reset", "bold red")
        text = Text(no_wrap=True, overflow="ellipsis", end="")
        label, activity = h.activity()
        name = "SM activity" if label == "SM" else "busy (no GPM: not occupancy)"
        graph_block(text, name, activity, 100.0, fmt.pct, width)
        graph_block(text, "SM occupancy", h.sm_occupancy, 100.0, fmt.pct, width, why_missing(g.reasons, "sm_occupancy"))
        rx, tx = list(h.pcie_rx), list(h.pcie_tx)
        top = scale_top(rx + tx, PCIE_FLOOR)
        link = fmt.link(g.pcie_link_gen, g.pcie_link_width, g.pcie_link_gen_max, g.pcie_link_width_max)
        down = "  (below its best under load)" if downtrained(g) else "  (at rest)" if below_best(g) else ""
        graph_block(text, f"PCIe RX  {link}{down}", rx, top, fmt.rate, width, why_missing(g.reasons, "pcie_rx_Bps"))
        graph_block(text, "PCIe TX", tx, top, fmt.rate, width, why_missing(g.reasons, "pcie_tx_Bps"))
        mem = f"memory used  {fmt.size(g.mem_used_bytes)} of {fmt.size(g.mem_total_bytes)}"
        graph_block(text, mem, h.mem_used, 1.0, fmt.fraction_pct, width, why_missing(g.reasons, "mem_used_bytes"))
        power_top = g.power_limit_w or scale_top(list(h.power), 1.0)
        graph_block(text, "power", h.power, power_top, fmt.watts, width, why_missing(g.reasons, "power_w"))
        graph_block(text, "temperature", h.temperature, scale_top(list(h.temperature), 90.0), fmt.temp, width)
        procs = [p for p in snap.processes if p.gpu_uuid == self.uuid]
        unread = "processes" in g.reasons  # a list NVML would not give: unknown, not none
        why = f"; a list cannot be read: {why_missing(g.reasons, 'processes')}" if unread else ""
        text.append(f"processes ({len(procs)}{why})\n", "bold")
        for p in sorted(procs, key=lambda p: -(p.gpu_mem_bytes or 0)):
            text.append(f"{p.pid:>8} {p.user or fmt.DASH:<10} {fmt.pct(p.sm_util):>5} {fmt.size(p.gpu_mem_bytes):>9}  ")
            text.append(f"{command_text(p)}\n")
        return title, text


class ProcessDetail(DetailScreen):
    def __init__(self, key: tuple[int, str], gpu_label: str) -> None:
        super().__init__(self.render_detail)
        self.key = key
        self.gpu_label = gpu_label
        self.proc: ProcessSnapshot | None = None
        self._proc_history: ProcessHistory | None = None

    def render_detail(self, snap: BoxSnapshot, history: BoxHistory, width: int) -> tuple[Text, Text]:
        proc = next((p for p in snap.processes if p.key == self.key), None)
        self.proc = proc or self.proc  # a process that exited keeps its last figures on screen
        self._proc_history = history.processes.get(self.key, self._proc_history)
        p, h = self.proc, self._proc_history
        if p is None or h is None:
            return Text(f"process {self.key[0]}: gone"), Text()
        title = Text(f"process {p.pid}  {p.user or fmt.DASH}  GPU {self.gpu_label}", style="bold")
        title.append(f"  up {fmt.uptime(p.start_time, snap.taken_at)}  {p.kind}", "dim")
        if p.job_id is not None:
            title.append(f"  job {fmt.job(p.job_id, p.job_kind)}", "dim")
        if proc is None:
            title.append("  (exited)", "bold red")
        text = Text(overflow="fold", end="")
        text.append(f"{command_text(p)}\n\n")
        gpu = next((g for g in snap.gpus if g.uuid == p.gpu_uuid), None)
        mem_top = float(gpu.mem_total_bytes) if gpu and gpu.mem_total_bytes else scale_top(list(h.gpu_mem), 1.0)
        graph_block(text, "SM %", h.sm_util, 100.0, fmt.pct, width, why_missing(p.reasons, "sm_util"))
        graph_block(text, "GPU memory", h.gpu_mem, mem_top, fmt.size, width, why_missing(p.reasons, "gpu_mem_bytes"))
        cpu_top = scale_top(list(h.cpu_percent), 100.0)
        graph_block(text, "CPU %", h.cpu_percent, cpu_top, fmt.pct, width, why_missing(p.reasons, "cpu_percent"))
        rss_top = scale_top(list(h.rss), 1.0)
        graph_block(text, "RSS", h.rss, rss_top, fmt.size, width, why_missing(p.reasons, "rss_bytes"))
        wait = why_missing(p.reasons, "loader_wait")
        graph_block(text, f"loader wait{loader_source(p)}", h.loader_wait, 1.0, fmt.fraction_pct, width, wait)
        if p.loader_wait_source == "probe" or any(v is not None for v in h.batches_per_s):
            rate_top = scale_top(list(h.batches_per_s), 1.0)
            graph_block(text, "batches/s (probe)", h.batches_per_s, rate_top, _per_s, width, "no batch yet")
        return title, text


def loader_source(p: ProcessSnapshot) -> str:
    """How the loader wait is known, for its title: exact, or from how many stack samples."""
    if p.loader_wait_source == "sampled":
        return f" (sampled n={p.loader_wait_samples})" if p.loader_wait_samples is not None else " (sampled)"
    return f" ({p.loader_wait_source})" if p.loader_wait_source else ""


def _per_s(value: float | None) -> str:
    return fmt.DASH if value is None else f"{value:.1f}/s"
