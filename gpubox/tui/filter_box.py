"""The live view's filter line: an Input that edits in the order the keys were typed."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import Input


def _edit_actions() -> dict[str, str]:
    """Input's own key bindings (backspace, ctrl+u, arrows...), by key, without submit."""
    actions: dict[str, str] = {}
    for binding in Input.BINDINGS:
        if isinstance(binding, Binding) and binding.action != "submit":
            for key in binding.key.split(","):
                actions[key.strip()] = binding.action
    return actions


_EDITS = _edit_actions()


class FilterBox(Input):
    """Textual runs a widget's key bindings only once the key has bubbled up to the app, after
    the letters read with it were typed: "ab", backspace, "c" read in one go (a fast typist, a
    slow link, a busy redraw) gave "ab", and the letters after Enter went into the box. Here
    every editing key acts as it comes, Enter and Escape hand the focus back at once, and keys
    that reach the box after that go back to the app."""

    # What the footer shows while the box has the focus: Enter and Escape act in _on_key, as
    # they come; these run only if a key ever reaches the bindings.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "keep", "Apply", key_display="⏎"),
        Binding("escape", "clear", "Clear", key_display="esc"),
    ]

    def __init__(self, done: Callable[[bool], None], placeholder: str, id: str) -> None:
        super().__init__(placeholder=placeholder, id=id)
        self._done = done  # called with True to clear the filter (Escape), False to keep it

    async def _on_key(self, event: events.Key) -> None:
        if self.screen.focused is not self:  # has_focus lags: it waits for the Blur message
            # read with Enter or Escape, so sent here before the focus went back: the app sends
            # it on to the table, in the order typed
            self.app.post_message(events.Key(event.key, event.character))
        elif event.key in ("enter", "escape"):
            self._done(event.key == "escape")
        elif event.key in _EDITS:
            await self.run_action(_EDITS[event.key])
        else:
            return  # a letter: Input's own handler types it
        event.stop()
        event.prevent_default()  # Input's handler, and the bindings, must not act again

    def action_keep(self) -> None:
        self._done(False)

    def action_clear(self) -> None:
        self._done(True)
