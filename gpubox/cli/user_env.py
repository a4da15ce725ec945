"""The environment as the user gave it, for what gpubox runs on their behalf.

COLUMNS or LINES that is not a number of ASCII digits is taken out of gpubox's own environment
at start (`drop_odd_sizes`): Rich reads them with str.isdigit() and int(), and a superscript 2
passes the one and fails the other, with a traceback. The value is still the user's: a command
that `gpubox run` starts, or a job `gpubox queue add` queues, gets it back (`user_environment`).
"""

from __future__ import annotations

import os

_dropped: dict[str, str] = {}


def drop_odd_sizes() -> None:
    from gpubox.digits import ascii_int

    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and ascii_int(value) is None:
            _dropped[name] = os.environ.pop(name)


def user_environment() -> dict[str, str]:
    """This process's environment, with what `drop_odd_sizes` took out of it put back."""
    return {**os.environ, **_dropped}
