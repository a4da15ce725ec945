"""The live view in an 80x24 terminal, the size many still work in."""

from __future__ import annotations

from textual.widget import Widget

from gpubox.tui.dialogs import HelpScreen
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import sim, wait_until

SMALL = (80, 24)


async def test_the_whole_help_can_be_read_with_the_keys() -> None:
    app = TopApp(sim(8, 12), interval=0.05)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        box = app.screen.query_one("#help-box", Widget)
        assert box.max_scroll_y > 0  # it does not fit: the figures are below the fold
        await pilot.press("end")
        await wait_until(pilot, lambda: box.scroll_y == box.max_scroll_y, "the end of the help")
        await pilot.press("home")
        await wait_until(pilot, lambda: box.scroll_y == 0, "the top of the help")
        await pilot.press("q")
        assert not isinstance(app.screen, HelpScreen) and app.is_running
