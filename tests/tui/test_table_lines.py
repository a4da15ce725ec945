"""The process table draws its body rows itself (for speed); they must be exactly DataTable's."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpubox.tui.table_lines import TextRowsTable


class Table(TextRowsTable):
    right_aligned = frozenset({1})

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, tuple[str, ...]] = {}
        self.cell_styles: dict[str, tuple[str, ...]] = {}

    def row_text(self, key: str) -> tuple[str, ...] | None:
        return self.texts.get(key)

    def row_style(self, key: str) -> tuple[str, ...] | None:
        return self.cell_styles.get(key)


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Table()


def rows(n: int) -> list[tuple[str, ...]]:
    commands = ("python train.py ", "トレーニング データ ", "torchrun ")
    return [
        (str(1000 + i), "123456789%" if i % 3 == 0 else f"{i * 7}%", commands[i % 3] + "x" * (5 * i)) for i in range(n)
    ]


CELL_STYLES = ("", "yellow", "bold red")  # as the loader wait column colours its cells


async def fill(pilot: Pilot[None], styled: bool = False) -> Table:
    table = pilot.app.query_one(Table)
    table.add_column("PID", width=6, key="pid")
    table.add_column("SM %", width=6, key="sm")
    table.add_column("Command", key="cmd")
    for n, texts in enumerate(rows(20)):
        table.texts[str(n)] = texts
        styles = ("", CELL_STYLES[n % 3], "") if styled else ("", "", "")
        if styled:
            table.cell_styles[str(n)] = styles
        justify = ("left", "right", "left")
        cells = [
            Text(t, style=st, no_wrap=True, overflow="ellipsis", justify=j)
            for t, st, j in zip(texts, styles, justify, strict=True)
        ]
        table.add_row(*cells, key=str(n))
    await pilot.pause()
    return table


async def same_as_datatable(pilot: Pilot[None], table: Table) -> int:
    """How many body lines were drawn by the fast path; fails on the first that differs."""
    await pilot.pause()
    table.render_lines(table.region.reset_offset)  # sets up what a render shares
    drawn = 0
    for y in range(1, table.size.height):
        fast = table._text_row_line(y)
        if fast is None:
            continue
        assert list(fast) == list(DataTable.render_line(table, y)), f"line {y} differs"
        drawn += 1
    return drawn


async def test_rows_drawn_from_text_are_datatables_rows() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 12)) as pilot:
        table = await fill(pilot)
        table.focus()
        # 11 rows show; the first is under the mouse (the hover coordinate starts there), and
        # DataTable draws a hovered row itself
        assert await same_as_datatable(pilot, table) == 10
        await pilot.press("down", "down")  # the cursor on another row
        assert await same_as_datatable(pilot, table) == 10
        app.set_focus(None)  # a blurred cursor has other colours
        assert await same_as_datatable(pilot, table) == 10
        table.focus()
        table.scroll_to(x=7, y=4, animate=False)  # scrolled both ways
        await pilot.pause()
        assert table.scroll_offset.x == 7 and table.scroll_offset.y == 4
        assert await same_as_datatable(pilot, table) == 11


async def test_rows_it_cannot_draw_are_left_to_datatable() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 12)) as pilot:
        table = await fill(pilot)
        del table.texts["3"]
        table.cursor_type = "cell"
        await pilot.pause()
        assert await same_as_datatable(pilot, table) == 0
        table.cursor_type = "row"
        await pilot.pause()
        assert await same_as_datatable(pilot, table) == 9  # not the hovered row, nor the one without text


async def test_rows_with_coloured_cells_are_datatables_rows() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 12)) as pilot:
        table = await fill(pilot, styled=True)
        table.focus()
        assert await same_as_datatable(pilot, table) == 10
        for _ in range(3):  # the cursor on a yellow, then a red cell
            await pilot.press("down")
            assert await same_as_datatable(pilot, table) == 10
        app.set_focus(None)
        assert await same_as_datatable(pilot, table) == 10
        table.focus()
        table.scroll_to(x=3, y=2, animate=False)
        await pilot.pause()
        assert await same_as_datatable(pilot, table) == 11
