"""One panel per GPU (or MIG instance), laid out in a grid that fits 1 to 8 of them."""

from __future__ import annotations

import math

from rich.style import Style
from rich.text import Text
from textual.content import Content
from textual.events import Click, Resize
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from gpubox import format as fmt
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot
from gpubox.tui.charts import scale_top, sparkline
from gpubox.tui.history import BoxHistory, GpuHistory
from gpubox.tui.reasons import why_missing

LABEL = "dim"
WARN = "bold yellow"
ERROR = "bold red"
MIN_PANEL_WIDTH = 30
PCIE_FLOOR = 1e6  # an idle link still gets an axis, rather than noise scaled to full height
# Clock events that mean the GPU is being slowed down, as opposed to idle or pinned on purpose.
SLOWDOWNS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)


def _below(now: int | None, best: int | None) -> bool:
    return now is not None and best is not None and now < best


# A GPU at rest drops its link to an older generation on purpose (power saving) and brings it
# back to its best under load, as `gpubox doctor` says: a link below its best is a fault only
# while the GPU works, or every idle GPU would be flagged.
LINK_BUSY = 50.0  # % busy from which a link below its best counts as trained down


def below_best(gpu: GpuSnapshot) -> bool:
    """The link runs below what it can do: an older generation or fewer lanes."""
    return _below(gpu.pcie_link_gen, gpu.pcie_link_gen_max) or _below(gpu.pcie_link_width, gpu.pcie_link_width_max)


def downtrained(gpu: GpuSnapshot) -> bool:
    """The link runs below what it can do while the GPU is busy: a slot, riser or setting to look at."""
    return below_best(gpu) and (gpu.gpu_busy or 0.0) >= LINK_BUSY


def _figure(text: Text, label: str, value: str) -> None:
    text.append(label, LABEL)
    text.append(value)


def _mhz_bare(value: int | None) -> str:
    return fmt.DASH if value is None else str(value)


def _missing(text: Text, gpu: GpuSnapshot, field: str) -> None:
    text.append(fmt.DASH + " ")
    text.append(why_missing(gpu.reasons, field), LABEL)


def _mem_line(text: Text, gpu: GpuSnapshot, width: int) -> None:
    numbers = f" {fmt.size(gpu.mem_used_bytes)}/{fmt.size(gpu.mem_total_bytes)}"
    text.append("mem ", LABEL)
    used = gpu.mem_used_fraction
    bar = max(0, width - 4 - len(numbers))
    if used is None:
        text.append(" " * bar)
    else:
        filled = round(bar * min(used, 1.0))
        text.append("█" * filled, WARN if used >= 0.95 else "green")
        text.append("░" * (bar - filled), LABEL)
    text.append(numbers)


Spark = tuple[str, list[float | None], float]  # label, values, top of the axis


def _spark_pair(text: Text, left: Spark, right: Spark | None, width: int) -> None:
    room = width - len(left[0]) - 1 - (len(right[0]) + 3 if right else 0)
    left_width = room // 2 if right else room
    text.append(left[0] + " ", LABEL)
    text.append(sparkline(left[1], max(0, left_width), left[2]), "cyan")
    if right:
        text.append("  " + right[0] + " ", LABEL)
        text.append(sparkline(right[1], max(0, room - left_width), right[2]), "cyan")


def panel_text(gpu: GpuSnapshot, history: GpuHistory, width: int) -> Text:
    """What one panel shows at this content width."""
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    if gpu.lost:
        text.append("GPU LOST\n", ERROR)
        text.append("fell off the bus or needs a reset\n", ERROR)
        text.append(f"{gpu.uuid}\n", LABEL)
        text.append(f"bus {gpu.pci_bus_id or fmt.DASH}", LABEL)
        return text
    _figure(text, "busy ", fmt.pct(gpu.gpu_busy))
    text.append("   ")
    if gpu.sm_active is None:
        text.append("SM act ", LABEL)
        text.append(fmt.DASH)
    else:
        _figure(text, "SM act ", fmt.pct(gpu.sm_active))
    text.append("\n")
    text.append("occupancy ", LABEL)
    if gpu.sm_occupancy is None:
        _missing(text, gpu, "sm_occupancy")
    else:
        text.append(fmt.pct(gpu.sm_occupancy))
    text.append("\n")
    _mem_line(text, gpu, width)
    text.append("\n")
    if gpu.pcie_rx_Bps is None and gpu.pcie_tx_Bps is None:
        text.append("RX/TX ", LABEL)
        _missing(text, gpu, "pcie_rx_Bps")
    else:
        _figure(text, "RX ", fmt.rate(gpu.pcie_rx_Bps))
        _figure(text, " TX ", fmt.rate(gpu.pcie_tx_Bps))
    text.append("\n")
    link = fmt.link(gpu.pcie_link_gen, gpu.pcie_link_width, gpu.pcie_link_gen_max, gpu.pcie_link_width_max)
    text.append("PCIe ", LABEL)
    text.append(link + (" ↓" if downtrained(gpu) else ""), WARN if downtrained(gpu) else "")
    text.append("\n")
    _figure(text, "power ", f"{fmt.watts(gpu.power_w)}/{fmt.watts(gpu.power_limit_w)}")
    _figure(text, " temp ", fmt.temp(gpu.temperature_c))
    text.append("\n")
    # MHz once, at the end: the panel is narrow when eight GPUs share a row
    _figure(text, "clk SM ", _mhz_bare(gpu.clock_sm_mhz))
    _figure(text, " mem ", fmt.mhz(gpu.clock_mem_mhz))
    text.append("\n")
    text.append("throttle ", LABEL)
    events = gpu.clock_event_reasons
    if events is None:
        _missing(text, gpu, "clock_event_reasons")
    else:
        text.append(", ".join(events) or "none", WARN if SLOWDOWNS & set(events) else "")
    text.append("\n")
    label, activity = history.activity()
    occupancy: Spark | None = ("occ", list(history.sm_occupancy), 100.0) if history.sm_occupancy_known else None
    _spark_pair(text, (label, list(activity), 100.0), occupancy, width)
    text.append("\n")
    rx, tx = list(history.pcie_rx), list(history.pcie_tx)
    top = scale_top(rx + tx, PCIE_FLOOR)
    _spark_pair(text, ("RX", rx, top), ("TX", tx, top), width)
    text.append("\n")
    _spark_pair(text, ("mem", list(history.mem_used), 1.0), None, width)
    return text


class GpuPanel(Widget, can_focus=True):
    """A GPU at a glance. Enter (at the app) or a click opens its detail view.

    Drawn line by line: most ticks change a few lines of a panel, and only those are redrawn."""

    class Selected(Message):
        def __init__(self, uuid: str) -> None:
            super().__init__()
            self.uuid = uuid

    def __init__(self, uuid: str) -> None:
        super().__init__(classes="gpu-panel")
        self.uuid = uuid
        self.gpu: GpuSnapshot | None = None
        self._history: GpuHistory | None = None
        self.text = Text()
        self._lines: list[Text] = []
        self._strips: dict[int, tuple[Style, int, Strip]] = {}  # line -> (style, width, drawn)
        self._style = Style()

    def show(self, gpu: GpuSnapshot, history: GpuHistory) -> None:
        if self.gpu is None or (gpu.label, gpu.name, gpu.lost) != (self.gpu.label, self.gpu.name, self.gpu.lost):
            # setting a border title repaints the whole panel, even when it is the same title
            # as text: Textual reads a str title as markup, and "[/]" in a name stopped the app
            self.border_title = Content(f"{gpu.label} {gpu.name}")
            self.border_subtitle = "lost" if gpu.lost else ""
            self.set_class(gpu.lost, "lost")
        self.gpu, self._history = gpu, history
        self._rebuild()

    def _rebuild(self) -> None:
        if self.gpu is None or self._history is None:
            return
        width = self.content_size.width
        text = panel_text(self.gpu, self._history, width)
        if text == self.text:  # an unchanged panel is not repainted
            return
        self.text = text
        lines = list(text.split("\n", allow_blank=True))
        for y in range(max(len(lines), len(self._lines))):
            old = self._lines[y] if y < len(self._lines) else None
            new = lines[y] if y < len(lines) else None
            if old is None or new is None or old != new:
                self._strips.pop(y, None)
                self.refresh(Region(0, y, width, 1))
        self._lines = lines

    def on_resize(self, event: Resize) -> None:
        self._strips.clear()
        self._rebuild()

    def on_click(self, event: Click) -> None:
        self.post_message(self.Selected(self.uuid))

    def render_lines(self, crop: Region) -> list[Strip]:
        self._style = self.rich_style  # once per render: it is worked out from every ancestor
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width, style = self.content_size.width, self._style
        if y >= len(self._lines):
            return Strip.blank(width, style)
        cached = self._strips.get(y)
        if cached is not None and cached[0] == style and cached[1] == width:
            return cached[2]
        line = self._lines[y].copy()
        line.truncate(width, overflow="ellipsis")
        line.stylize_before(style)
        strip = Strip(line.render(self.app.console), line.cell_len).extend_cell_length(width, style)
        self._strips[y] = (style, width, strip)
        return strip


def grid_columns(count: int, width: int) -> int:
    """As many columns as fit, then as few as keep the same number of rows (balanced rows)."""
    cols = max(1, min(count, width // MIN_PANEL_WIDTH))
    rows = math.ceil(count / cols)
    return max(1, math.ceil(count / rows))


class GpuGrid(Widget):
    """The panels, in NVML order. When the set of GPUs changes, the panels of those still there
    stay (with the focus, should one have it), those gone go, and new ones take their place."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._order: list[str] = []
        self._panels: dict[str, GpuPanel] = {}

    def show(self, snap: BoxSnapshot, history: BoxHistory) -> None:
        order = [g.uuid for g in snap.gpus]
        if order != self._order:
            self._regrid(order)
        for gpu in snap.gpus:
            self._panels[gpu.uuid].show(gpu, history.gpus[gpu.uuid])

    def _regrid(self, order: list[str]) -> None:
        for uuid, gone in self._panels.items():
            if uuid not in order:
                gone.remove()
        panels: dict[str, GpuPanel] = {}
        last: GpuPanel | None = None
        for uuid in order:
            panel = self._panels.get(uuid)
            if panel is None:
                panel = GpuPanel(uuid)
                if last is not None:
                    self.mount(panel, after=last)
                else:
                    self.mount(panel, before=0) if self.children else self.mount(panel)
            elif last is not None:
                self.move_child(panel, after=last)
            else:
                self.move_child(panel, before=0)
            panels[uuid] = last = panel
        self._order, self._panels = order, panels
        self._fit()

    def panel(self, uuid: str) -> GpuPanel | None:
        return self._panels.get(uuid)

    def on_resize(self, event: Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        if self._order:
            self.styles.grid_size_columns = grid_columns(len(self._order), self.size.width)
