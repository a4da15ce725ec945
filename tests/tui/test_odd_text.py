"""Text gpubox does not choose (anyone's command line) shown as text: on one line, with no
control character reaching the terminal."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console
from textual.content import Content
from textual.widgets._toast import Toast

from gpubox.cli.top_table import render_tables
from gpubox.telemetry.model import BoxSnapshot
from gpubox.telemetry.simulated import SimulatedBackend
from gpubox.tui.detail import ProcessDetail
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import NOW, settle, wait_until

# a multi-line `python -c` script, and a process that clears the screen and rings the bell
HOSTILE = "python -c import os\nos.system('x') \x1b[2J\x1b[31mred\x07"
ESCAPED = "python -c import os\\nos.system('x') \\x1b[2J\\x1b[31mred\\x07"


class HostileBackend(SimulatedBackend):
    def __init__(self) -> None:
        super().__init__(gpus=1, processes=2, clock=lambda: NOW)

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        first = dataclasses.replace(snap.processes[0], command=HOSTILE)
        return dataclasses.replace(snap, processes=(first, *snap.processes[1:]))


def _controls(text: str) -> set[str]:
    return {c for c in text if not c.isprintable()}


async def test_a_command_with_control_characters_stays_on_one_line_in_the_live_view() -> None:
    app = TopApp(HostileBackend(), interval=0.05)
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot, app, 2)
        table = app.table
        drawn = ["".join(s.text for s in table.render_line(y)) for y in range(1, 1 + table.row_count)]
        assert not _controls("".join(drawn))
        assert any(ESCAPED in line for line in drawn)
        await pilot.press("home", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ProcessDetail), "the detail")
        body = str(app.screen.query_one("#detail-body").render())
        assert ESCAPED in body and not _controls(body.replace("\n", ""))
        await pilot.press("escape", "k")
        await pilot.pause()
        dialog = str(app.screen.query_one(".dialog-command").render())
        assert dialog.startswith("python -c import os\\n") and not _controls(dialog)


def test_a_command_with_control_characters_stays_on_one_line_in_the_once_table() -> None:
    out = io.StringIO()
    render_tables(HostileBackend().sample(), Console(file=out, width=300, color_system=None), 0.2)
    assert ESCAPED in out.getvalue()
    assert not _controls(out.getvalue().replace("\n", ""))


class MarkupBackend(SimulatedBackend):
    """Names and advice holding what Textual would read as markup."""

    def __init__(self) -> None:
        super().__init__(gpus=2, processes=2, clock=lambda: NOW)

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        gpu = dataclasses.replace(snap.gpus[0], name="GPU [/] [b]x")
        return dataclasses.replace(snap, gpus=(gpu, *snap.gpus[1:]), notices=("py-spy at /opt/[/]/py-spy",))


async def test_text_that_looks_like_markup_is_shown_as_it_is() -> None:
    app = TopApp(MarkupBackend(), interval=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, 2)
        # the toasts the notifications are drawn as (a headless run draws none itself)
        toasts = [Toast(n) for n in app._notifications]
        await app.screen.mount_all(toasts)
        drawn = [t.render().plain for t in toasts]
        assert any("py-spy at /opt/[/]/py-spy" in t for t in drawn), drawn
        panel = app.grid.panel(app.snapshot.gpus[0].uuid) if app.snapshot else None
        assert panel is not None and panel.border_title is not None
        assert Content.from_markup(panel.border_title).plain == "0 GPU [/] [b]x"  # as drawn
        await pilot.press("tab", "enter")  # the detail view of that GPU
        await pilot.pause()
        assert "GPU [/] [b]x" in str(app.screen.query_one("#detail-title").render())
