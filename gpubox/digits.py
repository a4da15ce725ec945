"""Whole numbers as people type them and CUDA reads them: ASCII digits alone.

str.isdigit() and int() also take other scripts' digits (an Arabic-Indic 1 is int() 1), a
superscript 2 passes isdigit() and fails int(), and int() takes "1_0" and " 1": none of those is
a GPU index CUDA reads or a count anyone meant.
"""

from __future__ import annotations


def ascii_int(text: str) -> int | None:
    """The number `text` writes in ASCII digits and nothing else; None for anything else."""
    return int(text) if text.isascii() and text.isdigit() else None
