"""The GPU processes of every GPU in one table, one row per (pid, GPU uuid), updated in place.

Each tick only cells whose text changed are written, rows that left are removed and new ones
added; the table is never cleared and refilled, which costs three times the CPU on big tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.console import JustifyMethod
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.coordinate import Coordinate
from textual.events import Resize
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from gpubox import format as fmt
from gpubox.column_fit import PROCESS_DROP_ORDER, fit_columns
from gpubox.telemetry.loader_wait import wait_level
from gpubox.telemetry.model import BoxSnapshot, ProcessSnapshot
from gpubox.tui.process_filter import ProcessFilter
from gpubox.tui.table_lines import TextRowsTable

SortValue = float | str | None
DEFAULT_LOADER_THRESHOLD = 0.2


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int | None  # None: as wide as the widest cell (the command)
    numeric: bool  # sorted largest first
    text: Callable[[ProcessSnapshot, str, float], str]  # (process, GPU label, taken_at) -> cell
    value: Callable[[ProcessSnapshot, str], SortValue]
    style: Callable[[ProcessSnapshot, float], str] | None = None  # (process, loader threshold) -> style


def loader_text(p: ProcessSnapshot) -> str:
    """The loader wait cell: "~" marks a figure from stack samples, which is approximate."""
    text = fmt.fraction_pct(p.loader_wait)
    return "~" + text if p.loader_wait_source == "sampled" and p.loader_wait is not None else text


def command_text(p: ProcessSnapshot) -> str:
    """The command on one line, its control characters shown escaped: anyone's argv (a
    `python -c` script, an escape sequence) must not break the row or reach the terminal."""
    return fmt.one_line(p.command or fmt.DASH)


LOADER_STYLES = {"high": "yellow", "severe": "bold red"}


def loader_style(wait: float | None, threshold: float) -> str:
    level = wait_level(wait, threshold)
    return "" if level is None else LOADER_STYLES[level]


COLUMNS = (
    Column("pid", "PID", 7, False, lambda p, g, t: str(p.pid), lambda p, g: p.pid),
    Column("gpu", "GPU", 5, False, lambda p, g, t: g, lambda p, g: g),
    Column("user", "User", 9, False, lambda p, g, t: p.user or fmt.DASH, lambda p, g: p.user),
    Column("sm", "SM %", 6, True, lambda p, g, t: fmt.pct(p.sm_util), lambda p, g: p.sm_util),
    Column("mem", "GPU mem", 9, True, lambda p, g, t: fmt.size(p.gpu_mem_bytes), lambda p, g: p.gpu_mem_bytes),
    Column("cpu", "CPU %", 7, True, lambda p, g, t: fmt.pct(p.cpu_percent), lambda p, g: p.cpu_percent),
    Column("rss", "RSS", 8, True, lambda p, g, t: fmt.size(p.rss_bytes), lambda p, g: p.rss_bytes),
    Column(
        "loader",
        "Loader wait",
        11,
        True,
        lambda p, g, t: loader_text(p),
        lambda p, g: p.loader_wait,
        lambda p, threshold: loader_style(p.loader_wait, threshold),
    ),
    # sorted by the start time, negated, so that "largest first" means the longest uptime first
    Column(
        "uptime",
        "Uptime",
        8,
        True,
        lambda p, g, t: fmt.uptime(p.start_time, t),
        lambda p, g: None if p.start_time is None else -p.start_time,
    ),
    Column("job", "Job", 11, False, lambda p, g, t: fmt.job(p.job_id, p.job_kind), lambda p, g: p.job_id),
    Column("command", "Command", None, False, lambda p, g, t: command_text(p), lambda p, g: p.command),
)
MIN_COMMAND_WIDTH = 12  # at 120 columns the command keeps 13: the table fits without scrolling
DROP_ORDER = PROCESS_DROP_ORDER  # on a narrow terminal, the least needed first (README, "gpubox top")
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
_BY_KEY = {c.key: c for c in COLUMNS}
_JUSTIFY: dict[str, JustifyMethod] = {c.key: "right" if c.numeric or c.key == "pid" else "left" for c in COLUMNS}


def _width(col: Column) -> int | None:
    return None if col.width is None else max(col.width, len(col.label) + 2)  # room for the sort arrow


def _right_aligned(cols: tuple[Column, ...]) -> frozenset[int]:
    return frozenset(n for n, c in enumerate(cols) if _JUSTIFY[c.key] == "right")


def row_key(proc: ProcessSnapshot) -> str:
    return f"{proc.pid}@{proc.gpu_uuid}"


class ProcessTable(TextRowsTable):
    """Sorted by one column (numbers largest first, text A to Z; `reverse` flips), filtered by a
    ProcessFilter. `processes` maps each row key to the process it shows."""

    right_aligned = _right_aligned(COLUMNS)
    # Enter opens the detail at once, as d does. DataTable's Enter posts RowSelected, which is
    # handled only after the keys read with it: "Enter, down, k" moved the cursor, opened a kill
    # dialog for the next process, and then the detail of that one on top of the dialog.
    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "app.detail", "Detail", show=False)]

    def __init__(self, id: str | None = None, loader_threshold: float = DEFAULT_LOADER_THRESHOLD) -> None:
        super().__init__(id=id)
        self.loader_threshold = loader_threshold  # loader wait above it is coloured
        self.processes: dict[str, ProcessSnapshot] = {}
        self.total = 0  # processes before the filter
        self.sort_column = "gpu"
        self.reverse = False
        self.filter = ProcessFilter()
        self._labels: dict[str, str] = {}  # row key -> GPU label
        self._texts: dict[str, tuple[str, ...]] = {}  # row key -> the text of each cell now shown
        self._cell_styles: dict[str, tuple[str, ...]] = {}  # row key -> the style of each cell now shown
        self._order: list[str] = []
        self._snap: BoxSnapshot | None = None
        self._room = MIN_COMMAND_WIDTH  # the command column's width, for this show
        self._cols: tuple[Column, ...] = COLUMNS  # the columns shown: those that fit the width

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for col in self._cols:
            self.add_column(col.label, width=_width(col), key=col.key)
        self.right_aligned = _right_aligned(self._cols)
        self._label_headers()

    def _fitting(self) -> tuple[Column, ...]:
        if not self.size.width:
            return self._cols  # not laid out yet
        pad = 2 * self.cell_padding
        widths = {c.key: (_width(c) or MIN_COMMAND_WIDTH) + pad for c in COLUMNS}
        room = self.size.width - self.styles.scrollbar_size_vertical
        return tuple(_BY_KEY[k] for k in fit_columns(widths, DROP_ORDER, room))

    def _refit(self) -> None:
        """Show the columns that fit the width now. Rare (a resize across a column's width), so
        the table is simply rebuilt; show() then adds every row again."""
        cols = self._fitting()
        if cols == self._cols:
            return
        self._cols = cols
        for key in self.processes:
            self.forget_row(key)
        self.clear(columns=True)
        for rows in (self.processes, self._texts, self._cell_styles, self._labels):
            rows.clear()
        self._order = []
        self._add_columns()

    def show(self, snap: BoxSnapshot) -> None:
        self._snap = snap
        labels = {g.uuid: g.label for g in snap.gpus}
        wanted: dict[str, tuple[ProcessSnapshot, str]] = {}
        for proc in snap.processes:
            label = labels.get(proc.gpu_uuid, str(proc.gpu_index))
            if self.filter.matches(proc, label):
                wanted[row_key(proc)] = (proc, label)
        self.total = len(snap.processes)
        cursor = self._cursor_key()
        self._refit()
        self._room = self._command_width
        for key in [k for k in self.processes if k not in wanted]:
            self.remove_row(key)
            self.forget_row(key)
            del self.processes[key], self._texts[key], self._cell_styles[key], self._labels[key]
        for key, (proc, label) in wanted.items():
            texts = self._row_texts(proc, label, snap.taken_at)
            styles = tuple("" if c.style is None else c.style(proc, self.loader_threshold) for c in self._cols)
            old, old_styles = self._texts.get(key), self._cell_styles.get(key)
            if old is None or old_styles is None:
                cells = (self._cell(c, t, st) for c, t, st in zip(self._cols, texts, styles, strict=True))
                self.add_row(*cells, key=key)
            elif old != texts or old_styles != styles:
                cols = self._cols
                for col, text, style, was, was_style in zip(cols, texts, styles, old, old_styles, strict=True):
                    if text != was or style != was_style:
                        # the command column is sized to its cells; the others have fixed widths
                        cell = self._cell(col, text, style)
                        self.update_cell(key, col.key, cell, update_width=col.width is None)
            self.processes[key], self._texts[key], self._labels[key] = proc, texts, label
            self._cell_styles[key] = styles
        self._resort(cursor)

    def _row_texts(self, proc: ProcessSnapshot, label: str, taken_at: float) -> tuple[str, ...]:
        texts = [col.text(proc, label, taken_at) for col in self._cols]
        command, room = texts[-1], self._room
        if cell_len(command) > room:  # cut here rather than scroll sideways; the detail view has it all
            texts[-1] = set_cell_size(command, room - 1) + "…"
        return tuple(texts)

    @property
    def _command_width(self) -> int:
        fixed = sum(c.width + 2 * self.cell_padding for c in self.columns.values() if not c.auto_width)
        scrollbar = self.styles.scrollbar_size_vertical
        return max(MIN_COMMAND_WIDTH, self.size.width - fixed - 2 * self.cell_padding - scrollbar)

    def on_resize(self, event: Resize) -> None:
        if self._snap is not None:
            self.show(self._snap)  # refit the columns and recut the commands to the new width
        else:
            self._refit()

    def row_text(self, key: str) -> tuple[str, ...] | None:
        return self._texts.get(key)

    def row_style(self, key: str) -> tuple[str, ...] | None:
        return self._cell_styles.get(key)

    @staticmethod
    def _cell(col: Column, text: str, style: str = "") -> Text:
        return Text(text, style=style, justify=_JUSTIFY[col.key], no_wrap=True, overflow="ellipsis")

    def _cursor_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0)).row_key.value

    def _row_order(self) -> list[str]:
        col = _BY_KEY[self.sort_column]

        def value(key: str) -> Any:
            return col.value(self.processes[key], self._labels[key])

        procs, labels = self.processes, self._labels
        base = sorted(procs, key=lambda k: (procs[k].gpu_index, labels[k], procs[k].pid))
        present = [k for k in base if value(k) is not None]
        missing = [k for k in base if value(k) is None]
        present.sort(key=value, reverse=col.numeric != self.reverse)  # a stable sort: ties keep GPU, pid order
        return present + missing  # a row without the figure sorts last either way

    def _resort(self, cursor: str | None) -> None:
        order = self._row_order()
        if order == self._order:
            return
        self._order = order
        # DataTable.sort hands the key function cell values, not row keys: each row's PID cell is
        # its own object (the GPU column, which with the PID would name a row, may be hidden).
        rank = {id(self.get_cell(k, "pid")): n for n, k in enumerate(order)}
        self.sort("pid", key=lambda cell: rank[id(cell)])
        if cursor in self.processes:  # the cursor stays on its process, wherever that moved
            self.move_cursor(row=self.get_row_index(cursor), scroll=False)

    def _label_headers(self) -> None:
        arrow = " ▼" if _BY_KEY[self.sort_column].numeric != self.reverse else " ▲"
        for col in self._cols:
            self.columns[ColumnKey(col.key)].label = Text(col.label + (arrow if col.key == self.sort_column else ""))
        self.refresh()

    def sort_by(self, column: str, reverse: bool = False) -> None:
        self.sort_column, self.reverse = column, reverse
        self._label_headers()
        self._resort(self._cursor_key())

    def next_sort_column(self) -> None:
        """The next column shown: a column hidden on a narrow terminal is skipped."""
        start = COLUMN_KEYS.index(self.sort_column)
        shown = {c.key for c in self._cols}
        after = (COLUMN_KEYS[(start + n) % len(COLUMN_KEYS)] for n in range(1, len(COLUMN_KEYS) + 1))
        self.sort_by(next(k for k in after if k in shown))

    def reverse_sort(self) -> None:
        self.sort_by(self.sort_column, not self.reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        self.sort_by(key, not self.reverse if key == self.sort_column else False)
        event.stop()

    def set_filter(self, flt: ProcessFilter) -> None:
        if flt == self.filter:
            return
        self.filter = flt
        if self._snap is not None:
            self.show(self._snap)

    def sort_label(self) -> str:
        col = _BY_KEY[self.sort_column]
        return f"{col.label} {'▼' if col.numeric != self.reverse else '▲'}"

    def process_at_cursor(self) -> ProcessSnapshot | None:
        key = self._cursor_key()
        return None if key is None else self.processes.get(key)
