"""Modal dialogs of the live view: confirm a signal to a process, and the key help."""

from __future__ import annotations

import signal
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gpubox import format as fmt
from gpubox.telemetry.model import ProcessSnapshot
from gpubox.tui.process_table import command_text


class _Choice(Button):
    """A dialog button whose Enter chooses as it is read. Button's Enter posts Pressed, which
    reached the dialog only after the keys read with Enter had acted: "Enter, Esc" in one read
    cancelled the signal just confirmed, and the late press then stopped the app with an error
    (it closed the dialog a second time)."""

    def action_press(self) -> None:
        if isinstance(self.screen, KillDialog):
            self.screen.action_send(self.id or "cancel")


class KillDialog(ModalScreen[int | None]):
    """Dismissed with the signal to send (SIGTERM or SIGKILL), or None to leave the process be."""

    # Enter confirms the gentle choice. Focused as the dialog is built, and only if nothing is yet:
    # a focus() in on_mount is deferred, and it took the focus back from a Tab read with "k".
    AUTO_FOCUS = "#term"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n,q", "dismiss(None)", "Cancel"),  # q, the quit key, safely: it cancels
        Binding("t", "send('term')", "SIGTERM"),
        Binding("x", "send('kill')", "SIGKILL"),
    ]

    def __init__(self, proc: ProcessSnapshot, gpu_label: str) -> None:
        super().__init__()
        self.proc = proc
        self.gpu_label = gpu_label

    def compose(self) -> ComposeResult:
        p = self.proc
        with Vertical(id="kill-box", classes="dialog"):
            yield Static(Text(f"Signal process {p.pid} ({p.user or fmt.DASH}) on GPU {self.gpu_label}?", style="bold"))
            yield Static(Text(command_text(p), overflow="ellipsis"), classes="dialog-command")
            yield Static(Text("SIGTERM asks it to stop; SIGKILL ends it at once.", style="dim"))
            with Horizontal(classes="dialog-buttons"):
                yield _Choice("SIGTERM (t)", id="term", variant="warning")
                yield _Choice("SIGKILL (x)", id="kill", variant="error")
                yield _Choice("Cancel (Esc)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_send(event.button.id or "cancel")

    def action_send(self, which: str) -> None:
        choice = {"term": int(signal.SIGTERM), "kill": int(signal.SIGKILL)}.get(which)
        self.dismiss(choice)


HELP = """\
[b]Keys[/b]
  q            quit (in this help or the kill dialog: close it)
  space, p     pause or resume sampling
  r            sample now
  s / S        sort by the next column / reverse the order (or click a header)
  /            filter processes; Enter keeps the filter, Esc clears it
  Enter, d     detail of the process or GPU under the cursor, with longer history
  k            signal the process under the cursor (asks first)
  + / -        refresh faster / slower (0.25 s to 10 s)
  Tab          move between the GPU panels and the process table
  Esc          close a dialog, the detail view or the filter
  ?            this help

[b]Filter[/b]
  user:alice   only alice's processes
  gpu:1        only GPU 1 (and its MIG instances); gpu:0/3 one MIG instance
  word         the command contains word (any case); terms combine with AND

[b]Figures[/b]
  busy         share of time any kernel ran: every GPU has it, and it is not occupancy
  SM act       share of SMs with at least one warp resident (GPM: Hopper and newer)
  occupancy    resident warps over the maximum (GPM); "n/a: no GPM" where the GPU lacks it
  RX / TX      bytes per second into / out of the GPU over PCIe
  PCIe GenN xW current link / best link; yellow when it runs below its best while the GPU
               is busy (an idle GPU slows its link on purpose)
  loader wait  share of time a process waited for its next batch, over the last seconds:
               exact from the gpubox probe, "~" when estimated from stack samples, "–" when
               not measured; yellow above the threshold (top.loader_wait_threshold), red above
               twice it
"""


class HelpScreen(ModalScreen[None]):
    # q closes it too, as in htop: a dialog holds back the app's own q
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        # focusable, so the arrows and page keys scroll it: at 80x24 half of it is below the fold
        with VerticalScroll(id="help-box", classes="dialog"):
            yield Static(HELP, markup=True)
