"""The lines above and below the panels: the host and the sampling pace, and the status line."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpubox import format as fmt
from gpubox.telemetry.model import BoxSnapshot


def host_text(snap: BoxSnapshot | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    text.append("gpubox top", "bold")
    if snap is None:
        text.append("  waiting for the first sample…", "dim")
        return text
    h = snap.host
    text.append(f"  {h.hostname}", "bold")
    text.append(f"  driver {h.driver_version or fmt.DASH}  CUDA {h.cuda_driver_version or fmt.DASH}", "dim")
    cores = f" of {h.cpu_count}" if h.cpu_count else ""
    load = fmt.DASH if h.load_1m is None else f"{h.load_1m:.2f}"
    text.append(f"  CPU {fmt.pct(h.cpu_percent)}{cores}  load {load}")
    text.append(f"  RAM {fmt.size(h.mem_used_bytes)}/{fmt.size(h.mem_total_bytes)}")
    if snap.backend == "simulated":
        text.append("  simulated", "bold yellow")
    return text


def pace_text(interval: float, paused: bool, stale_for: float | None) -> Text:
    """How the figures are kept fresh: the interval, paused, or stale when the sampler hangs."""
    text = Text(no_wrap=True, end="")
    text.append(f"every {interval:g} s")
    if paused:
        text.append("  PAUSED", "bold yellow")
    if stale_for is not None:
        text.append(f"  stale for {stale_for:.0f} s", "bold red")
    return text


def status_text(
    shown: int, total: int, filter_text: str, sort_label: str, message: str | None, errors: tuple[str, ...]
) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    text.append(f"{total} process{'es' if total != 1 else ''}")
    if filter_text:
        text.append(f"  filter: {filter_text} ({shown} shown)", "bold")
    text.append(f"  sort: {sort_label}", "dim")
    if message:
        text.append(f"  {message}", "bold red")
    for err in errors[:1]:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        text.append(f"  {err}{more}", "red")
    return text


class Line(Static):
    """A one-line Static that repaints only when its text changes. Only a line whose width follows
    its text (`fits_text`) asks for a new layout, and only when its length changes: a layout
    repaints every widget on the screen, the process table too."""

    def __init__(self, id: str, fits_text: bool = False) -> None:
        super().__init__(id=id)
        self._fits_text = fits_text
        self._shown = Text()

    def show(self, text: Text) -> None:
        if text != self._shown:
            resized = self._fits_text and text.cell_len != self._shown.cell_len
            self._shown = text
            self.update(text, layout=resized)

    @property
    def plain(self) -> str:
        return self._shown.plain
