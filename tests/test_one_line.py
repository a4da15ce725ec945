"""Text from users (names, commands, paths) as gpubox prints it: one line, no terminal control."""

from __future__ import annotations

import pytest

from gpubox.format import one_line


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text", "plain text"),
        ("naïve 日本 ü", "naïve 日本 ü"),
        ("two\nlines", "two\\nlines"),
        ("tab\there", "tab\\there"),
        ("back\rover", "back\\rover"),
        ("clear\x1b[2J", "clear\\x1b[2J"),
        ("del\x7f", "del\\x7f"),
        ("c1\x9b", "c1\\x9b"),
        ("byte n\udce9", "byte n\\xe9"),  # a non-UTF-8 byte, as surrogateescape holds it
        ("lone \ud800", "lone \\ud800"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
    ],
)
def test_one_line(text: str, shown: str) -> None:
    assert one_line(text) == shown
    assert one_line(text).isprintable()
