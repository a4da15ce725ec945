"""The process table and the footer fit the terminal's width, from 60 to 250 columns: the least
needed columns give way, no figure is cut, and "? Help" is always in sight."""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from textual.pilot import Pilot
from textual.widgets import Input

from gpubox.tui.process_table import COLUMNS, DROP_ORDER, ProcessTable
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import settle, sim

KEPT = ("pid", "sm", "mem", "loader", "command")


def shown(table: ProcessTable) -> list[str]:
    return [str(c.key.value) for c in table.ordered_columns]


def assert_fits(app: TopApp, width: int) -> None:
    table = app.table
    assert app.size.width == width
    used = sum(c.get_render_width(table) for c in table.ordered_columns)
    assert used + table.styles.scrollbar_size_vertical <= table.size.width <= width
    assert table.max_scroll_x == 0  # no sideways scroll
    assert set(KEPT) <= set(shown(table))
    by_key = {c.key: c for c in COLUMNS}
    for y in range(1, min(table.row_count, table.size.height - 1) + 1):
        line = table.render_line(y).text
        assert cell_len(line) == table.size.width
        key = table.ordered_rows[y - 1 + table.scroll_offset.y].key.value
        assert key is not None
        proc, texts = table.processes[key], table.row_text(key)
        assert texts is not None
        for name, text in zip(shown(table)[:-1], texts[:-1], strict=True):
            assert "…" not in text
            whole = by_key[name].text(proc, text if name == "gpu" else "", 0.0)
            if name in {"pid", "sm", "mem", "loader", "cpu", "rss"}:
                assert text == whole and text in line  # the whole figure, on the screen
        assert texts[-1] in line  # the command, cut with an ellipsis if it must be


def footer_help_right_edge(app: TopApp) -> int:
    hints = [w for w in app.screen.query("FooterKey") if getattr(w, "action", "") == "help"]
    assert hints, "no ? Help in the footer"
    return hints[0].region.right


async def still(pilot: Pilot[int], app: TopApp) -> None:
    await settle(pilot, app, 2)


async def test_at_80_columns_the_least_needed_give_way_and_come_back_when_widened() -> None:
    app = TopApp(sim(4, 12), interval=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await still(pilot, app)
        assert_fits(app, 80)
        assert "uptime" not in shown(app.table)  # the first to go
        assert 0 < footer_help_right_edge(app) <= 80
        await pilot.resize_terminal(160, 30)
        await pilot.pause()
        await pilot.pause()
        assert shown(app.table) == [c.key for c in COLUMNS]  # all back
        assert_fits(app, 160)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.pause()
        assert_fits(app, 80)


@pytest.mark.parametrize("width", [60, 70, 100, 120, 250])
async def test_every_width_fits(width: int) -> None:
    app = TopApp(sim(2, 8), interval=0.05)
    async with app.run_test(size=(width, 30)) as pilot:
        await still(pilot, app)
        assert_fits(app, width)
        assert 0 < footer_help_right_edge(app) <= width
        kept = set(shown(app.table))
        dropped = [k for k in DROP_ORDER if k not in kept]
        assert dropped == list(DROP_ORDER[: len(dropped)])  # in the order the README gives


async def test_the_cursor_stays_on_its_process_when_columns_change() -> None:
    app = TopApp(sim(2, 8), interval=0.05)
    async with app.run_test(size=(160, 30)) as pilot:
        await still(pilot, app)
        await pilot.press("down", "down")
        before = app.table.process_at_cursor()
        await pilot.resize_terminal(70, 30)
        await pilot.pause()
        await pilot.pause()
        assert "user" not in shown(app.table)
        after = app.table.process_at_cursor()
        assert before is not None and after is not None and after.key == before.key


async def test_while_filtering_the_footer_shows_the_filter_keys_not_the_typed_ones() -> None:
    """In the filter box "+" and "-" are typed, not "Faster" and "Slower"; Enter applies the
    filter and Escape clears it."""
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 30)) as pilot:
        await still(pilot, app)

        def hints() -> set[str]:
            return {str(getattr(w, "description", "")) for w in app.screen.query("FooterKey")}

        assert {"Faster", "Slower"} <= hints()
        await pilot.press("slash")
        await pilot.pause()  # (`still` would type its "p" into the box)
        assert {"Apply", "Clear"} <= hints() and not {"Faster", "Slower"} & hints()
        await pilot.press("a", "minus", "b", "plus")
        await pilot.pause()
        assert app.query_one("#filter", Input).value == "a-b+"
        await pilot.press("escape")
        await pilot.pause()
        assert {"Faster", "Slower"} <= hints() and not {"Apply", "Clear"} & hints()
