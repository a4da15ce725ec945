"""Screenshots of the live view, compared with the committed SVGs (`pytest --snapshot-update`).

The simulated box has a fixed clock and the view is stepped with r while paused, so every run
shows exactly the same samples.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.pilot import Pilot

from gpubox.tui.top_app import TopApp
from tests.tui.conftest import sample_exactly, sim

SIZE = (120, 45)
SAMPLES = 6


def app() -> TopApp:
    return TopApp(sim(3, 8), interval=10.0)


async def stepped(pilot: Pilot[int]) -> None:
    assert isinstance(pilot.app, TopApp)
    await sample_exactly(pilot, pilot.app, SAMPLES)


def test_main_screen(snap_compare: Callable[..., bool]) -> None:
    assert snap_compare(app(), terminal_size=SIZE, run_before=stepped)


def test_main_screen_filtered_and_sorted(snap_compare: Callable[..., bool]) -> None:
    async def run_before(pilot: Pilot[int]) -> None:
        await stepped(pilot)
        await pilot.press("s", "s", "slash", *"python", "enter")

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_process_detail(snap_compare: Callable[..., bool]) -> None:
    async def run_before(pilot: Pilot[int]) -> None:
        await stepped(pilot)
        await pilot.press("enter")

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_gpu_detail(snap_compare: Callable[..., bool]) -> None:
    async def run_before(pilot: Pilot[int]) -> None:
        await stepped(pilot)
        pilot.app.query("GpuPanel").first().focus()
        await pilot.press("d")

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_kill_dialog(snap_compare: Callable[..., bool]) -> None:
    async def run_before(pilot: Pilot[int]) -> None:
        await stepped(pilot)
        await pilot.press("k")

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)


def test_loader_wait_coloured_above_the_threshold(snap_compare: Callable[..., bool]) -> None:
    """The starving trainer's loader wait in red, once the cursor has left its row."""

    async def run_before(pilot: Pilot[int]) -> None:
        await stepped(pilot)
        await pilot.press("down")

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)
