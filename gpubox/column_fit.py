"""Which columns of a table fit a width, as htop and nvitop do it: the least needed columns give
way first, so that no figure is ever cut and nothing needs a sideways scroll."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The process table's columns (keys) that give way on a narrow terminal, the least needed first,
# in the live view and in `top --once` alike: PID, SM %, GPU memory, loader wait and the command stay.
PROCESS_DROP_ORDER = ("uptime", "rss", "job", "cpu", "user", "gpu")


def fit_columns(widths: Mapping[str, int], drop_order: Iterable[str], room: int, gap: int = 0) -> list[str]:
    """The keys of `widths`, in their order, that fit in `room` cells with `gap` cells between two
    columns: those named in `drop_order` leave, first to last, until the rest fit. The others
    always stay, even where they do not fit."""
    kept = dict(widths)

    def total() -> int:
        return sum(kept.values()) + gap * max(0, len(kept) - 1)

    for key in drop_order:
        if total() <= room:
            break
        kept.pop(key, None)
    return list(kept)
