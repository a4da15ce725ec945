"""Body rows of a DataTable drawn straight from their text, with a line cache per row.

DataTable renders every visible cell through Rich again whenever any cell changes (its caches
are keyed by a global update count): with 300 processes that is most of the live view's CPU.
A table whose cells are plain text, one line high, with a row cursor and no fixed rows, columns
or labels, can draw a row as one segment per cell with the styles DataTable would use; a test
holds this to be the same Strip that DataTable draws. Anything else falls back to DataTable.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable


@dataclass(frozen=True)
class _Frame:
    """What every body row of one render shares."""

    base: Style
    even: Style
    odd: Style
    cursor: Style
    cursor_post: Style
    widths: tuple[int, ...]
    width: int
    scroll_x: int
    padding: int
    zebra: bool
    show_cursor: bool


class TextRowsTable(DataTable[Text]):
    """A DataTable that draws body rows from `row_text(key)`: the cells' text, or None to let
    DataTable draw the row, and `row_style(key)`: each cell's own style ("" for none), as
    the cell's Text carries it. `right_aligned` names the columns (by index) that are justified
    right."""

    right_aligned: frozenset[int] = frozenset()

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._frame: _Frame | None = None
        self._row_lines: dict[str, tuple[tuple[object, ...], Strip]] = {}
        self._styles: dict[tuple[int, bool], list[Style]] = {}  # (row index, cursor) -> cell styles

    def row_text(self, key: str) -> tuple[str, ...] | None:
        return None

    def row_style(self, key: str) -> tuple[str, ...] | None:
        return None

    def forget_row(self, key: str) -> None:
        self._row_lines.pop(key, None)

    def render_lines(self, crop: Region) -> list[Strip]:
        frame = self._make_frame()
        if frame != self._frame:
            self._styles.clear()
        self._frame = frame
        return super().render_lines(crop)

    def _make_frame(self) -> _Frame | None:
        if self.fixed_rows or self.fixed_columns or self.cursor_type != "row" or not self.show_header:
            return None
        if self.header_height != 1 or any(row.height != 1 or row.label for row in self.rows.values()):
            return None
        cursor = self.get_component_rich_style("datatable--cursor")
        post = Style.null()
        if self.cursor_foreground_priority == "css":
            post += Style.from_color(color=cursor.color)
        if self.cursor_background_priority == "css":
            post += Style.from_color(bgcolor=cursor.bgcolor)
        return _Frame(
            base=self.rich_style,
            even=self.get_component_styles("datatable--even-row").rich_style,
            odd=self.get_component_styles("datatable--odd-row").rich_style,
            cursor=cursor,
            cursor_post=post,
            widths=tuple(c.get_render_width(self) for c in self.ordered_columns),
            width=self.size.width,
            scroll_x=self.scroll_offset.x,
            padding=self.cell_padding,
            zebra=self.zebra_stripes,
            show_cursor=self.show_cursor,
        )

    def render_line(self, y: int) -> Strip:
        return self._text_row_line(y) or super().render_line(y)

    def _text_row_line(self, y: int) -> Strip | None:
        frame = self._frame
        if frame is None or y < self.header_height:
            return None
        index = y - self.header_height + self.scroll_offset.y
        rows = self.ordered_rows
        if index >= len(rows) or self.hover_coordinate.row == index:
            return None  # past the end, or under the mouse: DataTable knows best
        key = rows[index].key.value
        texts = None if key is None else self.row_text(key)
        if key is None or texts is None or len(texts) != len(frame.widths):
            return None
        cell_styles = self.row_style(key)
        cursor = frame.show_cursor and self.cursor_row == index
        state = (texts, cell_styles, index, cursor, frame)
        cached = self._row_lines.get(key)
        if cached is not None and cached[0] == state:
            return cached[1]
        strip = self._draw(frame, index, texts, cursor, cell_styles)
        self._row_lines[key] = (state, strip)
        return strip

    def _draw(
        self,
        frame: _Frame,
        index: int,
        texts: tuple[str, ...],
        cursor: bool,
        cell_styles: tuple[str, ...] | None = None,
    ) -> Strip:
        styles = self._styles.get((index, cursor))
        if styles is None:
            styles = self._styles[index, cursor] = self._row_styles(frame, index, cursor)
        pad = " " * frame.padding
        segments = []
        for column, (text, width, style) in enumerate(zip(texts, frame.widths, styles, strict=False)):
            room = width - 2 * frame.padding
            if cell_len(text) > room:
                text = set_cell_size(text, room - 1) + "…" if room > 0 else ""
            body = " " * (room - cell_len(text))
            body = body + text if column in self.right_aligned else text + body
            own = cell_styles[column] if cell_styles and column < len(cell_styles) else ""
            if own:
                # DataTable puts a cell's style under the cursor's colours but over the row's,
                # and not on the padding
                inner = self._cell_style(frame, index, column, cursor, own)
                segments += [Segment(pad, style), Segment(body, inner), Segment(pad, style)]
            else:
                segments.append(Segment(pad + body + pad, style))
        remaining = max(0, frame.width - sum(frame.widths))
        segments.append(Segment(" " * remaining, styles[-1]))
        line = Strip(segments).crop(frame.scroll_x, frame.scroll_x + frame.width)
        return line.adjust_cell_length(frame.width, frame.base).simplify()

    @staticmethod
    def _cell_style(frame: _Frame, index: int, column: int, cursor: bool, own: str) -> Style:
        row = (frame.odd if index % 2 else frame.even) if frame.zebra else frame.base
        top = frame.cursor if cursor else Style()
        post = frame.cursor_post if cursor else Style.null()
        return row + Style.from_meta({"row": index, "column": column}) + top + Style.parse(own) + post

    @staticmethod
    def _row_styles(frame: _Frame, index: int, cursor: bool) -> list[Style]:
        """The style of each cell of a row, then of the blank past the last column, as DataTable
        layers them: the row's stripe, the cell's place (for the mouse), the cursor."""
        row = (frame.odd if index % 2 else frame.even) if frame.zebra else frame.base
        top = frame.cursor if cursor else Style()
        post = frame.cursor_post if cursor else Style.null()
        cells = [row + Style.from_meta({"row": index, "column": c}) + top + post for c in range(len(frame.widths))]
        return [*cells, row + top + Style.from_meta({"row": index, "column": 0, "out_of_bounds": True})]
