"""Acting from the live view: signals, detail views, help; and how odd GPUs look."""

from __future__ import annotations

import dataclasses
import signal

import pytest
from textual import events
from textual.widgets import Input

from gpubox.telemetry.model import BoxSnapshot, ProcessSnapshot
from gpubox.telemetry.simulated import SimulatedBackend
from gpubox.tui.detail import GpuDetail, ProcessDetail
from gpubox.tui.dialogs import HelpScreen, KillDialog
from gpubox.tui.gpu_panel import GpuPanel
from gpubox.tui.process_table import row_key
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import NOW, LostGpuBackend, MigBackend, keys_in_one_read, settle, sim, wait_until

SIZE = (120, 40)


def cursor_process(app: TopApp) -> ProcessSnapshot:
    """The process under the table's cursor: the one a k or Enter acts on."""
    target = app.table.process_at_cursor()
    assert target is not None
    return target


def panels(app: TopApp) -> dict[str, GpuPanel]:
    return {p.gpu.label: p for p in app.query(GpuPanel).results() if p.gpu is not None}


async def test_kill_then_confirm_sends_sigterm_and_the_row_goes() -> None:
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 2, "two refreshes")
        target = cursor_process(app)
        await pilot.press("k")
        assert isinstance(app.screen, KillDialog)
        await pilot.press("enter")  # the SIGTERM button has the focus
        await wait_until(pilot, lambda: row_key(target) not in app.table.processes, "the row to go")
        assert backend.signals == [(target.pid, signal.SIGTERM)]
        assert app.table.row_count == 5


async def test_kill_then_sigkill_is_the_second_choice() -> None:
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 1, "a refresh")
        await pilot.press("down")
        target = cursor_process(app)
        await pilot.press("k", "x")
        await wait_until(pilot, lambda: backend.signals != [], "the signal")
        assert backend.signals == [(target.pid, signal.SIGKILL)]


@pytest.mark.parametrize("cancel", ["escape", "n", "q"])
async def test_kill_then_cancel_leaves_the_process(cancel: str) -> None:
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 1, "a refresh")
        await pilot.press("k")
        assert isinstance(app.screen, KillDialog)
        await pilot.press(cancel)
        assert app.is_running
        assert not isinstance(app.screen, KillDialog)
        seen = app.refreshes
        await wait_until(pilot, lambda: app.refreshes >= seen + 2, "two more refreshes")
        assert backend.signals == []
        assert app.table.row_count == 6


class RefusingBackend(SimulatedBackend):
    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        raise PermissionError(f"pid {pid} belongs to another user")


@pytest.mark.parametrize("after", ["escape", "n", "x"])
async def test_keys_read_with_the_confirming_enter_act_after_it(after: str) -> None:
    # Enter confirms, and a key read with it (Esc, typed to go back, n, x) comes after: it must not
    # cancel or change the signal chosen, and the press must not close the dialog a second time
    # (which stopped the app).
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        target = cursor_process(app)
        keys_in_one_read(app, "k", "enter", after)
        await wait_until(pilot, lambda: backend.signals != [], f"the signal, with {after} after Enter")
        await pilot.pause(0.2)  # anything still on its way
        assert backend.signals == [(target.pid, signal.SIGTERM)]
        assert len(app.screen_stack) == 1


@pytest.mark.parametrize(("tabs", "sent"), [(["tab"], [signal.SIGKILL]), (["tab", "tab"], []), (["shift+tab"], [])])
async def test_tab_chooses_in_the_kill_dialog(tabs: list[str], sent: list[int]) -> None:
    # Tab moves between SIGTERM, SIGKILL and Cancel, and Enter presses the one chosen, even when
    # the Tabs came in one read with "k" (the dialog's first focus must not take it back).
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        target = cursor_process(app)
        keys_in_one_read(app, "k", *tabs)
        await wait_until(pilot, lambda: isinstance(app.screen, KillDialog), "the kill dialog")
        await pilot.pause(0.2)  # anything still on its way
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(backend.signals) >= len(sent), "the signal chosen")
        await pilot.pause(0.2)  # a signal not chosen would be on its way
        assert not isinstance(app.screen, KillDialog)
        assert backend.signals == [(target.pid, sig) for sig in sent]


async def test_a_key_read_as_the_view_closes_is_dropped() -> None:
    # Keys still on their way when the last screen is gone (q, then more typed) had no screen to
    # be checked against: ScreenStackError, a traceback as gpubox top quit.
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
    assert not app.screen_stack
    await app._on_key(events.Key("s", "s"))  # where a key sent back up from the closing screen lands


@pytest.mark.parametrize(("opened_by", "closed_by"), [("d", "escape"), ("question_mark", "escape"), ("k", "n")])
async def test_keys_read_with_the_key_that_closes_a_screen_act_on_the_main_one(opened_by: str, closed_by: str) -> None:
    # Esc, and "/user:kate" typed right after it (fast, or over a slow link): the keys were sent to
    # the screen being closed, and reached the main one as bare keys. "/" was lost, s sorted, k
    # opened the kill dialog and the t of "kate" sent SIGTERM. They must filter, as typed.
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        await pilot.press(opened_by)
        assert len(app.screen_stack) == 2
        typed = "user:kate"
        keys_in_one_read(app, closed_by, "/", *typed)
        box = app.query_one("#filter", Input)
        await wait_until(pilot, lambda: box.value == typed or len(app.screen_stack) > 1, "the text in the box")
        await pilot.pause(0.2)  # anything still on its way
        assert box.value == typed
        assert len(app.screen_stack) == 1 and app.focused is box
        assert app.table.sort_column == "gpu"
        assert backend.signals == []


async def test_a_refused_signal_is_a_notification_not_a_crash() -> None:
    app = TopApp(RefusingBackend(gpus=2, processes=6, clock=lambda: NOW), interval=0.05)
    notes: list[str] = []
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        real_notify = app.notify
        app.notify = lambda message, **kw: (notes.append(str(message)), real_notify(message, **kw))[1]  # type: ignore[method-assign]
        await wait_until(pilot, lambda: app.refreshes >= 1, "a refresh")
        await pilot.press("k", "enter")
        await wait_until(pilot, lambda: bool(notes), "the notification")
        assert "could not send SIGTERM" in notes[0] and "another user" in notes[0]
        seen = app.refreshes
        await wait_until(pilot, lambda: app.refreshes > seen, "sampling to go on")
        assert app.table.row_count == 6


async def test_enter_opens_the_detail_of_a_process_and_escape_closes_it() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, app, 3)
        target = cursor_process(app)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, ProcessDetail) and screen.key == target.key
        body = str(screen.query_one("#detail-body").render())
        assert "SM %" in body and "GPU memory" in body and "loader wait" in body
        assert target.command is not None and target.command in body
        assert target.loader_wait_source == "probe"  # the demo's starving trainer
        assert "loader wait (probe)" in body and "batches/s (probe)" in body
        await pilot.press("escape")
        assert not isinstance(app.screen, ProcessDetail)


async def test_the_detail_of_an_unmeasured_process_says_so() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, app, 3)
        await pilot.press("down")
        target = app.table.process_at_cursor()
        assert target is not None and target.loader_wait_source is None
        await pilot.press("enter")
        body = str(app.screen.query_one("#detail-body").render())
        assert "loader wait  – not measured" in body  # unknown, and says so
        assert "batches/s" not in body


async def test_the_detail_of_a_gpu_follows_the_samples() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 2, "two refreshes")
        panels(app)["1"].focus()
        await pilot.press("d")
        screen = app.screen
        assert isinstance(screen, GpuDetail)
        title = str(screen.query_one("#detail-title").render())
        assert title.startswith("GPU 1  NVIDIA GeForce RTX 4090")
        seen = app.refreshes
        await wait_until(pilot, lambda: app.refreshes >= seen + 2, "two more refreshes")
        body = str(screen.query_one("#detail-body").render())
        assert "busy (no GPM: not occupancy)" in body
        assert "SM occupancy  – n/a: no GPM" in body
        assert "PCIe RX" in body and "processes (3)" in body


async def test_enter_on_a_panel_opens_its_detail() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, app, 2)
        await pilot.press("tab")  # from the table to the first panel
        assert isinstance(app.focused, GpuPanel) and app.focused.uuid == app.snapshot.gpus[0].uuid  # type: ignore[union-attr]
        await pilot.press("enter")
        assert isinstance(app.screen, GpuDetail) and app.screen.uuid == app.snapshot.gpus[0].uuid  # type: ignore[union-attr]
        await pilot.press("escape")
        assert not isinstance(app.screen, GpuDetail)


async def test_clicking_a_panel_opens_its_detail() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, app, 2)
        await pilot.click(GpuPanel, offset=(4, 3))
        await wait_until(pilot, lambda: isinstance(app.screen, GpuDetail), "the GPU detail")


async def test_kill_from_a_process_detail() -> None:
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 1, "a refresh")
        await pilot.press("end", "enter")
        screen = app.screen
        assert isinstance(screen, ProcessDetail)
        await pilot.press("k", "t")
        await wait_until(pilot, lambda: backend.signals != [], "the signal")
        assert backend.signals == [(screen.key[0], signal.SIGTERM)]
        await wait_until(pilot, lambda: "(exited)" in str(screen.query_one("#detail-title").render()), "exited")


async def test_keys_read_with_enter_act_in_the_detail_it_opens() -> None:
    # Typed fast or over a slow link, Enter and the keys after it arrive in one read. The detail
    # must open before they act: "down" scrolls it rather than moving the table's cursor, and k
    # asks about the process shown, not the next one, and opens over the detail, not under it.
    backend = sim(2, 6)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        target = cursor_process(app)
        keys_in_one_read(app, "enter", "down", "k")
        await wait_until(pilot, lambda: any(isinstance(s, KillDialog) for s in app.screen_stack), "the kill dialog")
        await pilot.pause(0.2)  # anything still on its way
        assert len(app.screen_stack) == 3
        under, dialog = app.screen_stack[1:]
        assert isinstance(dialog, KillDialog) and dialog.proc.key == target.key
        assert isinstance(under, ProcessDetail) and under.key == target.key
        assert app.table.process_at_cursor() == target


@pytest.mark.parametrize("close", ["escape", "question_mark", "q"])
async def test_question_mark_shows_the_keys(close: str) -> None:
    app = TopApp(sim(), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("k", "s")  # keys of the main screen do nothing under a dialog
        assert isinstance(app.screen, HelpScreen)
        await pilot.press(close)
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running


async def test_a_lost_gpu_shows_as_lost() -> None:
    app = TopApp(LostGpuBackend(gpus=2, processes=6, clock=lambda: NOW), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        lost = panels(app)["1"]
        assert lost.has_class("lost")
        assert lost.border_subtitle == "lost"
        assert "GPU LOST" in lost.text.plain
        assert "GPU LOST" not in panels(app)["0"].text.plain


async def test_mig_instances_get_their_own_panels() -> None:
    app = TopApp(MigBackend(gpus=2, processes=6, clock=lambda: NOW), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        assert set(panels(app)) == {"0/1", "0/2", "1"}
        assert str(panels(app)["0/1"].border_title).startswith("0/1 ")
        assert {str(c) for c in app.table.get_column("gpu")} == {"0/1", "1"}
        await pilot.press("slash", *"gpu:0", "enter")  # a GPU's index names its MIG instances too
        assert {str(c) for c in app.table.get_column("gpu")} == {"0/1"}


async def test_without_gpm_occupancy_is_a_dash_with_a_reason() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 3)
        no_gpm = panels(app)["1"].text.plain
        assert "occupancy – n/a: no GPM" in no_gpm
        assert "occupancy 0%" not in no_gpm
        assert "occupancy – " not in panels(app)["0"].text.plain


@pytest.mark.parametrize("color", [True, False])
async def test_color_setting_reaches_textual(color: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")  # the config has already decided against it when color is True
    app = TopApp(sim(), interval=0.05, color=color)
    async with app.run_test(size=SIZE):
        assert app.no_color is (not color)


class NoticeBackend(SimulatedBackend):
    """Every snapshot carries the stack sampler's advice, as the NVML backend passes it on."""

    def sample(self) -> BoxSnapshot:
        return dataclasses.replace(super().sample(), notices=("stack sampling needs ptrace: run gpubox as root",))


async def test_a_notice_is_shown_once() -> None:
    app = TopApp(NoticeBackend(gpus=2, processes=6, clock=lambda: NOW), interval=0.05)
    notes: list[str] = []
    real_notify = app.notify
    app.notify = lambda message, **kw: (notes.append(str(message)), real_notify(message, **kw))[1]  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 4, "four refreshes")
        assert notes == ["stack sampling needs ptrace: run gpubox as root"]


@pytest.mark.parametrize(("threshold", "style"), [(0.2, "bold red"), (0.5, "yellow"), (0.9, "")])
async def test_loader_wait_is_coloured_above_the_threshold(threshold: float, style: str) -> None:
    app = TopApp(sim(2, 6), interval=0.05, loader_threshold=threshold)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        column = [c.key for c in app.table.ordered_columns].index("loader")
        styles = {k: app.table.row_style(k) for k in app.table.processes}
        starving = next(k for k, p in app.table.processes.items() if p.loader_wait and p.loader_wait > 0.5)
        assert styles[starving] is not None and styles[starving][column] == style
        for key, proc in app.table.processes.items():
            if proc.loader_wait is None or proc.loader_wait < 0.2:
                assert styles[key] is not None and styles[key][column] == ""
        cell = app.table.get_cell(starving, "loader")
        assert str(cell.style) == style


class ChangingGpusBackend(SimulatedBackend):
    """Three GPUs, of which those in `shown` are there (a GPU back after a reset, one gone, or
    a MIG change)."""

    shown = (0, 2)

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        return dataclasses.replace(
            snap,
            gpus=tuple(g for g in snap.gpus if g.index in self.shown),
            processes=tuple(p for p in snap.processes if p.gpu_index in self.shown),
        )


async def test_a_focused_panel_keeps_the_focus_when_the_set_of_gpus_changes() -> None:
    backend = ChangingGpusBackend(gpus=3, processes=6, clock=lambda: NOW)
    app = TopApp(backend, interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        await pilot.press("tab", "tab")  # from the table to the second panel: GPU 2's
        third = app.snapshot.gpus[1].uuid
        assert isinstance(app.focused, GpuPanel) and app.focused.uuid == third
        for shown in [(0, 1, 2), (1, 2)]:  # one comes before it, then another goes
            backend.shown = shown
            seen = app.refreshes
            await pilot.press("r")
            await wait_until(pilot, lambda s=seen: app.refreshes > s, "a refresh")
            await pilot.pause()
            placed = [p.uuid for p in app.grid.query(GpuPanel).results()]
            assert placed == [g.uuid for g in app.snapshot.gpus] and len(placed) == len(shown)
            assert isinstance(app.focused, GpuPanel) and app.focused.uuid == third
        await pilot.press("enter")
        assert isinstance(app.screen, GpuDetail) and app.screen.uuid == third


class UnlistedProcessesBackend(SimulatedBackend):
    """NVML will not list GPU 1's processes (no permission, as in some containers)."""

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        gpus = tuple(
            dataclasses.replace(g, reasons={**g.reasons, "processes": "no_permission"}) if g.index == 1 else g
            for g in snap.gpus
        )
        return dataclasses.replace(snap, gpus=gpus, processes=tuple(p for p in snap.processes if p.gpu_index != 1))


async def test_the_detail_of_a_gpu_says_when_its_processes_cannot_be_listed() -> None:
    app = TopApp(UnlistedProcessesBackend(gpus=2, processes=6, clock=lambda: NOW), interval=0.05)
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(pilot, app, 2)
        panels(app)["1"].focus()
        await pilot.press("d")
        screen = app.screen
        assert isinstance(screen, GpuDetail)
        body = str(screen.query_one("#detail-body").render())
        assert "processes (0; a list cannot be read: no permission)" in body
        await pilot.press("escape")
        panels(app)["0"].focus()
        await pilot.press("d")
        assert isinstance(app.screen, GpuDetail)
        assert "processes (3)\n" in str(app.screen.query_one("#detail-body").render())
