"""`gpubox top`, live: GPU panels over a process table, sampled off the UI thread."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import ClassVar
from weakref import WeakKeyDictionary

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import DataTable, Input

from gpubox.exit_codes import ExitCode
from gpubox.telemetry.backend import TelemetryBackend
from gpubox.telemetry.model import BoxSnapshot, ProcessSnapshot
from gpubox.telemetry.sources import parse_gpu_selection
from gpubox.tui.daemon_threads import DaemonThreadExecutor
from gpubox.tui.detail import DetailScreen, GpuDetail, ProcessDetail
from gpubox.tui.dialogs import HelpScreen, KillDialog
from gpubox.tui.filter_box import FilterBox
from gpubox.tui.gpu_panel import GpuGrid, GpuPanel
from gpubox.tui.history import BoxHistory
from gpubox.tui.key_hints import KeyHints
from gpubox.tui.poller import STALE_AFTER, Poller, SampleLanded, SignalSent, faster, slower
from gpubox.tui.process_filter import ProcessFilter
from gpubox.tui.process_table import DEFAULT_LOADER_THRESHOLD, ProcessTable
from gpubox.tui.status_bar import Line, host_text, pace_text, status_text

PACE_TICK = 0.5  # seconds between checks of the sampler's pace: cheap, and enough for "stale for N s"
# Actions that act on the main screen's table or panels, so not while a dialog or detail is up.
_MAIN_ONLY = frozenset({"sort_next", "sort_reverse", "filter", "detail"})
_TYPED = frozenset({"filter", "faster", "slower"})  # keys that type a character in the filter box


class TopApp(App[int]):
    CSS_PATH = "top.tcss"
    TITLE = "gpubox top"
    ENABLE_COMMAND_PALETTE = False  # every action has a key, listed in the footer and under ?
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("space,p", "pause", "Pause", key_display="p"),
        Binding("s", "sort_next", "Sort"),
        Binding("S", "sort_reverse", "Reverse"),
        # priority: handled as it is read, so the keys typed right after it go to the box (a plain
        # binding acts only once the key has passed the table, and the table gets what follows)
        Binding("slash", "filter", "Filter", key_display="/", priority=True),
        Binding("enter,d", "detail", "Detail", key_display="⏎"),
        Binding("k", "kill", "Kill"),
        Binding("plus,equals_sign", "faster", "Faster", key_display="+"),
        Binding("minus", "slower", "Slower", key_display="-"),
        Binding("r", "sample_now", "Sample now", show=False),
        Binding("escape", "escape", "Close", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(
        self,
        backend: TelemetryBackend,
        interval: float = 1.0,
        gpu_filter: str | None = None,
        color: bool = True,
        stale_after: float = STALE_AFTER,
        loader_threshold: float = DEFAULT_LOADER_THRESHOLD,
    ) -> None:
        # Textual reads NO_COLOR once, here; the config has already weighed it against GPUBOX_COLOR.
        if color:
            os.environ.pop("NO_COLOR", None)
        else:
            os.environ["NO_COLOR"] = "1"
        super().__init__()
        self.backend = backend
        self.gpu_filter = gpu_filter
        self.poller = Poller(self, backend, interval, stale_after=stale_after)
        self.history = BoxHistory()
        self.snapshot: BoxSnapshot | None = None
        self.refreshes = 0  # snapshots applied to the view
        self.sample_error: str | None = None
        self.usage_error: str | None = None
        self._selection: frozenset[str] | None = None
        self._noticed: set[str] = set()  # notices already shown: each is said once
        self._read_under: WeakKeyDictionary[events.Key, tuple[Screen[object], Widget | None]] = WeakKeyDictionary()

        # The main screen's widgets, kept: a sample may land while a dialog or detail is on top.
        self.grid = GpuGrid(id="gpus")
        self.table = ProcessTable(id="procs", loader_threshold=loader_threshold)
        self._host = Line(id="host")
        self._pace = Line(id="pace", fits_text=True)
        self._status = Line(id="status")
        self._filter = FilterBox(self._leave_filter, placeholder="filter: user:alice gpu:1 words…", id="filter")

    def compose(self) -> ComposeResult:
        with Horizontal(id="topbar"):
            yield self._host
            yield self._pace
        yield self.grid
        yield self.table
        yield self._filter
        yield self._status
        yield KeyHints()

    def on_mount(self) -> None:
        # A sample stuck in the driver must not keep the process alive after q.
        asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())
        self._host.show(host_text(None))
        self._show_pace()
        self._show_status()
        self.table.focus()
        self.set_interval(PACE_TICK, self._show_pace, name="pace")
        self.poller.poll_now()

    # keys

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded and self.screen_stack:
            # Textual sends it to this screen's focused widget
            self._read_under[event] = (self.screen, self.focused)
        await super().on_event(event)

    async def _on_key(self, event: events.Key) -> None:
        """A key comes back here, up from the widget it was sent to, for the bindings. Keys read
        with one that closed a screen (Esc, n, t) were sent to that screen, and came back to the
        main one as bare keys: "/" was lost, and "/user:kate" sorted on s, opened the kill dialog
        on k and sent SIGTERM on its t. Such a key is handled as if read now, in the order typed."""
        if not self.screen_stack:
            return  # the app is closing: a key read as it closed has nowhere to go
        screen, focused = self._read_under.pop(event, (self.screen, self.focused))
        if screen is not self.screen:
            self.post_message(events.Key(event.key, event.character))
            event.prevent_default()  # App._on_key must not run its bindings as well
        elif isinstance(self.focused, Input) and not isinstance(focused, Input):
            # Read before a "/" in the same read moved the focus into the filter box: Textual would
            # now take it for the box's text and drop it ("s/" lost the s). It acts as typed.
            event.prevent_default()
            action = _MAIN_KEYS.get(event.key)
            if action is not None:
                await self.run_action(action)

    # sampling

    def on_sample_landed(self, message: SampleLanded) -> None:
        if not self.screen_stack:
            return  # the app is closing: a last sample has nowhere to go
        self.poller.landed()
        if message.snapshot is None:
            err = message.error
            self.sample_error = f"sampling failed: {type(err).__name__}: {err}"
            self._show_status()
        else:
            self.apply(message.snapshot)
        self._show_pace()

    def apply(self, snap: BoxSnapshot) -> None:
        if self.gpu_filter is not None and self._selection is None:
            try:
                self._selection = parse_gpu_selection(self.gpu_filter, snap.gpus)
            except ValueError as exc:
                self.usage_error = str(exc)
                self.poller.pause()
                self.exit(return_code=int(ExitCode.USAGE))
                return
        if self._selection is not None:
            snap = snap.only_gpus(self._selection)
        self.sample_error = None
        self.snapshot = snap
        self.history.record(snap)
        with self.batch_update():
            self.grid.show(snap, self.history)
            self.table.show(snap)
            self._host.show(host_text(snap))
            self._show_status()
            if isinstance(self.screen, DetailScreen):
                self.screen.follow(snap, self.history)
        for notice in snap.notices:
            if notice not in self._noticed:
                self._noticed.add(notice)
                # markup=False: the text is gpubox's or the system's (a path), never markup
                self.notify(notice, title="loader wait", severity="warning", timeout=15, markup=False)
        self.refreshes += 1

    def _show_pace(self) -> None:
        poller = self.poller
        self._pace.show(pace_text(poller.interval, poller.paused, poller.stale_for()))

    def _show_status(self) -> None:
        table = self.table
        errors = self.snapshot.errors if self.snapshot else ()
        line = status_text(
            table.row_count, table.total, table.filter.text, table.sort_label(), self.sample_error, errors
        )
        self._status.show(line)

    # actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        screen = self.screen
        if action in _TYPED and isinstance(self.focused, Input):
            # typed in the box, these keys are part of the filter ("/" of a path, "-" of an
            # option): neither run nor shown in the footer then
            return False
        if isinstance(screen, ModalScreen):
            # Tab moves between the dialog's buttons: it is the screen's binding, run here
            return action in {"quit", "escape", "focus_next", "focus_previous"}
        if isinstance(screen, DetailScreen):
            # a detail view hides the table; k there means its own process, and only that
            return action not in _MAIN_ONLY and (action != "kill" or isinstance(screen, ProcessDetail))
        return True

    def action_pause(self) -> None:
        if self.poller.paused:
            self.poller.resume()
        else:
            self.poller.pause()
        self._show_pace()

    def action_sample_now(self) -> None:
        self.poller.poll_now()

    def action_faster(self) -> None:
        self.poller.set_interval(faster(self.poller.interval))
        self._show_pace()

    def action_slower(self) -> None:
        self.poller.set_interval(slower(self.poller.interval))
        self._show_pace()

    def action_sort_next(self) -> None:
        self.table.next_sort_column()
        self._show_status()

    def action_sort_reverse(self) -> None:
        self.table.reverse_sort()
        self._show_status()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self._show_status()  # the table has already re-sorted itself

    def action_filter(self) -> None:
        box = self._filter
        box.add_class("shown")
        _focus_now(box)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.table.set_filter(ProcessFilter.parse(event.value))
            self._show_status()

    def _leave_filter(self, clear: bool) -> None:
        """Enter keeps the filter (an empty one closes the box), Escape clears and closes it."""
        box = self._filter
        if clear:
            box.value = ""  # Input.Changed clears the table's filter
        if not box.value.strip():
            box.remove_class("shown")
        _focus_now(self.table)

    def action_escape(self) -> None:
        if self._filter.has_class("shown"):
            self._leave_filter(clear=True)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_detail(self) -> None:
        if isinstance(self.focused, GpuPanel):
            self._open_gpu(self.focused.uuid)
        else:
            self._open_process(self.table.process_at_cursor())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._open_process(self.table.process_at_cursor())

    def on_gpu_panel_selected(self, event: GpuPanel.Selected) -> None:
        self._open_gpu(event.uuid)

    def _open_gpu(self, uuid: str) -> None:
        self._open(GpuDetail(uuid))

    def _open_process(self, proc: ProcessSnapshot | None) -> None:
        if proc is not None:
            self._open(ProcessDetail(proc.key, self._gpu_label(proc)))

    def _open(self, screen: DetailScreen) -> None:
        if self.snapshot is not None and not isinstance(self.screen, DetailScreen):
            screen.follow(self.snapshot, self.history)
            self.push_screen(screen)

    def _gpu_label(self, proc: ProcessSnapshot) -> str:
        gpus = self.snapshot.gpus if self.snapshot else ()
        return next((g.label for g in gpus if g.uuid == proc.gpu_uuid), str(proc.gpu_index))

    def action_kill(self) -> None:
        screen = self.screen
        proc = screen.proc if isinstance(screen, ProcessDetail) else self.table.process_at_cursor()
        if proc is None:
            self.notify("no process selected", severity="warning")
            return

        def chosen(sig: int | None) -> None:
            if sig is not None:
                self.poller.send_signal(proc.pid, sig, proc.start_time)

        self.push_screen(KillDialog(proc, self._gpu_label(proc)), chosen)

    def on_signal_sent(self, message: SignalSent) -> None:
        if not self.screen_stack:
            return
        name = _signal_name(message.sig)
        if message.error is not None:
            error = f"could not send {name} to {message.pid}: {message.error}"
            self.notify(error, severity="error", markup=False)
            return
        self.notify(f"sent {name} to {message.pid}")
        if not self.poller.paused:
            self.poller.poll_now()  # show it leave without waiting a whole interval


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# The app's keys, but "/" (which acts as it is read), by key: for keys read before a "/".
_MAIN_KEYS = {
    key.strip(): binding.action
    for binding in TopApp.BINDINGS
    if isinstance(binding, Binding) and binding.action != "filter"
    for key in binding.key.split(",")
}


def _focus_now(widget: Widget) -> None:
    """Move the focus before the next key is handled. Widget.focus() defers the move, so keys
    already read (typed fast, or over a slow link) went to the old widget: "/bob" sorted the
    table instead of filtering it."""
    widget.screen.set_focus(widget)


def run_live(
    backend: TelemetryBackend,
    interval: float,
    gpu_filter: str | None = None,
    color: bool = True,
    loader_threshold: float = DEFAULT_LOADER_THRESHOLD,
) -> int:
    """Run the live view until q; the exit code, with a bad --gpu reported as a usage error.
    The backend is closed here, once no sample is running."""
    app = TopApp(backend, interval=interval, gpu_filter=gpu_filter, color=color, loader_threshold=loader_threshold)
    try:
        app.run()
    finally:
        app.poller.close_backend()
    if app.usage_error is not None:
        sys.stderr.write(f"gpubox: {app.usage_error}\n")
        return int(ExitCode.USAGE)
    return app.return_code or 0
