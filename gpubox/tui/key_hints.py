"""The footer's key hints, fewer on a narrow terminal: the least needed leave first, so that
"? Help" (where every key is listed) and "q Quit" are always seen, never cut at the edge."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.events import Resize
from textual.widget import Widget
from textual.widgets import Footer

from gpubox.column_fit import fit_columns

# By action, the least needed first; the help lists them all.
DROP_ORDER = ("slower", "faster", "sort_reverse", "pause", "sort_next", "detail", "filter", "kill")


def hint_width(hint: Widget) -> int:
    """As Textual's FooterKey draws itself, not compact: " k Kill "."""
    return cell_len(getattr(hint, "key_display", "")) + cell_len(getattr(hint, "description", "")) + 3


class KeyHints(Footer):
    def __init__(self) -> None:
        super().__init__()
        self._width = 0  # the width the hints were chosen for

    def compose(self) -> ComposeResult:
        hints = list(super().compose())  # one FooterKey a binding: gpubox's bindings have no groups
        self._width = self.app.size.width
        widths = {str(n): hint_width(h) for n, h in enumerate(hints)}
        order = [str(n) for action in DROP_ORDER for n, h in enumerate(hints) if getattr(h, "action", "") == action]
        yield from (hints[int(n)] for n in fit_columns(widths, order, self._width))

    def on_resize(self, event: Resize) -> None:
        if self.app.size.width != self._width and self._bindings_ready:
            self.call_after_refresh(self.recompose)
